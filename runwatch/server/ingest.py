"""The server's single writer: validated batches in, few large transactions out.

Why one thread and one connection: SQLite takes one writer at a time, and a transaction costs
a WAL append and a lock whatever its size, so 256 ranks each committing 4 small batches a
second would spend the server on commits. Request handlers only validate and enqueue; this
thread takes everything queued (up to ``max_group_points``) and stores it in ONE transaction,
with each client's highest sequence number in the same transaction. A batch whose ``seq`` is
not above its client's mark is a retry or a replay and is acknowledged without being stored
again. The marks are read inside that transaction, which holds the store's one write lock
(SQLite's, or PostgreSQL's advisory lock), so this holds across a server restart and across
several servers on one database. Only then is
the request answered, so an acknowledged batch is durable.

After a commit, each run's points go to that run's :class:`LiveDetection` (the same Monitor as
in-process runs, on a thread of its own). ``on_change`` is the alerting hook: it is passed to
every LiveDetection and gets ``[(anomaly row id, Anomaly), ...]`` as episodes change.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from runwatch.expect.reference import ReferenceCurve
from runwatch.guard import Guard
from runwatch.model import Event, SeriesPoints
from runwatch.pipeline.live import LiveDetection, OnChange
from runwatch.server.errors import ApiError
from runwatch.server.ownership import RunOwnership
from runwatch.server.schemas import Batch
from runwatch.store import Store
from runwatch.store.context import StepContext
from runwatch.worker import Worker

log = logging.getLogger("runwatch.server")

OnChangeFactory = Callable[[int], OnChange]
"""Given a run id, the callback its live detection calls with changed episodes (alerting)."""


class _Job:
    __slots__ = ("batches", "future", "points", "run_id")

    def __init__(self, run_id: int, batches: list[Batch]) -> None:
        self.run_id = run_id
        self.batches = batches
        self.points = sum(len(s.steps) for b in batches for s in b.series) + 1
        self.future: concurrent.futures.Future[dict[str, int]] = concurrent.futures.Future()


class IngestWriter:
    """Owns the store's write path; see the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        detect: bool = True,
        detect_config: Mapping[str, str] | None = None,
        on_change: OnChangeFactory | None = None,
        max_group_points: int = 1_000_000,
        max_queued_points: int = 8_000_000,
    ) -> None:
        self.store = store
        self._detect = detect
        self._detect_config = detect_config
        self._on_change = on_change
        self._max_group = max_group_points
        self._max_queued = max_queued_points
        self._lock = threading.Lock()
        self._queued = 0
        self._attempts: dict[int, set[int]] = {}
        self._detections: dict[int, LiveDetection] = {}
        self._references: dict[int, Mapping[str, ReferenceCurve]] = {}
        self._detect_guard = Guard("feeding the server's live detection", log)
        # On a shared database each run's detection runs on one replica, fed from the store.
        self._ownership: RunOwnership | None = None
        self._shared = detect and hasattr(store, "run_locks")
        # Jobs are taken as they come and written as one group when the queue runs dry or
        # the group is full, and at the stop.
        self._group: list[_Job] = []
        self._group_points = 0
        self._worker = Worker(
            "runwatch-ingest",
            self._take,
            tick=self._write_pending,
            on_stop=self._write_pending,
            backlog=lambda: self._queued,
            unit="points",
            logger=log,
        )
        self.stored_points = 0

    # -- called from request handlers ---------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._worker.start()
            if self._shared and self._ownership is None:
                url = self.store.path.secret  # type: ignore[attr-defined]
                self._ownership = RunOwnership(url, self._new_detection)

    @property
    def queued_points(self) -> int:
        return self._queued

    def submit(
        self, run_id: int, batches: list[Batch]
    ) -> concurrent.futures.Future[dict[str, int]]:
        """Queue a request's batches (all or nothing); 503 when the writer is too far behind."""
        self.start()
        job = _Job(run_id, batches)
        with self._lock:
            if self._queued and self._queued + job.points > self._max_queued:
                raise ApiError(
                    503,
                    "server busy",
                    None,
                    f"{self._queued} points waiting to be written",
                    {"Retry-After": "1"},
                )
            self._queued += job.points
        if not self._worker.submit(job):  # closed: say so rather than never answer
            with self._lock:
                self._queued -= job.points
            raise ApiError(503, "server shutting down", None, "the writer has stopped")
        return job.future

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, stop, finish live detection; the store stays open."""
        self._worker.close(timeout)
        if self._ownership is not None:
            self._ownership.close(timeout)
            self._ownership = None
        for run_id in list(self._detections):
            self.close_detection(run_id, timeout=10.0)

    @property
    def detects(self) -> bool:
        """Whether runs get live detection here (``runwatch serve --no-detect`` turns it off)."""
        return self._detect

    def use_references(self, run_id: int, references: Mapping[str, ReferenceCurve]) -> None:
        """Reference mode for ``run_id``: its loss series are judged against ``references``
        by the run's detection when it starts (its first batch; after a finish, the next
        launch's). Every rank of a launch asks for it: a detection already running keeps
        its state, since restarting it would forget what it has seen."""
        with self._lock:
            self._references[run_id] = dict(references)

    def close_detection(self, run_id: int, timeout: float = 10.0) -> None:
        """Finish a run's detection here (its rank 0 finished). On a shared database the
        owner finishes it when it reads the finish from the store."""
        with self._lock:
            detection = self._detections.pop(run_id, None)
        if detection is not None:
            detection.close(timeout)

    # -- the writer thread -------------------------------------------------------------------
    def _take(self, job: _Job) -> bool:
        """Add a job to the group; True (write it now) when full or nothing else waits."""
        self._group.append(job)
        self._group_points += job.points
        return self._group_points >= self._max_group or self._worker.empty()

    def _write_pending(self) -> None:
        jobs, n = self._group, self._group_points
        if not jobs:
            return
        self._group, self._group_points = [], 0
        try:
            self._write_group(jobs)
        except Exception as exc:  # never leave a request waiting forever
            log.exception("runwatch serve: ingest failed")
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(exc)
        finally:
            with self._lock:
                self._queued -= n

    def _write_group(self, jobs: list[_Job]) -> None:
        ready = []
        for job in jobs:
            try:
                for batch in job.batches:
                    self._check_attempt(job.run_id, batch.attempt)
                ready.append(job)
            except ApiError as exc:
                job.future.set_exception(exc)
        if not ready:
            return
        try:
            results = self._commit(ready)
        except Exception:
            # One job broke the group's transaction: store the others one by one.
            log.exception("runwatch serve: a grouped write failed; retrying request by request")
            results = []
            for job in ready:
                try:
                    results.extend(self._commit([job]))
                except Exception as exc:
                    job.future.set_exception(exc)
        for job, reply, delivered in results:
            job.future.set_result(reply)
            if self._detect and delivered and not self._shared:
                self._feed_detection(job.run_id, delivered)

    def _check_attempt(self, run_id: int, attempt: int) -> None:
        known = self._attempts.get(run_id)
        if known is None or attempt not in known:
            known = self.store.attempt_numbers(run_id)
            if not known:
                raise ApiError(404, "no such run", "run_id", f"run {run_id} does not exist")
            self._attempts[run_id] = known
            if attempt not in known:
                raise ApiError(
                    409,
                    "unknown attempt",
                    "attempt",
                    f"run {run_id} has attempts {sorted(known)}, not {attempt}",
                )

    def _commit(self, jobs: list[_Job]) -> list[tuple[_Job, dict[str, int], list[Batch]]]:
        store = self.store
        now = time.time()
        marks: dict[str, tuple[int, int]] = {}
        results = []
        grouped: dict[
            tuple[int, int],
            tuple[dict[int, list[tuple[Any, ...]]], list[Event], list[StepContext]],
        ] = {}
        with store.transaction():
            stored = store.client_seqs({b.client_id for job in jobs for b in job.batches})
            for job in jobs:
                delivered, points = [], 0
                for batch in job.batches:
                    last = (
                        marks[batch.client_id][1]
                        if batch.client_id in marks
                        else stored.get(batch.client_id, -1)
                    )
                    if batch.seq <= last:
                        continue
                    marks[batch.client_id] = (job.run_id, batch.seq)
                    delivered.append(batch)
                    by_sid, events, contexts = grouped.setdefault(
                        (job.run_id, batch.attempt), ({}, [], [])
                    )
                    for s in batch.series:
                        if not s.steps:
                            continue
                        sid = store.series_id(job.run_id, s.metric, s.labels.as_dict())
                        by_sid.setdefault(sid, []).append((s.steps, s.times, s.values))
                        points += len(s.steps)
                    events.extend(
                        Event(e.kind, e.step, e.time, e.message, e.rank, e.host, e.attrs)
                        for e in batch.events
                    )
                    contexts.extend(
                        StepContext(c.step, c.rank, c.time, c.context) for c in batch.contexts
                    )
                reply = {
                    "batches": len(job.batches),
                    "stored": len(delivered),
                    "duplicates": len(job.batches) - len(delivered),
                    "points": points,
                }
                results.append((job, reply, delivered))
            for (run_id, attempt), (by_sid, events, contexts) in grouped.items():
                arrays = {sid: _concat(parts) for sid, parts in by_sid.items()}
                store.write(run_id, attempt, arrays, events, now=now)
                store.add_context(run_id, attempt, contexts)
            store.set_client_seqs(marks, now)
        self.stored_points += sum(r[1]["points"] for r in results)
        return results

    def _feed_detection(self, run_id: int, batches: list[Batch]) -> None:
        with self._detect_guard:  # detection must never cost a run its points
            sink = self._detection(run_id)
            for batch in batches:
                points = [
                    SeriesPoints(
                        s.metric, s.labels.as_dict(), *_concat([(s.steps, s.times, s.values)])
                    )
                    for s in batch.series
                    if s.steps
                ]
                events = [
                    Event(e.kind, e.step, e.time, e.message, e.rank, e.host, e.attrs)
                    for e in batch.events
                ]
                sink(points, events)

    def _detection(self, run_id: int) -> LiveDetection:
        detection = self._detections.get(run_id)
        if detection is None:
            detection = self._new_detection(run_id)
            with self._lock:
                self._detections[run_id] = detection
        return detection

    def _new_detection(self, run_id: int) -> LiveDetection:
        with self._lock:
            references = self._references.get(run_id)
        return LiveDetection(
            self.store.path,
            run_id,
            self._detect_config,
            on_change=self._on_change(run_id) if self._on_change else None,
            references=references,
        )


def _concat(parts: list[tuple[Any, Any, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if len(parts) == 1:
        steps, times, values = parts[0]
        return (
            np.asarray(steps, dtype=np.int64),
            np.asarray(times, dtype=np.float64),
            np.asarray(values, dtype=np.float64),
        )
    return (
        np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts]),
        np.concatenate([np.asarray(p[1], dtype=np.float64) for p in parts]),
        np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts]),
    )
