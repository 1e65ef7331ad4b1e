"""The store: every run's points, events, anomalies, verdicts and alerts, in one SQLite file
or, for a team, one PostgreSQL database (``postgresql://user@host/db``; store/postgres.py).

>>> import tempfile, os, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "doc.db")
>>> with open_store(path) as store:
...     run_id, attempt = store.start_run("demo")
...     sid = store.series_id(run_id, "loss")
...     store.write(run_id, attempt, {sid: (np.arange(3), np.zeros(3), np.array([3.0, 2.0, 1.0]))})
...     store.read_series("demo", "loss")["value"].tolist()
[3.0, 2.0, 1.0]
"""

import os

from runwatch.store.errors import RunExistsError, RunNotFoundError, StoreError
from runwatch.store.sqlite import DEFAULT_STORE, PG_URL_PREFIXES, Store, labels_key

STORE_HELP = (
    "the store: an SQLite file, or postgresql://user@host/db "
    f"(default: $RUNWATCH_STORE, else {DEFAULT_STORE} here)"
)


def open_store(path: str = DEFAULT_STORE, *, readonly: bool = False) -> Store:
    """Open (creating and migrating if needed) the store at ``path``: a file or a URL."""
    return Store(path, readonly=readonly)


def default_store() -> str:
    """The store a command uses without ``--db``: ``$RUNWATCH_STORE``, else runwatch.db."""
    return os.environ.get("RUNWATCH_STORE") or DEFAULT_STORE


def is_store_url(path: object) -> bool:
    """Whether ``path`` names a database server (PostgreSQL) rather than a file."""
    return isinstance(path, str) and path.startswith(PG_URL_PREFIXES)


def store_label(path: object) -> str:
    """``path`` as it may be shown or logged: a URL's password replaced by ``***``.

    >>> store_label("postgresql://me:pw@db/rw"), store_label("runwatch.db")
    ('postgresql://me:***@db/rw', 'runwatch.db')
    """
    if is_store_url(path):
        from runwatch.store.postgres import redact_url

        return redact_url(str(path))
    return str(path)


__all__ = [
    "DEFAULT_STORE",
    "RunExistsError",
    "RunNotFoundError",
    "Store",
    "StoreError",
    "default_store",
    "is_store_url",
    "labels_key",
    "open_store",
    "store_label",
]
