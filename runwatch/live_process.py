"""The run's writer, live detection and alerting in a process of their own, beside the
training process.

In the training process they took the GIL from the training loop: detection's Python for
every point, and the writer's, with a GIL hand-over at each SQLite statement
(``bench/README-hook-cadence.md``). So ``runwatch.init`` starts this module as a child
(``python -m runwatch.live_process``) and keeps only a forward thread
(``runwatch.hook.forward``), which pickles what was queued into a pipe on the writer's
clock. The child runs the same :class:`~runwatch.hook.writer.Writer`,
:class:`~runwatch.pipeline.live.LiveDetection` and alert engine, on its own store
connection. It runs at the training process's priority: it is the run's writer, and on a
busy machine a lower one starved it (a 5 s bound on ``finish`` took 7 s under two busy
processes).

The pipe never blocks the training process: its end is non-blocking, what the pipe cannot
take waits in a buffer, and past ``MAX_PENDING_BYTES`` points are dropped and counted
(``queue_full``). The child's log records, its answers to ``flush()`` and its writer's
counters come back through a second pipe, to the parent's loggers and ``run.stats()``. At
``finish`` the parent sends the rest and waits, bounded, for the child to write and judge
it and send its alerts. If the training process dies first (SIGKILL, the OOM killer), the
child notices, writes what reached it, records a ``crash`` event (an incident, and an alert
with rules), marks the run crashed and exits. If the child dies first, the training process
starts another, up to ``MAX_RESTARTS`` times (:meth:`LiveProcess._child_gone`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import mmap
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from runwatch.hook._ring import HEADER_BYTES, RingWriter
from runwatch.hook.drops import DropCounter
from runwatch.hook.frames import FrameReader, frame
from runwatch.hook.ring_feed import RingFeed
from runwatch.hook.writer import WriterSettings
from runwatch.model import Event

log = logging.getLogger("runwatch.live_process")

RING_BYTES = 16 << 20
"""The ring ``run.log`` writes plain numbers to (``runwatch.hook._ring``): half of it holds
about 80,000 calls of four numbers not yet stored before calls take the queue instead."""
MAX_PENDING_BYTES = 64 << 20
"""What the training process keeps for a child that reads slower than the run logs (about
two million points), before it drops points (counted)."""
PIPE_BYTES = 1 << 20
"""The pipe's size asked of the kernel (Linux's default ceiling for an unprivileged user)."""
COUNTERS_EVERY_S = 1.0
"""How often the child tells the training process what its writer wrote and dropped (for
``run.stats()`` between flushes): each message takes the GIL there once."""
PARENT_CHECK_S = 0.5
"""How often the child looks whether the training process is still there."""
RESUME_CLAIM_WAIT_S = 5.0
"""How long a restarted child tries to take the run's ownership lock on PostgreSQL before
leaving detection to whoever holds it (a ``runwatch serve`` replica may have taken over)."""
MAX_RESTARTS = 3
"""How many times a child that ends early (killed, crashed) is started again for the rest of
the run; after that, points are dropped and counted (``worker_dead``)."""


# -- the training process's side ----------------------------------------------------------------
class LiveProcess:
    """The child process and its pipes, as the training process sees them: the channel of
    ``runwatch.hook.forward``.

    ``setup`` is what the child builds from (:class:`_Host`): the store, the run, its roles
    and references, the alert rules' source, the run's name and project, and its writer's
    settings. ``drops`` counts what cannot reach the child. Raises ``OSError`` when the
    child cannot be started (the caller then writes and detects in threads).
    """

    def __init__(self, setup: Mapping[str, Any], drops: DropCounter) -> None:
        self._setup = dict(setup)
        self._lock = threading.Lock()  # the forward thread, finish() and a restart send
        self._broken = False
        self._closing = False
        self._drops = drops
        self._token = 0
        # Each open sync's answer, timeout and ring head, by token: a restarted child gets
        # them again.
        self._answers: dict[int, tuple[threading.Event, float, int]] = {}
        self.on_counters: Any = None  # gets the writer's counters whenever the child sends them
        self.restarts = 0
        # The frames sent and not yet stored by the child (its counters' ``kept_mark``):
        # (its last item's mark in the ring, its last step, its points).
        self._sent_mark = 0
        self._unconfirmed: collections.deque[tuple[int, int | None, int]] = collections.deque()
        self._orphaned: list[tuple[int, int | None, int]] = []  # a dead child's unconfirmed
        self._written_before = 0
        self._last: dict[str, Any] = {
            "written": 0,
            "dropped": {},
            "attempt": setup["writer"].attempt,
            "last_step": None,
        }
        self._ring_fd = _shared_memory(HEADER_BYTES + RING_BYTES)
        self._ring: RingWriter | None = None
        with self._lock:
            self._spawn({**self._setup, "ring": {"fd": self._ring_fd}})

    def open_ring(self, append: Any, on_full: Any) -> RingWriter:
        """The ring's writing end (one per run); see ``runwatch.hook.forward.Channel``."""
        # Its pages made now, not on a first write in run.log (a page fault per 4 KiB).
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._ring = RingWriter(mmap.mmap(self._ring_fd, 0, flags), append, on_full)
        return self._ring

    def _spawn(self, setup: Mapping[str, Any]) -> None:
        """Start a child for ``setup`` with its records thread, and send it the setup."""
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        # The child imports the runwatch this process runs, wherever it came from.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(
            # -P: not the working directory first, which may hold another runwatch
            [sys.executable, "-P", "-m", "runwatch.live_process", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            pass_fds=(self._ring_fd,),
        )
        assert proc.stdin is not None and proc.stdout is not None
        self._proc = proc
        self._fd = proc.stdin.fileno()
        try:
            import fcntl

            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # the default 64 KiB pipe: the buffer here takes the rest
        level = logging.getLogger("runwatch").getEffectiveLevel()
        self._pending = bytearray(frame(("setup", {**setup, "log_level": level})))
        os.set_blocking(self._fd, False)
        self._records = threading.Thread(
            target=self._forward_records, args=(proc,), name="runwatch-child-records", daemon=True
        )
        self._records.start()
        self._push()

    # -- called from the forward thread (``runwatch.hook.forward``) -------------------------
    def send_items(
        self, message: bytes, points: int, last_mark: int, last_step: int | None
    ) -> None:
        """One drain of the run's queue, a frame pickled there (``runwatch.hook.forward``)."""
        with self._lock:
            if self._broken:
                self._drops.add("worker_dead", points)
                return
            if len(self._pending) > MAX_PENDING_BYTES:
                self._drops.add("queue_full", points)
                self._drops.warn_once(
                    "child behind",
                    "runwatch: the writer in live detection's process is %d MB behind; "
                    "dropping points (counted as queue_full)",
                    len(self._pending) >> 20,
                )
                return
            self._pending += message
            # a frame's highest mark: a later frame's can be lower (a drain in chunks)
            self._sent_mark = max(self._sent_mark, last_mark)
            self._unconfirmed.append((last_mark, last_step, points))
            self._push()

    def sync(self, timeout: float, head: int) -> bool:
        """Wait until the child's writer stored all that was sent, and the ring up to
        ``head`` (its counters reach ``on_counters`` first); False after ``timeout`` s or
        when the child is gone."""
        deadline = time.monotonic() + timeout
        answered = threading.Event()
        with self._lock:
            if self._broken:
                return False
            self._token += 1
            self._answers[self._token] = (answered, timeout, head)
            self._pending += frame(("sync", self._token, timeout, head))
            self._send_all(deadline)
        return answered.wait(max(0.0, deadline - time.monotonic()))

    def _push(self) -> None:
        """Write what the pipe takes now, without waiting."""
        while self._pending:
            try:
                written = os.write(self._fd, self._pending)
            except BlockingIOError:
                return
            except OSError as exc:  # the child is gone
                self._child_gone(self._proc, exc)
                return
            del self._pending[:written]

    def _child_gone(self, proc: subprocess.Popen[bytes], cause: object) -> None:
        """``proc`` ended before the run finished (with the lock held): start another child
        for the rest of the run, at most ``MAX_RESTARTS`` times, then stop sending.

        The new child resumes the run's attempt, replays the run from the store into live
        detection (``LiveDetection.take_over``), reads the ring from where the old one had
        stored it (:meth:`_ring_resumed`), answers the syncs the old one left open, and says
        the last step the store holds: the frames sent through the pipe after it never
        reached the store, and are counted as lost (``worker_dead``, :meth:`_count_lost`).
        """
        if proc is not self._proc or self._broken or self._closing:
            return
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:  # its pipe failed but it still runs: end it
            proc.kill()
            proc.wait()
        for reason, n in self._last["dropped"].items():  # the dead child's drops, kept here
            self._drops.add(reason, n)
        self._drops.set_remote({})
        self._written_before += self._last["written"]
        self._last = {**self._last, "written": 0, "dropped": {}}
        self._orphaned += self._unconfirmed
        self._unconfirmed.clear()
        if self.restarts >= MAX_RESTARTS:
            self._broken = True
            self._pending.clear()
            self._count_lost(None)
            if self._ring is not None:
                self._drops.add("worker_dead", self._ring.close(self._last["last_step"]))
            log.warning(
                "runwatch: runwatch's process beside this one ended early (%s, exit code %s), "
                "%d times; points logged from now on are dropped and counted (worker_dead), "
                "and the run is no longer judged live",
                cause,
                proc.returncode,
                self.restarts + 1,
            )
            return
        self.restarts += 1
        log.warning(
            "runwatch: runwatch's process beside this one ended early (%s, exit code %s); "
            "starting it again (%d of %d)",
            cause,
            proc.returncode,
            self.restarts,
            MAX_RESTARTS,
        )
        writer = self._setup["writer"]
        setup = {
            **self._setup,
            "writer": dataclasses.replace(writer, attempt=self._last["attempt"]),
            "resume": True,
            "ring": self._ring_resumed(),
        }
        try:
            self._spawn(setup)
        except OSError as exc:
            self._broken = True
            log.warning("runwatch: cannot start runwatch's process again (%s)", exc)
            return
        for token, (_, timeout, head) in self._answers.items():
            self._pending += frame(("sync", token, timeout, head))
        self._push()

    def _ring_resumed(self) -> dict[str, Any]:
        """Where a new child reads the ring from: after what the dead one stored. Up to
        where that one had read, it skips the points the store holds (by step) and the
        marks of items sent to it (their frames are counted by :meth:`_count_lost`)."""
        resumed: dict[str, Any] = {"fd": self._ring_fd, "skip_mark": self._sent_mark}
        if self._ring is not None:
            resumed["start"] = self._ring.kept
            resumed["until"] = self._ring.tail
            resumed["names"] = self._ring.key_names()
        return resumed

    # -- called from the thread that finishes the run -----------------------------------------
    def close(self, timeout: float, alert_timeout: float) -> bool:
        """Send the rest and wait (``timeout`` s, then ``alert_timeout`` s for alerts) for the
        child to judge it and exit; True if it did."""
        deadline = time.monotonic() + max(1.0, timeout)
        with self._lock:
            self._closing = True
            if not self._broken:
                self._pending += frame(("finish", max(1.0, timeout), alert_timeout))
                self._send_all(deadline)
            self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            # the child's writer, then its detection, each within ``timeout``, then alerts
            left = max(0.0, deadline - time.monotonic()) + max(1.0, timeout)
            self._proc.wait(left + alert_timeout + 1.0)
        except subprocess.TimeoutExpired:
            log.warning(
                "runwatch: live detection still busy after %.1f s; stopping it (run "
                "`runwatch analyze` for the complete answer)",
                timeout,
            )
            self._proc.kill()
            self._proc.wait()
        self._records.join(5.0)
        os.close(self._ring_fd)
        return self._proc.returncode == 0

    def _send_all(self, deadline: float) -> None:
        while self._pending and not self._broken:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("runwatch: live detection did not take the run's last points in time")
                return
            select.select([], [self._fd], [], left)
            self._push()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker) the pipe is the parent's: leave it."""
        self._broken = True

    # -- the log records thread ---------------------------------------------------------------
    def _forward_records(self, proc: subprocess.Popen[bytes]) -> None:
        """Hand ``proc``'s log records to this process's loggers, and its counters to
        ``on_counters``, until it ends; if it ends before the run finishes, restart it."""
        assert proc.stdout is not None
        reader = FrameReader(proc.stdout.fileno())
        while True:
            try:
                messages = reader.read()
            except OSError:
                messages = None
            if messages is None:
                with self._lock:
                    self._child_gone(proc, "its pipe closed")
                return
            for kind, *payload in messages:
                if kind == "log":
                    record = logging.makeLogRecord(payload[0])
                    logging.getLogger(record.name).handle(record)
                    continue
                if kind == "resumed":
                    with self._lock:
                        if proc is self._proc:
                            self._count_lost(payload[0])
                    continue
                # "counters" (every second, and last at the end) or "synced": the writer's
                # counters, then the sync it answers, if any
                self._counters(proc, payload[-1])
                if kind == "synced":
                    answer = self._answers.pop(payload[0], None)
                    if answer is not None:
                        answer[0].set()

    def _count_lost(self, stored_step: int | None) -> None:
        """Count as lost (``worker_dead``) the frames a dead child was sent that the store
        does not hold: those after ``stored_step`` (None: all it had not confirmed)."""
        lost = sum(
            points
            for _, last, points in self._orphaned
            if stored_step is None or last is None or last > stored_step
        )
        self._orphaned.clear()
        if lost:
            self._drops.add("worker_dead", lost)
            log.warning(
                "runwatch: %d points sent to runwatch's process before it ended never reached "
                "the store (counted as worker_dead)",
                lost,
            )

    def _counters(self, proc: subprocess.Popen[bytes], counters: dict[str, Any]) -> None:
        """``proc``'s writer's counters, as the run counts them: with what the children
        before it wrote (``on_counters``). A dead child's last ones were counted already."""
        with self._lock:
            if proc is not self._proc:
                return
            if counters["last_step"] is None:  # a restarted child that wrote nothing yet
                counters = {**counters, "last_step": self._last["last_step"]}
            self._last = counters
            while self._unconfirmed and self._unconfirmed[0][0] <= counters["kept_mark"]:
                self._unconfirmed.popleft()
            total = {**counters, "written": counters["written"] + self._written_before}
        if self.on_counters is not None:
            self.on_counters(total)


