"""The HTTP backend: the writer thread's batches to ``runwatch serve``, nothing lost on the way.

- Each batch is one compact JSON line (one object per series with parallel arrays), stamped
  with this client's id and the next sequence number, gzipped and POSTed on a keep-alive
  connection. The server stores a batch only if its sequence number is above the highest it
  stored for the client, so a retry after a timeout (stored? unknown) can never duplicate.
- When the server cannot be reached (refused, timed out, 5xx, 429), the line is appended to a
  local spill file instead, and every later batch goes behind it, so order is kept. Each
  ``write`` first replays the spill, oldest first, in NDJSON requests, once the backoff allows a
  new try (up to ``max_backoff_s``), so a dead server costs the writer one cheap append per
  flush, not a timeout.
- The spill is bounded (``spill_limit_bytes``). Once full, new batches are dropped and raised as
  ``BackendError(reason="spill_full")``, which the writer counts; this module also logs how many
  points and batches were dropped, and how long the server has been unreachable.
- A body the server refuses (4xx other than 429) is a bug, not an outage: retrying cannot help,
  so it is dropped and counted as ``rejected``, with the server's reason (which names the field).

The token is sent only in the ``Authorization`` header; it is never logged, put in an error, or
shown by ``repr``. One backend is used by one writer thread (see ``runwatch.hook.backend``).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runwatch.hook.backend import Backend, BackendError, ReferenceRefused
from runwatch.hook.ranks import launch_id as env_launch_id
from runwatch.hook.ranks import rank_info
from runwatch.model import LABEL_KEYS, Event, SeriesBatch
from runwatch.store import RunExistsError
from runwatch.store.context import StepContext

if TYPE_CHECKING:
    # Imported by the methods that use it: only a run that sends to a server pays for
    # httpx (and the CLI packages it loads), not every `import runwatch`.
    import httpx

log = logging.getLogger("runwatch.hook.transport")

_TRANSIENT = frozenset({408, 425, 429, 500, 502, 503, 504})
_REPLAY_BYTES = 4 * 2**20
_REPLAY_LINES = 512


class _Spill:
    """An append-only NDJSON file of batches not yet delivered, read back from the front."""

    def __init__(self, path: Path, limit_bytes: int) -> None:
        self.path = path
        self.limit = limit_bytes
        self._file: Any = None
        self._read_pos = 0
        self._entries: deque[tuple[int, int]] = deque()  # (bytes incl. newline, points)
        self.bytes = 0
        self.points = 0

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, line: bytes, points: int) -> bool:
        """Add one line; False (nothing written) if it would pass the limit."""
        size = len(line) + 1
        if self.bytes + size > self.limit:
            return False
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a+b")  # noqa: SIM115 -- kept open for the run
        self._file.seek(0, os.SEEK_END)
        self._file.write(line + b"\n")
        self._file.flush()
        self._entries.append((size, points))
        self.bytes += size
        self.points += points
        return True

    def peek(self) -> tuple[list[bytes], int]:
        """The oldest lines (up to a request's worth) and their point count."""
        total, n, points = 0, 0, 0
        for size, pts in self._entries:
            if n and (total + size > _REPLAY_BYTES or n >= _REPLAY_LINES):
                break
            total, n, points = total + size, n + 1, points + pts
        self._file.seek(self._read_pos)
        data = self._file.read(total)
        return data.split(b"\n")[:n], points

    def pop(self, n: int) -> None:
        for _ in range(n):
            size, points = self._entries.popleft()
            self._read_pos += size
            self.bytes -= size
            self.points -= points
        if not self._entries:  # all delivered: start the file again
            self._file.truncate(0)
            self._read_pos = 0

    def close(self, delete: bool) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if delete:
            self.path.unlink(missing_ok=True)


class HttpBackend:
    """A :class:`~runwatch.hook.backend.Backend` that pushes to ``runwatch serve``."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None,
        *,
        client_id: str | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        spill_limit_bytes: int = 256 * 2**20,
        launch_id: str | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        host: str | None = None,
        timeout_s: float = 10.0,
        start_timeout_s: float = 30.0,
        finish_drain_s: float = 30.0,
        max_backoff_s: float = 5.0,
        gzip_level: int = 1,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import httpx

        self.servers = server_urls(url)
        self.location = self.servers[0]
        self.client_id = client_id or f"c-{uuid.uuid4().hex}"
        self._launch = launch_id
        self._world_size = world_size
        self._rank = rank
        self._host = host
        self._start_timeout = start_timeout_s
        self._finish_drain = finish_drain_s
        self._max_backoff = max_backoff_s
        self._gzip_level = gzip_level
        self._clock = clock
        headers = {"User-Agent": "runwatch-hook/1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.location,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0)),
            transport=transport,
        )
        spill_root = (
            Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "runwatch-spill"
        )
        self.spill = _Spill(spill_root / f"{self.client_id}.ndjson", spill_limit_bytes)
        self.run_id: int | None = None
        self._seq = 0
        self._next_try = 0.0
        self._backoff = 0.0
        self._down_since: float | None = None
        self._alias: dict[int, int] = {}  # attempt guessed while down -> the server's
        self.dropped: dict[str, int] = {}  # points, by reason (including those raised)
        self._dropped_batches = 0
        self._last_drop_log = -1e9

    def __repr__(self) -> str:
        return f"HttpBackend({self.location!r}, client_id={self.client_id!r})"

    # -- the Backend protocol ---------------------------------------------------------------
    def start_run(
        self,
        name: str,
        project: str | None,
        config: Mapping[str, Any],
        resume: bool | None,
        reference: str | None = None,
        family: list[str] | None = None,
    ) -> tuple[int, int]:
        import httpx

        body = {
            "name": name,
            "project": project,
            "config": json.loads(json.dumps(dict(config), default=str)),
            "resume": resume,
            "client_id": self.client_id,
            "launch_id": self._launch,
            "world_size": self._world_size,
            "rank": self._rank,
            "host": self._host,
        }
        if reference is not None:  # sent only when asked for: older servers refuse the field
            body["reference"] = reference
        if family:
            body["family"] = list(family)
        deadline = self._clock() + self._start_timeout
        delay = 0.2
        while True:
            try:
                reply = self._http.post("/api/v1/runs", json=body)
                if reply.status_code == 200:
                    data = reply.json()
                    self.run_id = int(data["run_id"])
                    self._seq = max(self._seq, int(data["next_seq"]))
                    self._current_attempt = int(data["attempt"])
                    log.info(
                        "runwatch: run %r on %s: run %d attempt %d (%s)",
                        name,
                        self.location,
                        self.run_id,
                        data["attempt"],
                        data["how"],
                    )
                    return self.run_id, int(data["attempt"])
                if _field(reply) in ("reference", "family") and (reference or family):
                    raise ReferenceRefused(f"{self.location}: {_reason(reply)}")
                if reply.status_code == 409:
                    raise RunExistsError(f"{self.location}: {_reason(reply)}")
                if reply.status_code not in _TRANSIENT:
                    raise BackendError(
                        f"{self.location} refused the run: {_reason(reply)}",
                        reason="rejected",
                        retry=False,
                    )
                problem = _reason(reply)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            self._fail_over(problem)
            if self._clock() + delay > deadline:
                raise BackendError(
                    f"cannot reach {', '.join(self.servers)} to start the run: {problem}",
                    reason="server_down",
                    retry=False,
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def write(
        self,
        attempt: int,
        batch: SeriesBatch,
        events: list[Event],
        contexts: Sequence[StepContext] = (),
    ) -> None:
        line, points = self._encode(attempt, batch, events, contexts)
        if len(self.spill):
            self._replay()
        if not len(self.spill) and self._may_try():
            status = self._post([line], points)
            if status == "ok":
                return
            if status == "rejected":
                self._count("rejected", points)
                raise BackendError(
                    f"{self.location} refused a batch: {self._last_error}",
                    reason="rejected",
                    retry=False,
                )
        if not self.spill.append(line, points):
            self._spill_full(points)

    def begin_attempt(self, step: int, message: str) -> int:
        import httpx

        current = self._current_attempt
        if not len(self.spill) and self._may_try():
            try:
                reply = self._http.post(
                    f"/api/v1/runs/{self.run_id}/attempts",
                    json={"from_attempt": current, "step": step, "message": message},
                )
                if reply.status_code == 200:
                    self._current_attempt = int(reply.json()["attempt"])
                    return self._current_attempt
                problem = _reason(reply)
            except httpx.TransportError as exc:
                problem = str(exc)
            self._failed(problem)
        # Down: guess the next number, and ask the server when the spill is replayed.
        guess = current + 1
        control = json.dumps(
            {
                "_attempt": {
                    "from_attempt": current,
                    "guess": guess,
                    "step": step,
                    "message": message,
                }
            }
        ).encode()
        if not self.spill.append(control, 0):
            log.warning("runwatch: spill full; the restart at step %d is not recorded", step)
        self._current_attempt = guess
        return guess

    _current_attempt = 1

    def finish(
        self, attempt: int | None, last_step: int | None, status: str, drops: Mapping[str, int]
    ) -> None:
        import httpx

        deadline = self._clock() + self._finish_drain
        while len(self.spill) and self._clock() < deadline:
            self._next_try = min(self._next_try, self._clock())
            self._replay()
            if len(self.spill):
                time.sleep(min(0.5, max(0.0, deadline - self._clock())))
        left = len(self.spill)
        try:
            merged = dict(drops)
            for reason, n in self.dropped.items():  # replay-time drops the writer never saw
                if reason.startswith("replay_"):
                    merged[reason] = merged.get(reason, 0) + n
            if not left:
                reply = self._http.post(
                    f"/api/v1/runs/{self.run_id}/finish",
                    json={
                        "attempt": attempt,
                        "last_step": last_step,
                        "status": status,
                        "drops": merged,
                        "rank": self._rank,
                        "host": self._host,
                    },
                )
                if reply.status_code != 200:
                    log.warning(
                        "runwatch: %s did not record the end of the run: %s",
                        self.location,
                        _reason(reply),
                    )
        except httpx.TransportError as exc:
            log.warning(
                "runwatch: cannot reach %s to record the end of the run: %s", self.location, exc
            )
        finally:
            if left:
                log.warning(
                    "runwatch: %s unreachable at finish: %d batches (%d points) were not "
                    "delivered; they are kept in %s",
                    self.location,
                    left,
                    self.spill.points,
                    self.spill.path,
                )
            if self._dropped_batches:
                log.warning("runwatch: %s", self._drop_summary())
            self.spill.close(delete=not left)
            self._http.close()

    # -- sending and spilling ----------------------------------------------------------------
    def _encode(
        self,
        attempt: int,
        batch: SeriesBatch,
        events: list[Event],
        contexts: Sequence[StepContext] = (),
    ) -> tuple[bytes, int]:
        series, points = [], 0
        for sp in batch:
            series.append(
                {
                    "metric": sp.metric,
                    "labels": _wire_labels(sp.labels),
                    "steps": sp.steps.tolist(),
                    "times": sp.times.tolist(),
                    "values": sp.values.tolist(),
                }
            )
            points += len(sp.steps)
        body = {
            "client_id": self.client_id,
            "seq": self._seq,
            "attempt": attempt,
            "series": series,
            "events": [_wire_event(e) for e in events],
        }
        if contexts:  # sent only when there are some: older servers refuse the field
            body["contexts"] = [
                {"step": c.step, "rank": c.rank, "time": c.time, "context": dict(c.context)}
                for c in contexts
            ]
        self._seq += 1
        self._current_attempt = attempt
        return json.dumps(body, separators=(",", ":"), default=str).encode(), points

    def _may_try(self) -> bool:
        return self._clock() >= self._next_try

    _last_error = ""

    def _post(self, lines: list[bytes], points: int) -> str:
        """One request: ``ok``, ``down`` (try later) or ``rejected`` (never)."""
        import httpx

        body = lines[0] if len(lines) == 1 else b"\n".join(lines)
        ctype = "application/json" if len(lines) == 1 else "application/x-ndjson"
        try:
            reply = self._http.post(
                f"/api/v1/runs/{self.run_id}/batches",
                content=gzip.compress(body, self._gzip_level, mtime=0),
                headers={"Content-Type": ctype, "Content-Encoding": "gzip"},
            )
        except httpx.TransportError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return "down"
        if reply.status_code == 200:
            if self._down_since is not None:
                log.warning(
                    "runwatch: %s is reachable again after %.0f s",
                    self.location,
                    self._clock() - self._down_since,
                )
            self._down_since, self._backoff, self._next_try = None, 0.0, 0.0
            return "ok"
        self._last_error = _reason(reply)
        if reply.status_code in _TRANSIENT:
            self._failed(self._last_error, reply.headers.get("retry-after"))
            return "down"
        log.error("runwatch: %s refused %d points: %s", self.location, points, self._last_error)
        return "rejected"

    def _failed(self, problem: str, retry_after: str | None = None) -> None:
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            log.warning(
                "runwatch: cannot deliver to %s (%s); spilling to %s and retrying",
                self.location,
                problem,
                self.spill.path,
            )
        self._backoff = min(self._max_backoff, max(0.1, self._backoff * 2))
        wait = float(retry_after) if retry_after and retry_after.isdigit() else self._backoff
        self._next_try = now + wait
        if self._fail_over(problem):
            self._next_try = now  # another server may take it at once

    def _fail_over(self, problem: str) -> bool:
        """Send to the next of several servers (one database behind them all: a batch
        retried through another is still stored once); False when there is only one."""
        if len(self.servers) < 2:
            return False
        at = self.servers.index(self.location)
        self.location = self.servers[(at + 1) % len(self.servers)]
        self._http.base_url = self.location
        log.info("runwatch: %s; trying %s", problem, self.location)
        return True

    def _replay(self) -> None:
        """Send the spill, oldest first, while the server takes it."""
        while len(self.spill) and self._may_try():
            lines, points = self.spill.peek()
            if lines[0].startswith(b'{"_attempt"'):
                if not self._replay_attempt(lines[0]):
                    return
                self.spill.pop(1)
                continue
            batch_lines = []
            for line in lines:
                if line.startswith(b'{"_attempt"'):
                    break
                batch_lines.append(self._realias(line))
            status = self._post(batch_lines, points)
            if status == "down":
                return
            if status == "rejected" and not self._replay_one_by_one(batch_lines):
                return
            self.spill.pop(len(batch_lines))

    def _replay_one_by_one(self, lines: list[bytes]) -> bool:
        """One bad line refuses its whole request: send the lines alone, drop the bad one.
        False if the server went away meanwhile (resending is safe: seq dedup)."""
        for line in lines:
            points = sum(len(s["steps"]) for s in json.loads(line)["series"])
            status = self._post([line], points)
            if status == "down":
                return False
            if status == "rejected":
                self._count("replay_rejected", points)
        return True

    def _replay_attempt(self, line: bytes) -> bool:
        import httpx

        spec = json.loads(line)["_attempt"]
        try:
            reply = self._http.post(
                f"/api/v1/runs/{self.run_id}/attempts",
                json={
                    "from_attempt": self._alias.get(spec["from_attempt"], spec["from_attempt"]),
                    "step": spec["step"],
                    "message": spec["message"],
                },
            )
        except httpx.TransportError as exc:
            self._failed(str(exc))
            return False
        if reply.status_code != 200:
            self._failed(_reason(reply))
            return False
        real = int(reply.json()["attempt"])
        if real != spec["guess"]:
            self._alias[spec["guess"]] = real
        return True

    def _realias(self, line: bytes) -> bytes:
        if not self._alias:
            return line
        data = json.loads(line)
        if data["attempt"] not in self._alias:
            return line
        data["attempt"] = self._alias[data["attempt"]]
        return json.dumps(data, separators=(",", ":")).encode()

    def _spill_full(self, points: int) -> None:
        self._count("spill_full", points)
        self._dropped_batches += 1
        now = self._clock()
        if now - self._last_drop_log >= 30.0:
            self._last_drop_log = now
            log.warning("runwatch: %s", self._drop_summary())
        raise BackendError(
            f"{self.location} unreachable and the spill file is full ({self.spill.limit} bytes)",
            reason="spill_full",
            retry=False,
        )

    def _drop_summary(self) -> str:
        down = "" if self._down_since is None else f" for {self._clock() - self._down_since:.0f} s"
        return (
            f"server {self.location} unreachable{down}; spill file {self.spill.path} full "
            f"({self.spill.limit} bytes): dropped {self.dropped.get('spill_full', 0)} points "
            f"in {self._dropped_batches} batches (spill_full)"
        )

    def _count(self, reason: str, points: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + points


def _wire_labels(labels: Mapping[str, Any]) -> dict[str, Any]:
    """Only the label keys the data model has (rank, host, gpu); None values left out."""
    return {k: labels[k] for k in LABEL_KEYS if labels.get(k) is not None}


def _wire_event(event: Event) -> dict[str, Any]:
    return {
        "kind": event.kind,
        "step": event.step,
        "time": event.time,
        "message": event.message,
        "rank": event.rank,
        "host": event.host,
        "attrs": json.loads(json.dumps(event.attrs, default=str)),
    }


def _field(reply: httpx.Response) -> str | None:
    """The field an error reply names (``runwatch.server.errors``), if any."""
    try:
        return reply.json().get("field")
    except (ValueError, AttributeError):
        return None


def _reason(reply: httpx.Response) -> str:
    try:
        data = reply.json()
        where = f" ({data['field']})" if data.get("field") else ""
        return f"HTTP {reply.status_code} {data.get('error', '')}{where}: {data.get('detail', '')}"
    except (ValueError, KeyError, AttributeError):
        return f"HTTP {reply.status_code}"


def server_urls(url: str | Sequence[str]) -> list[str]:
    """The server URLs of ``url=``: one, a list, or a comma-separated string.

    >>> server_urls("http://a:8765/, http://b:8765")
    ['http://a:8765', 'http://b:8765']
    """
    parts = url.split(",") if isinstance(url, str) else list(url)
    servers = [str(p).strip().rstrip("/") for p in parts if str(p).strip()]
    if not servers:
        raise ValueError(f"url={url!r} names no server; valid: 'http://host:port' or a list")
    bad = [u for u in servers if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"server URL {bad[0]!r} is invalid; valid: http://host:port")
    return servers


def make_backend_from_env(
    url: str | Sequence[str] | None,
    token: str | None,
    env: Mapping[str, str] = os.environ,
    **options: Any,
) -> Backend | None:
    """The HTTP backend for ``runwatch.init(url=..., token=...)`` or ``$RUNWATCH_URL`` /
    ``$RUNWATCH_TOKEN`` (or ``$RUNWATCH_TOKEN_FILE``); None when no URL is given.

    Rank, world size, host and the launch id (shared by every rank of one job start) come from
    the launcher's environment (``runwatch.hook.ranks``); ``$RUNWATCH_SPILL_DIR`` sets where
    undelivered batches wait.
    """
    url = url or env.get("RUNWATCH_URL")
    if not url:
        return None
    if token is None:
        token = env.get("RUNWATCH_TOKEN")
        if not token and env.get("RUNWATCH_TOKEN_FILE"):
            token = Path(env["RUNWATCH_TOKEN_FILE"]).read_text().strip()
    info = rank_info(env)
    options.setdefault("spill_dir", env.get("RUNWATCH_SPILL_DIR") or None)
    return HttpBackend(
        url,
        token,
        launch_id=env_launch_id(env),
        world_size=info.world_size,
        rank=info.rank,
        host=info.host,
        **options,
    )
