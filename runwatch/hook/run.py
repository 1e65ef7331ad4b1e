"""``runwatch.init()`` and the ``Run`` it returns: the logging hook in the training loop.

``run.log`` is the hot path and does the least possible (sentry-python's habit), in C
(``RunGate`` in ``_log_gate.pyx``: after a training step every interpreted line is a cache
miss): it computes the step, checks one bound, copies the dict and appends it to a ``deque``
whose size it tracks itself (``Queue`` with a real bound costs a lock and a condition per
call, five times the budget). No thread waits on that deque: the writer drains it on its own clock
(``runwatch.hook.drain``), so a call never wakes a thread that would then take the GIL from
the training loop. Only a backlog past half the bound wakes the writer early. It never blocks
and never raises into the training loop: a full queue, a finished run or a forked child count
the call as dropped, by reason. Values are read off the training
thread (a tensor's ``.item()``) -- log ``loss.detach()`` rather than a tensor you update in
place. With a local store and live detection in its process (the default), the thread that
drains the deque only forwards it there (``runwatch.hook.forward``), and the writer runs in
that process; otherwise the writer runs here (``runwatch.hook.writer``).

Step context (``context=``, ``run.context``) follows the same rule: the training thread only
compares the dict it is given with the last one (equal: nothing to do) and queues a copy when
it differs; the writer checks, merges and stores it when the merged context changed.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from runwatch.guard import error_counts
from runwatch.hook._log_gate import Flow, RunGate
from runwatch.hook.backend import Backend, ReferenceRefused, StoreBackend
from runwatch.hook.drops import DROP_REASONS, DropCounter
from runwatch.hook.forward import Channel, Forwarder
from runwatch.hook.ranks import RankPolicy, rank_info, rank_labels
from runwatch.hook.transport import HttpBackend, make_backend_from_env
from runwatch.hook.writer import MAX_DRAIN_INTERVAL_S, ContextUpdate, Writer, WriterSettings
from runwatch.model import EVENT_KINDS, Event, SeriesBatch
from runwatch.store import DEFAULT_STORE, RunExistsError, store_label

log = logging.getLogger("runwatch.hook")

_now = time.time
EMBEDDED_FLUSH_S = 0.08
"""Seconds between the writer's drains into a local store: points are there within 0.1 s."""
SERVER_FLUSH_S = 0.25
"""Seconds between the writer's posts to ``runwatch serve``."""
_PLAIN = frozenset({str, int, float, bool, type(None)})
_current: Run | None = None
_live_runs: weakref.WeakSet[Run] = weakref.WeakSet()


def _nothing(*_: Any) -> None:
    """The writer's put and wake while there is no writer (not started, or a forked child):
    no call gets that far, as the run is not accepting then."""


def current_run() -> Run | None:
    """The run most recently started by :func:`init` and not yet finished."""
    return _current


class Extras(Protocol):
    """What ``runwatch.attach`` adds to a run (live detection, alerting, system metrics).

    The hook knows it only by this shape: detection and alerting sit above the hook, and
    ``runwatch/__init__`` hands their factory in through :func:`use_extras`.
    """

    def start(
        self,
        run: Run,
        run_id: int,
        store_path: str,
        embedded: bool,
        writer: WriterSettings | None = None,
    ) -> Callable[[SeriesBatch, list[Event]], None] | Channel | None: ...
    def start_sampler(self, run: Run) -> None: ...
    def stop_sampler(self) -> None: ...
    def close(self, timeout: float, alert_timeout: float) -> None: ...
    def after_fork(self) -> None: ...


_make_extras: Callable[..., Extras] | None = None


def use_extras(factory: Callable[..., Extras] | None) -> None:
    """Set what every new run calls to get its extras (``runwatch.attach.attach``)."""
    global _make_extras
    _make_extras = factory


