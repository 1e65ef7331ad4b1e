"""Where the writer thread sends a run's batches: the embedded store, or a server.

The writer knows nothing of SQLite or HTTP: it hands each batch to a :class:`Backend`. The
embedded default is :class:`StoreBackend` (one SQLite file); ``runwatch.init(url=...)`` uses
the HTTP transport in ``runwatch.hook.transport``, which speaks to ``runwatch serve``. A
backend raises :class:`BackendError` for a failure worth retrying (locked store, server
down); the writer retries with backoff, then counts the batch as dropped under ``reason``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from runwatch.model import Event, SeriesBatch
from runwatch.store import Store, StoreError, is_store_url, store_label
from runwatch.store.context import StepContext


class BackendError(RuntimeError):
    """A write failed; ``reason`` is the drop reason if retries do not help."""

    def __init__(self, message: str, reason: str = "store_error", retry: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry = retry


class ReferenceRefused(ValueError):
    """The server cannot run reference mode for this run (an unknown reference, one with
    no loss curve of the run, or no live detection there); ``init`` raises it."""


class Backend(Protocol):
    """What the writer needs from a destination. Methods are called from the writer thread
    only, except ``start_run`` (from ``init``) and ``finish`` (after the writer stopped)."""

    location: str
    """Where the data goes, for messages (a file path or a server URL, never a token)."""

    def start_run(
        self,
        name: str,
        project: str | None,
        config: Mapping[str, Any],
        resume: bool | None,
        reference: str | None = None,
        family: list[str] | None = None,
    ) -> tuple[int, int]:
        """Create or resume the run; return (run_id, attempt). May raise (init reports it).

        ``reference``, ``family``: reference or family mode for a destination that runs its
        own detection (a server); :class:`ReferenceRefused` when it cannot.
        """
        ...

    def write(
        self,
        attempt: int,
        batch: SeriesBatch,
        events: list[Event],
        contexts: Sequence[StepContext] = (),
    ) -> None:
        """Store one batch atomically, or raise :class:`BackendError`. The writer passes
        ``contexts`` (step context changes) only when there are some."""
        ...

    def begin_attempt(self, step: int, message: str) -> int:
        """The step went back (a restart): record it, return the new attempt number."""
        ...

    def finish(
        self, attempt: int | None, last_step: int | None, status: str, drops: Mapping[str, int]
    ) -> None:
        """Record the end of the run (status, drop counts) and release resources."""
        ...


class StoreBackend:
    """The embedded default: write straight into a SQLite store file (or a PostgreSQL
    database given by URL, whose password no message shows)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 1.0) -> None:
        self.location = os.fspath(path)
        self.label = store_label(self.location)
        self.store = Store(self.location, busy_timeout_s=busy_timeout_s)
        self.run_id: int | None = None

    def start_run(
        self,
        name: str,
        project: str | None,
        config: Mapping[str, Any],
        resume: bool | None,
        reference: str | None = None,
        family: list[str] | None = None,
    ) -> tuple[int, int]:
        # ``reference`` and ``family`` are not the store's business here: the Run's own
        # live detection reads their curves from the same file.
        self.run_id, attempt = self.store.start_run(
            name, project=project, config=config, resume=resume
        )
        return self.run_id, attempt

    def write(
        self,
        attempt: int,
        batch: SeriesBatch,
        events: list[Event],
        contexts: Sequence[StepContext] = (),
    ) -> None:
        # SQLite would write on happily into a deleted file, and the points would vanish.
        if not is_store_url(self.location) and not os.path.exists(self.location):
            raise BackendError(
                f"the store {self.label} was deleted while the run was writing",
                reason="store_gone",
                retry=False,
            )
        assert self.run_id is not None
        try:
            by_id = {
                self.store.series_id(self.run_id, s.metric, s.labels): (s.steps, s.times, s.values)
                for s in batch
            }
            with self.store.transaction():
                self.store.write(self.run_id, attempt, by_id, events)
                self.store.add_context(self.run_id, attempt, contexts)
        except (sqlite3.Error, StoreError) as exc:
            raise BackendError(f"{self.label}: {exc}") from exc

    def begin_attempt(self, step: int, message: str) -> int:
        assert self.run_id is not None
        try:
            return self.store.begin_attempt(self.run_id, step, "restart", message=message)
        except (sqlite3.Error, StoreError) as exc:
            raise BackendError(f"{self.label}: {exc}") from exc

    def finish(
        self, attempt: int | None, last_step: int | None, status: str, drops: Mapping[str, int]
    ) -> None:
        assert self.run_id is not None
        try:
            self.store.seal_open_blocks(self.run_id)
            self.store.add_events(
                self.run_id, attempt, [Event("finish", last_step, time.time(), status)]
            )
            self.store.record_drops(self.run_id, dict(drops))
            self.store.set_run_status(self.run_id, status)
        finally:
            self.store.close()
