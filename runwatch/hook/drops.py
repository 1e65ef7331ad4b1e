"""Counting what the hook refused or lost, by reason, and warning about it once.

Nothing is dropped silently (sentry-python's habit): every refused call or point is counted
under a reason, the counts are in ``run.stats()`` and in the store, and the first drop of each
kind (per metric name, for bad values) is logged with what was wrong.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("runwatch.hook")

DROP_REASONS: dict[str, str] = {
    "queue_full": "the writer fell behind and the log queue was full",
    "other_rank": "a run-level metric logged on a rank other than 0 (keep it with "
    "per_rank=[...] or all_ranks=True)",
    "worker_dead": "the writer was not running (interpreter shutting down?), or runwatch's "
    "process beside this one ended before storing them",
    "finished": "the run was already finished",
    "forked_child": "logged from a forked child process (call runwatch.init() there)",
    "not_a_dict": "run.log() was given something that is not a dict",
    "bad_step": "the step was not a non-negative integer",
    "bad_name": "the metric name was empty, too long or had control characters",
    "bad_value": "the value was not a number",
    "bad_context": "a step context was not a dict, or a key or value of it was refused",
    "store_error": "the store refused the write after retries (locked, read-only, full?)",
    "store_gone": "the store file was deleted while the run was writing",
    "spill_full": "the server was unreachable longer than the spill file could hold",
    "rejected": "the server refused a batch as malformed (the log names the field)",
    "server_down": "the server could not be reached to start the run",
    "replay_rejected": "a spilled batch was refused by the server on replay",
}


class DropCounter:
    """Counts by reason; ``warn_once`` logs the first occurrence of each key."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._remote: dict[str, int] = {}  # counted by the writer in another process
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + n

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """Log ``message`` at WARNING the first time ``key`` is seen."""
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message, *args)

    def set_remote(self, counts: dict[str, int]) -> None:
        """The counts of the run's writer in live detection's process, as it last said."""
        with self._lock:
            self._remote = dict(counts)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            merged = dict(self._counts)
            for reason, n in self._remote.items():
                merged[reason] = merged.get(reason, 0) + n
            return merged

    def total(self) -> int:
        return sum(self.snapshot().values())