class Run(RunGate):
    """A training run being logged; create it with :func:`runwatch.init`."""

    def __init__(
        self,
        name: str,
        *,
        project: str | None = None,
        config: Mapping[str, Any] | None = None,
        store: str | os.PathLike[str] = DEFAULT_STORE,
        resume: bool | None = None,
        labels: Mapping[str, Any] | None = None,
        max_pending_points: int = 2_000_000,
        flush_interval: float | None = None,
        finish_timeout: float = 60.0,
        store_retries: int = 3,
        monitor: bool | Mapping[str, str] = True,
        backend: Backend | None = None,
        webhook: str | None = None,
        alerts: str | os.PathLike[str] | None = None,
        alert_timeout: float = 10.0,
        prometheus_port: int | None = None,
        system_metrics: bool = False,
        system_metrics_interval: float = 10.0,
        cpu_wait: bool = True,
        dcgm: str | None = None,
        dcgm_interval: float = 15.0,
        dcgm_hosts: Sequence[str] | None = None,
        keep_metric: Callable[[str], bool] | None = None,
        reference: str | None = None,
        family: Sequence[str] | None = None,
        live_detection: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"run name must be a non-empty str, got {name!r}")
        self.name = name
        self.project = project
        self.config = dict(config or {})
        if family:
            family = list(family)
            self.config.setdefault("family", family)  # the dashboard names it
        self.store_path = os.fspath(store)
        self._finish_timeout = finish_timeout
        self._drops = DropCounter()
        self._flow = Flow()
        self._max_pending = max_pending_points
        # Past this backlog (points) the call takes the slow path: it wakes the writer early,
        # and past max_pending it drops. One comparison on the hot path either way.
        self._wake_at = max_pending_points // 2
        self._next_step = 0
        self._accepting = False
        self._closed_reason = "worker_dead"
        self._put: Callable[[Any], None] = _nothing
        self._wake: Callable[[], None] = _nothing
        self._context_given: Any = None  # a copy of the last context= that was queued
        self._writer: Writer | None = None
        self._backend: Backend | None = None
        self._extras: Extras | None = None
        self.run_id: int | None = None
        self._finished = False
        self._sections: Any = None  # runwatch.hook.sections.Sections, on first use
        self._pid = os.getpid()
        self._alert_timeout = alert_timeout
        # Checked before anything is written: a wrong reference run fails here. With a
        # server, the server's detection reads the reference curves from its store.
        if _make_extras is not None:
            self._extras = _make_extras(
                name=name,
                store_path=self.store_path,
                embedded=backend is None,
                monitor=monitor,
                reference=reference,
                family=family,
                config=self.config,
                webhook=webhook,
                alerts=alerts,
                prometheus_port=prometheus_port,
                system_metrics=system_metrics,
                system_metrics_interval=system_metrics_interval,
                dcgm=dcgm,
                dcgm_interval=dcgm_interval,
                dcgm_hosts=dcgm_hosts,
                live_detection=live_detection,
            )
        try:
            self._backend = backend if backend is not None else StoreBackend(self.store_path)
            self.run_id, attempt = self._backend.start_run(
                name, project, self.config, resume, reference=reference, family=family or None
            )
        except (RunExistsError, ReferenceRefused):
            raise
        except Exception as exc:  # the training run must go on without us
            self._backend = None
            self._closed_reason = "store_error"
            log.error(
                "runwatch: cannot open %s (%s); this run will not be recorded, its points "
                "are counted as dropped (store_error)",
                store_label(self.store_path if backend is None else backend.location),
                exc,
            )
            return
        # Alerting, /metrics and live detection are decided here, once, after the store
        # exists (their threads open it too), so the writer's loop never asks; a bad rules
        # file fails init.
        sink = None
        embedded = isinstance(self._backend, StoreBackend)
        # The writer's clock: a local store has the points within 0.1 s; a server keeps
        # the request rate it had (hundreds of ranks post to one server).
        default_interval = EMBEDDED_FLUSH_S if embedded else SERVER_FLUSH_S
        interval = flush_interval if flush_interval is not None else default_interval
        # With a local store the writer can run in live detection's process; what it needs
        # goes there (``runwatch.hook.forward``).
        settings = WriterSettings(
            attempt=attempt,
            labels=dict(labels or {}),
            keep_metric=keep_metric,
            flush_interval=interval,
            retries=store_retries,
            cpu_wait=bool(cpu_wait),
        )
        if self._extras is not None:
            sink = self._extras.start(self, self.run_id, self.store_path, embedded, settings)
        if isinstance(sink, Channel):  # the writer runs in runwatch's process
            self._writer = Forwarder(
                sink,
                flow=self._flow,
                drops=self._drops,
                attempt=attempt,
                flush_interval=interval,
                max_interval=MAX_DRAIN_INTERVAL_S,
                flush_timeout=self._finish_timeout,
            )
            # Plain numbers go to the ring of runwatch's process, the rest is queued with
            # its place marked there; the bound on what waits unstored holds there too
            # (about 16 bytes a point).
            self._ring = self._writer.ring
            self._ring.limit = min(self._ring.limit, 16 * max_pending_points)
        else:
            self._writer = settings.build(
                self._backend, flow=self._flow, drops=self._drops, sink=sink
            )
        # The hot path puts straight on the writer's queue: run.log bounds and counts itself.
        self._put = self._writer.worker.put if self._ring is None else self._ring.put_marked
        self._wake = self._writer.worker.wake
        if not self._writer.worker.start():  # interpreter shutting down: disabled, logged
            return
        self._accepting = True
        _live_runs.add(self)
        if self._extras is not None:
            self._extras.start_sampler(self)

    # -- the hot path ------------------------------------------------------------------------
    def _backlogged(self, queued: int, n: int) -> bool:
        """Past half the bound: wake the writer (it drains now, not at its next tick); past
        the bound: drop the call, counted. True when it was dropped."""
        self._wake()
        if queued - self._flow.drained > self._max_pending:
            self._drops.add("queue_full", n)
            return True
        return False

    def log_labeled(
        self, data: Mapping[str, Any], labels: Mapping[str, Any], step: int | None = None
    ) -> None:
        """Record a collector's metrics (one GPU, one host) under extra series ``labels``.

        Unlike ``log`` it leaves the training step alone (default: the current step) and
        never starts a new attempt. Never raises.
        """
        try:
            if not self._accepting:
                self._drops.add(self._closed_reason, len(data))
                return
            at = max(self._next_step - 1, 0) if step is None else step
            self._flow.queued += len(data)
            self._put((at, _now(), dict(data), dict(labels)))
        except Exception:
            self._drops.add("not_a_dict")

    def _refuse_call(self, data: object, step: object) -> None:
        """``log``'s slow path: any Mapping but a plain dict (or a step the writer will judge)
        is copied and queued within the bound; anything else is dropped, counted, warned."""
        try:
            if isinstance(data, Mapping) and self._accepting:
                copy = dict(data)
                if self._admit(len(copy)):
                    self._put((step, _now(), copy))
                return
            self._drops.add("not_a_dict" if not isinstance(data, Mapping) else "bad_step")
            self._drops.warn_once(
                "call",
                "runwatch: run.log() needs a dict of metrics and an "
                "integer step; got %s (step %r); dropped (not_a_dict)",
                type(data).__name__,
                step,
            )
        except Exception:  # never raise into the training loop
            self._drops.add("not_a_dict")

    def _log_with_context(self, data: Mapping[str, Any], step: int, n: int, context: Any) -> None:
        """``log`` with a context that differs from the last one: a copy of it and the call
        go on the queue as one item (the writer checks the context).

        Few calls on purpose: after a training step's work every call here runs with cold
        caches, at several microseconds each (bench/README-logging.md)."""
        if not isinstance(data, Mapping):  # dropped as log drops it, and its context too
            self._refuse_call(data, step)
            return
        points = dict(data)
        update: ContextUpdate | None = ContextUpdate()
        try:
            given = dict(context) if isinstance(context, Mapping) else context
            update.values = given  # type: ignore[union-attr]
            update.time = _now()  # type: ignore[union-attr]
            # Kept for the next comparison only when it holds plain values: comparing dicts
            # that hold arrays would raise in the training thread. The writer only reads it.
            self._context_given = given if type(given) is dict else None
            for value in given.values():
                if type(value) not in _PLAIN:
                    self._context_given = None
                    break
        except Exception:  # not a mapping; never raise into the training loop
            self._context_given = None
            self._drops.add("bad_context")
            self._drops.warn_once(
                "context",
                "runwatch: context= needs a dict of str, int, float or bool values; got a "
                "%s; dropped (bad_context)",
                type(context).__name__,
            )
            update = None
        if not self._admit(n):
            if update is not None:  # the points are dropped, the context still holds
                update.log = None
                self._put(update)
            return
        if update is None:
            self._put((step, _now(), points))
        else:
            update.log = (step, update.time, points)
            self._put(update)

    # -- the rest of the API -----------------------------------------------------------------
    def context(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """Merge ``values`` and keyword arguments into the step context, from the next
        logged step on: ``run.context(shard="s17")``. A value of None removes the key.

        The context (str, int, float or bool values) is stored when it changes, with its
        step, per rank where the run has one; other values are refused and counted
        (``bad_context``). Never raises.
        """
        try:
            if not self._accepting:
                return
            update = ContextUpdate()
            update.values = {**values, **more} if values is not None else more
            update.time = _now()
            update.log = None
            self._context_given = None  # the next context= is compared with nothing
            self._put(update)
        except Exception:  # never raise into the training loop
            self._drops.add("bad_context")
            self._drops.warn_once(
                "context_call",
                "runwatch: run.context() needs a mapping or keyword arguments; got %s "
                "(bad_context)",
                type(values).__name__,
            )

    @property
    def step(self) -> int:
        """The step the next ``log`` without ``step=`` will use."""
        return int(self._next_step)

    def section(self, name: str) -> Any:
        """Time a block of this step as ``name``: ``with run.section("compute"):`` around the
        rank's own work (logged as ``step_time_compute``, the straggler detector's own-time
        signal), ``"wait"``/``"comm"`` around waiting for the others (``comm_wait_time``),
        any other name as ``section_<name>_time``; each step's totals once per step."""
        if self._sections is None:
            from runwatch.hook.sections import Sections

            self._sections = Sections(self)
        return self._sections.section(name)

    def event(self, kind: str, step: int | None = None, message: str = "", **attrs: Any) -> None:
        """Record an event (checkpoint, crash, xid, note, ...) at ``step`` (default: current)."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; valid: {', '.join(EVENT_KINDS)}")
        if not self._accepting:
            return
        rank = attrs.pop("rank", None)
        host = attrs.pop("host", None)
        at = max(self._next_step - 1, 0) if step is None else int(step)
        self._put(Event(kind, at, _now(), str(message), rank, host, attrs))

    def follow(self, source: Callable[[], list[tuple[int, float, dict[str, Any]]]]) -> None:
        """Log what ``source()`` returns, read on the writer's thread at every drain, flush
        and finish: ``(step, time, metrics)`` tuples, as ``log`` would have queued them.

        For a framework that keeps its own log (the HF Trainer's ``log_history``): the
        training thread then only marks new entries, and the reading, filtering and
        timing happen off it. ``source`` must be safe to call from that thread and quick;
        ``step`` follows the last step it returned."""
        if not self._accepting or self._writer is None:
            return

        def pull() -> list[tuple[int, float, dict[str, Any]]]:
            items = source()
            if items and items[-1][0] >= self._next_step:
                self._next_step = items[-1][0] + 1
            return items

        self._writer.follow(pull)

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything logged so far is written; True if it was in time."""
        if not self._accepting or self._writer is None:
            return False
        return self._writer.worker.flush(timeout)

    def stats(self) -> dict[str, Any]:
        """Counts: points logged, written, pending, dropped by reason; attempt and step."""
        flow = self._flow
        return {
            "logged": flow.queued,
            "written": flow.written,
            "pending": flow.queued - flow.drained,
            "dropped": self._drops.snapshot(),
            "attempt": self._writer.attempt if self._writer else None,
            "step": self.step,
            "internal_errors": error_counts(),
        }

    def finish(self, timeout: float | None = None, *, status: str = "finished") -> None:
        """Flush what is pending (waiting up to ``timeout`` s), close the run and the store."""
        global _current
        if self._finished or os.getpid() != self._pid:
            return
        self._finished = True
        self._flush_timings()
        self._accepting = False
        self._closed_reason = "finished"
        timeout = self._finish_timeout if timeout is None else timeout
        started = time.monotonic()
        if self._extras is not None:
            self._extras.stop_sampler()
        writer = self._writer
        # Two-phase wait; what is still unwritten after ``timeout`` is counted (queue_full).
        if writer is not None and not writer.worker.close(timeout):
            log.warning(
                "runwatch: finish timed out after %.1f s; %d points not written",
                timeout,
                writer.worker.lost,
            )
        if self._extras is not None:  # bounded waits for detection and pending alerts
            self._extras.close(timeout - (time.monotonic() - started), self._alert_timeout)
        self._close_backend(status)
        if _current is self:
            _current = None
        _live_runs.discard(self)

    def _flush_timings(self) -> None:
        """Log the last step's section totals and ``runwatch.torch`` timings before closing."""
        if self._sections is not None:
            self._sections.flush()
        ddp = sys.modules.get("runwatch.torch.ddp")
        if ddp is not None:
            ddp.flush_all()

    def _close_backend(self, status: str) -> None:
        dropped = self._drops.snapshot()
        if dropped:
            detail = ", ".join(
                f"{n} {reason} ({DROP_REASONS.get(reason, reason)})"
                for reason, n in sorted(dropped.items())
            )
            log.warning("runwatch: run %r dropped points: %s", self.name, detail)
        backend, writer = self._backend, self._writer
        if backend is None or (writer is not None and writer.worker.alive):
            return
        try:
            backend.finish(
                writer.attempt if writer else None,
                writer.last_step if writer else None,
                status,
                dropped,
            )
        except Exception as exc:
            log.warning("runwatch: could not record the end of run %r: %s", self.name, exc)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None and self._accepting and not isinstance(exc, KeyboardInterrupt):
            self.event("crash", message=f"{exc_type.__name__ if exc_type else ''}: {exc}")
            self.finish(status="crashed")
        else:
            self.finish()

    def _after_fork_in_child(self) -> None:
        """In a forked child (DataLoader worker), the writer thread does not exist."""
        self._accepting = False
        self._closed_reason = "forked_child"
        if self._extras is not None:
            self._extras.after_fork()  # their threads did not survive the fork
        self._put = _nothing
        self._ring = None  # the parent's: never written from here


def init(
    name: str | None = None,
    *,
    project: str | None = None,
    config: Mapping[str, Any] | None = None,
    store: str | os.PathLike[str] | None = None,
    resume: bool | None = None,
    url: str | Sequence[str] | None = None,
    token: str | None = None,
    **options: Any,
) -> Run:
    """Start (or resume, as a new attempt) a monitored run and return it.

    Parameters
    ----------
    name
        The run (default ``$RUNWATCH_RUN``, else ``run-<date>-<time>``). A run of the same
        name resumes as a new attempt unless ``resume=False``.
    project, config
        Grouping and the run's config; config keys with a meaning: ``params``,
        ``total_steps``, ``tokens_per_step``, ``schedule`` (docs/architecture.md).
    store
        The SQLite file (default ``$RUNWATCH_STORE``, else ``runwatch.db`` here).
    url, token
        Push to ``runwatch serve`` instead (``$RUNWATCH_URL``, ``$RUNWATCH_TOKEN`` or
        ``$RUNWATCH_TOKEN_FILE``): for multi-process and multi-node runs. The rank, world
        size and host come from the launcher (torchrun, SLURM, MPI) and label every series;
        every rank joins one run and one attempt. Several servers on one database (a list,
        or a comma list in ``$RUNWATCH_URL``): the client fails over between them, and a
        batch retried through another one is stored once.
    all_ranks, per_rank
        Keep every metric of every rank (default: rank 0 logs the run-level metrics, every
        rank its own step time and telemetry), or the metrics named in ``per_rank``
        (``["compute_time", "attn/*"]``). Another run-level metric logged on a rank other
        than 0 is dropped, counted (``other_rank``) and named in one warning. In synchronous
        DDP the wall step time is the same on every rank: ``runwatch.torch.instrument(model)``
        (after wrapping it in DDP) logs each rank's own compute and wait, and in a plain loop
        ``with run.section("compute"):`` around the rank's own work does the same.
    monitor
        Live detection (default on; a mapping gives metric roles; ``False`` turns it off).
    live_detection
        Where it runs: ``"process"`` (default, or ``$RUNWATCH_LIVE_DETECTION``), a child
        process with the alert engine, which takes no GIL from the training loop and
        records a crash when this process is killed; ``"thread"``, a thread of this one.
    reference
        ``"RUN"``: judge each loss against that earlier, known-good run's curve in the same
        store, aligned by step, instead of a fit (``runwatch analyze --reference`` on
        replay). With ``url=``, the server's detection reads it from the server's store.
        An unknown reference, one without the run's loss, or ``monitor=False`` raises
        ``ValueError`` before anything is written.
    family
        ``["RUN", ...]``: judge each loss against what those earlier runs of the recipe (at
        other sizes and schedules, each with ``params`` in its config) predict for this
        run, from step 0 (``runwatch forecast --family``). The run's config needs
        ``params`` and ``total_steps`` (and its ``schedule`` when the family's differs).
        With ``url=``, the server reads the family from its store. A bad family raises
        ``ValueError`` before anything is written.
    webhook, alerts, alert_timeout, prometheus_port
        ``webhook=URL`` (or ``$RUNWATCH_WEBHOOK_URL``) sends warnings and worse to a JSON
        webhook with the packaged default rules; ``alerts=PATH`` (or ``$RUNWATCH_ALERTS``)
        uses a rules file (``runwatch.alerting``); ``alert_timeout`` (default 10 s) bounds
        how long ``finish()`` waits for pending alerts; ``prometheus_port=P`` serves
        ``/metrics`` on 127.0.0.1:P (0 picks a free port).
    flush_interval
        Seconds between the writer thread's drains and writes (default 0.08 into a local
        store, so points are there within 0.1 s; 0.25 to a server). ``run.log`` never wakes
        the writer: it drains on this clock, or early when the backlog passes half of
        ``max_pending_points``. While the training thread never lets go of the GIL (a
        pure-Python loop) the writer stretches it up to 0.25 s, to interrupt that loop less.
    system_metrics, system_metrics_interval
        Poll NVML and the host every ``system_metrics_interval`` s (default 10).
    cpu_wait
        Record how long this process's threads waited for a CPU (``host_cpu_wait``, Linux),
        so that steps slowed by a busy host are not judged as the run's slowdowns (default
        on). Turn it off when the step times you log were not measured in this process (a
        simulation, another job's log replayed).
    dcgm, dcgm_interval, dcgm_hosts
        ``dcgm=URL`` (or ``$RUNWATCH_DCGM_URL``): read the GPUs' DCGM exporter metrics from
        that Prometheus every ``dcgm_interval`` s (default 15, the exporter's usual scrape
        interval) as ``gpu_*`` series labelled rank, host and gpu, and XIDs as ``xid``
        events; the GPUs of this host, or of ``dcgm_hosts=[...]`` (in the launcher's node
        order). Only rank 0 (or a single process) polls; Prometheus being down is one
        warning and polling goes on; a malformed URL raises ``ValueError`` here.
    """
    global _current
    if name is None:
        name = os.environ.get("RUNWATCH_RUN") or f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    path = store if store is not None else os.environ.get("RUNWATCH_STORE", DEFAULT_STORE)
    if "backend" not in options and store is None:
        backend = make_backend_from_env(url, token)
        if backend is not None:
            options["backend"] = backend
    info = rank_info()
    if "labels" not in options and (
        isinstance(options.get("backend"), HttpBackend) or info.rank is not None
    ):
        # a plain single process keeps unlabelled series, as before
        options["labels"] = rank_labels()
    all_ranks = options.pop("all_ranks", False)
    per_rank = options.pop("per_rank", ())
    if not all_ranks and info.rank not in (None, 0):
        options["keep_metric"] = RankPolicy(info.rank, per_rank)
    run = Run(name, project=project, config=config, store=path, resume=resume, **options)
    _current = run
    return run


def _finish_all_at_exit() -> None:
    """At interpreter exit: record an uncaught exception as a crash, then finish every run."""
    crash = getattr(sys, "last_value", None)
    for run in list(_live_runs):
        if crash is not None:
            run.event("crash", message=f"{type(crash).__name__}: {crash}")
        run.finish(status="crashed" if crash is not None else "finished")


def _after_fork_in_child() -> None:
    for run in list(_live_runs):
        run._after_fork_in_child()


atexit.register(_finish_all_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