def _shared_memory(size: int) -> int:
    """A file descriptor of ``size`` bytes of memory, for the child to map as well."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("runwatch-ring")
    else:  # not Linux: a file no one else can open, gone once both processes close it
        import tempfile

        handle, path = tempfile.mkstemp(prefix="runwatch-ring-")
        os.unlink(path)
        fd = handle
    os.ftruncate(fd, size)
    return fd


# -- the child ----------------------------------------------------------------------------------
class _RecordSender(logging.Handler):
    """Sends each log record, formatted, to the parent (fd 1); once the parent is gone, to
    the standard error both share (the job's log)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd: int | None = fd
        self._fallback = logging.StreamHandler()
        self._fallback.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self._fd is None:
            self._fallback.emit(record)
            return
        try:
            fields = dict(record.__dict__)
            fields["msg"] = record.getMessage()
            fields["args"] = None
            if record.exc_info:
                fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
            fields["exc_info"] = None
            if not self.send(("log", fields)):
                self._fallback.emit(record)
        except OSError:
            self._fd = None
            self._fallback.emit(record)
        except Exception:
            self.handleError(record)

    def send(self, message: Any) -> bool:
        """Any message to the parent (an answer to ``sync``, the last counters); False when
        the parent is gone. A broken pipe (the parent was killed) is not raised: the main
        loop then finds the parent gone and reads the ring to its end, which a raise would
        skip."""
        if self._fd is None:
            return False
        data = frame(message)
        with self.lock:  # type: ignore[union-attr]
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self._fd, view) :]
            except BrokenPipeError:
                self._fd = None
                return False
        return True


