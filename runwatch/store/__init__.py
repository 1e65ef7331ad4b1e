"""The store: every run's points, events, anomalies, verdicts and alerts, in one SQLite file.

>>> import tempfile, os, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "doc.db")
>>> with open_store(path) as store:
...     run_id, attempt = store.start_run("demo")
...     sid = store.series_id(run_id, "loss")
...     store.write(run_id, attempt, {sid: (np.arange(3), np.zeros(3), np.array([3.0, 2.0, 1.0]))})
...     store.read_series("demo", "loss")["value"].tolist()
[3.0, 2.0, 1.0]
"""

from runwatch.store.errors import RunExistsError, RunNotFoundError, StoreError
from runwatch.store.sqlite import DEFAULT_STORE, Store, labels_key


def open_store(path: str = DEFAULT_STORE, *, readonly: bool = False) -> Store:
    """Open (creating and migrating if needed) the store at ``path``."""
    return Store(path, readonly=readonly)


__all__ = [
    "DEFAULT_STORE",
    "RunExistsError",
    "RunNotFoundError",
    "Store",
    "StoreError",
    "labels_key",
    "open_store",
]
