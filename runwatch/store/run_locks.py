"""Which replica owns a run's live detection: a session-level PostgreSQL advisory lock per run.

Why a session lock and not a lease row with a heartbeat: the lock lives exactly as long as
the owner's connection. A replica that is SIGKILLed, or cut off, loses its connection and
the database lets go of its locks at once, so another replica can take the run over at its
next poll; a live owner holds it without writing anything. Each replica holds its locks on
one connection of its own, outside the pool. :func:`run_owner` says who owns a run.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from runwatch.store.errors import StoreUnavailableError

log = logging.getLogger("runwatch.store")

OWNER_LOCK_CLASS = 0x72776F77  # "rwow": the first key of every run-ownership lock
OWNER_APPLICATION = "runwatch-owner-"
"""The lock session's ``application_name``, then the process id: ``pg_locks`` joined with
``pg_stat_activity`` says which replica owns which run."""
CONNECT_TIMEOUT_S = 5


class RunLocks:
    """This process's ownership locks on the runs of one PostgreSQL database."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._lock = threading.Lock()
        try:
            self._conn: Any = psycopg.connect(
                url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name=f"{OWNER_APPLICATION}{os.getpid()}",
            )
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot connect for run ownership: {exc}") from None

    def try_own(self, run_id: int) -> bool:
        """Take the run if no other session holds it (True also if this one does)."""
        return self._ask("SELECT pg_try_advisory_lock(%s, %s)", run_id)

    def release(self, run_id: int) -> None:
        """Let the run go (its detection finished here)."""
        self._ask("SELECT pg_advisory_unlock(%s, %s)", run_id)

    def _ask(self, sql: str, run_id: int) -> bool:
        import psycopg

        with self._lock:
            try:
                row = self._conn.execute(sql, (OWNER_LOCK_CLASS, int(run_id))).fetchone()
            except psycopg.Error as exc:
                # The session is gone, and every lock it held with it.
                raise StoreUnavailableError(f"run ownership session lost: {exc}") from None
        return bool(row[0])

    def close(self) -> None:
        """End the session: every run it owned is free for the other replicas."""
        with self._lock:
            self._conn.close()


def run_owner(url: str, run_id: int) -> int | None:
    """The process id of the replica owning ``run_id``'s live detection, or None."""
    import psycopg

    with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s AND l.granted",
            (OWNER_LOCK_CLASS, int(run_id)),
        ).fetchone()
    return int(row[0].removeprefix(OWNER_APPLICATION)) if row else None


def claim_live_detection(
    store_path: str, run_id: int, wait: float = 0.0
) -> tuple[bool, RunLocks | None]:
    """Whether this process may run the run's live detection, and the lock it holds for it.

    On a shared PostgreSQL store it holds the run's ownership lock, as a ``runwatch serve``
    replica would (``runwatch.store.run_locks``): a replica on the same database then leaves
    the run alone, and takes it over if this process dies. False: another process owns it.
    ``wait``: seconds to keep trying, for a lock whose holder just died (its session may
    outlive it briefly).
    """
    import time

    from runwatch.store import is_store_url

    if not is_store_url(store_path):
        return True, None
    locks = RunLocks(store_path)
    deadline = time.monotonic() + wait
    while True:
        if locks.try_own(run_id):
            return True, locks
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    locks.close()
    log.info("runwatch: another process runs this run's live detection; not here")
    return False, None