def main() -> None:
    """The child: read the parent's messages from stdin and detect until it finishes or
    goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the training process
    parent = int(sys.argv[1])  # may be gone already: this one started slower than it died
    out = os.dup(1)
    os.dup2(2, 1)  # a stray print must not corrupt the records pipe
    handler = _RecordSender(out)
    root = logging.getLogger("runwatch")
    root.addHandler(handler)
    root.propagate = False
    reader = FrameReader(0)
    host: _Host | None = None
    counted = checked = time.monotonic()
    while True:
        wait = PARENT_CHECK_S if host is None else host.until_read()
        ready, _, _ = select.select([0], [], [], wait)
        now = time.monotonic()
        if host is not None:
            host.read_ring_when_due(now)
            if now - counted >= COUNTERS_EVERY_S:
                handler.send(("counters", host.counters()))
                counted = now
        if not ready:
            if now - checked >= PARENT_CHECK_S:
                checked = now
                if os.getppid() != parent:
                    if host is not None:
                        host.parent_died(parent)
                    return
            continue
        messages = reader.read()
        if messages is None:  # the parent closed the pipe without finishing: it is gone
            if host is not None:
                host.parent_died(parent)
            return
        for message in messages:
            kind = message[0]
            if kind == "setup":
                setup = message[1]
                root.setLevel(setup.pop("log_level"))
                host = _Host(setup)
                stored_step, stored_names = None, frozenset()
                if setup.get("resume"):
                    stored_step, stored_names = host.resume()
                    handler.send(("resumed", stored_step))
                host.start_writer(setup["writer"], parent, stored_step)
                host.open_ring(setup["ring"], stored_step, stored_names)
            elif kind == "items" and host is not None:
                host.arrived(message[1], message[3])
            elif kind == "sync" and host is not None:
                host.read_ring(message[3])
                host.flush(message[2])  # and hands what it stored back to the ring
                handler.send(("synced", message[1], host.counters()))
            elif kind == "finish" and host is not None:
                host.close(message[1], message[2])
                handler.send(("counters", host.counters()))
                return


class _Host:
    """What the child runs for one run: its writer (:meth:`start_writer`), live detection
    as the writer's sink, and the alert engine detection feeds."""

    def __init__(self, setup: Mapping[str, Any]) -> None:
        from runwatch.alerting.setup import resolve_rules, start_engine
        from runwatch.pipeline.live import LiveDetection
        from runwatch.store.run_locks import claim_live_detection

        self._store_path = setup["store_path"]
        self._run_id = setup["run_id"]
        # A restarted child waits a little for the dead one's PostgreSQL session to end.
        wait = RESUME_CLAIM_WAIT_S if setup.get("resume") else 0.0
        owned, self._locks = claim_live_detection(self._store_path, self._run_id, wait)
        self.detection: LiveDetection | None = None
        self.writer: Any = None
        self.feed: RingFeed | None = None
        self._interval = PARENT_CHECK_S  # the writer's, once it runs (``open_ring``)
        self._read_due = 0.0
        self._writer_closed = False
        self.engine = None
        if not owned:
            return
        on_change = None
        rules = resolve_rules(*setup["alerts"])  # checked by the training process already
        if rules is not None:
            self.engine = start_engine(rules, self._store_path)
            on_change = self.engine.bind(setup["name"], setup["project"])
        self.detection = LiveDetection(
            self._store_path,
            self._run_id,
            setup["roles"],
            on_change=on_change,
            references=setup["references"],
        )

    def resume(self) -> tuple[int | None, frozenset[str]]:
        """Started again mid-run (the child before died): detection goes on from what the
        store holds, as a server replica does when it takes a run over, so no episode is
        lost or doubled. Returns the last step the store holds (None: no point) and the
        metrics it holds at that step."""
        from runwatch.store import Store

        store = Store(self._store_path)
        try:
            points = store.read_points(self._run_id)
            events = store.events(self._run_id) if self.detection is not None else None
        finally:
            store.close()
        if self.detection is not None:
            self.detection.take_over(points, events)
        if not len(points):
            return None, frozenset()
        last = int(points["step"].max())
        return last, frozenset(points.loc[points["step"] == last, "metric"])

    def start_writer(self, settings: WriterSettings, parent: int, last_step: int | None) -> None:
        """The run's writer, here rather than in the training process (its items come
        from the ring): the store, and live detection as its sink. ``last_step``: the last
        step the store holds, when this child takes over from one that died, so that a step
        that goes back still starts a new attempt."""
        from runwatch.hook._log_gate import Flow
        from runwatch.hook.backend import StoreBackend
        from runwatch.hook.drops import DropCounter

        backend = StoreBackend(self._store_path)
        backend.run_id = self._run_id
        self._flow = Flow()
        self.writer = settings.build(
            backend, flow=self._flow, drops=DropCounter(), sink=self.detection, pid=parent
        )
        self.writer.last_step = last_step
        self._backend = backend
        self.writer.worker.start()

    def open_ring(
        self, ring: Mapping[str, Any], stored_step: int | None, stored_names: frozenset[str]
    ) -> None:
        """Read the training process's ring (``setup["ring"]``), from where the child before
        this one left it, if there was one (``LiveProcess._ring_resumed``)."""
        self.feed = RingFeed(
            ring["fd"],
            start=ring.get("start"),
            until=ring.get("until", 0),
            names=ring.get("names"),
            skip_mark=ring.get("skip_mark", 0),
            stored_step=stored_step,
            stored_names=stored_names,
        )
        self._interval = self.writer.worker.interval

    def until_read(self) -> float:
        """Seconds until the ring is due to be read (at the writer's interval)."""
        return max(0.0, min(PARENT_CHECK_S, self._read_due - time.monotonic()))

    def read_ring_when_due(self, now: float) -> None:
        if now >= self._read_due:
            self._read_due = now + self._interval
            self.read_ring()

    def arrived(self, items: list[Any], marks: list[int]) -> None:
        """Queued items, each with its place in the ring: take them and what the ring
        held up to them now."""
        assert self.feed is not None
        self.feed.arrived(items, marks)
        self.read_ring()

    def read_ring(self, stop: int | None = None) -> None:
        """Hand the writer what the ring holds (up to byte ``stop``), and hand back to the
        ring what the writer has stored."""
        feed, rounds = self.feed, self.writer.worker.rounds
        assert feed is not None
        feed.keep(rounds)
        feed.read(self._take, stop)
        feed.taken(rounds)

    def _take(self, items: list[Any], points: int) -> None:
        """Items in the order they were logged, and their points as the training process
        counted them."""
        self._flow.add_queued(points)
        put = self.writer.worker.put
        for item in items:
            put(item)
        self.writer.worker.wake()  # written now: the ring is read on the writer's clock

    def flush(self, timeout: float) -> None:
        if self.writer.worker.flush(timeout) and self.feed is not None:
            self.feed.stored()

    def counters(self) -> dict[str, Any]:
        """What the training process's ``run.stats()`` and ``finish`` need of the writer."""
        return {
            "written": self._flow.written,
            "dropped": self.writer._drops.snapshot(),
            "attempt": self.writer.attempt,
            "last_step": self.writer.last_step,
            "kept_mark": self.feed.kept_mark if self.feed is not None else 0,
        }

    def _close_writer(self, timeout: float) -> None:
        if self.writer is not None and not self._writer_closed:
            self._writer_closed = True
            self.writer.worker.close(timeout)
            self._backend.store.close()

    def _read_last(self) -> None:
        """The training process has finished or died: read the ring to its end."""
        if self.feed is not None and self.writer is not None and not self._writer_closed:
            self.feed.last()
            self.read_ring()

    def close(self, timeout: float, alert_timeout: float) -> None:
        self._read_last()
        self._close_writer(timeout)
        if self.detection is not None:
            self.detection.close(timeout)
        if self._locks is not None:
            self._locks.close()
        if self.engine is not None:
            self.engine.close(alert_timeout)

    def parent_died(self, pid: int) -> None:
        """The training process ended without finishing the run: judge what it wrote,
        then record the crash, which forms an incident (and an alert, with rules)."""
        from runwatch.store import Store

        self._read_last()
        self._close_writer(10.0)
        if self.detection is None:
            return  # another process owns the run, and judges its end
        store = Store(self._store_path)
        try:
            attempt = max(store.attempt_numbers(self._run_id), default=None)
            runs = store.runs()
            last = runs.loc[runs["run_id"] == self._run_id, "last_step"].dropna()
            crash = Event(
                "crash",
                int(last.iloc[0]) if len(last) else None,
                time.time(),
                f"the training process (pid {pid}) ended without finishing the run",
            )
            store.add_events(self._run_id, attempt, [crash])
            store.set_run_status(self._run_id, "crashed")
        finally:
            store.close()
        self.detection([], [crash])
        log.warning("runwatch: %s; run marked crashed", crash.message)
        self.close(10.0, 10.0)


if __name__ == "__main__":
    main()
