"""Many openers of a brand-new store at once: all get a migrated store, none 'locked'."""

from __future__ import annotations

import threading

from runwatch.store import open_store
from runwatch.store.schema import SCHEMA_VERSION


def test_concurrent_first_opens_all_succeed(db_path):
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def open_it() -> None:
        barrier.wait()
        try:
            with open_store(str(db_path)) as store:
                store.start_run("shared", resume=True)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with open_store(str(db_path)) as store:
        assert store.attempts("shared")["attempt"].max() == 8
        version = store._conn.execute("PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION
