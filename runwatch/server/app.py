"""The ASGI app of ``runwatch serve``: ``/api/v1`` on FastAPI, the OpenAPI document at
``/openapi.json``.

Writes go through one :class:`IngestWriter` (one SQLite connection, grouped transactions);
reads use a second, read-only connection, so a dashboard polling the API never waits behind a
large write (WAL). Handlers only validate and enqueue; a batch is acknowledged once durable.

Alerting: ``ServerSettings.on_change(run_id)`` returns the callback that gets every anomaly
episode change of that run from live detection, and ``ServerSettings.metrics_app`` (an ASGI
app: ``runwatch serve`` mounts the store's exporter) is served at ``/metrics`` without auth,
as Prometheus scrapes expect.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPBearer
from pydantic import TypeAdapter
from starlette.routing import Route

from runwatch.expect.reference import ReferenceCurve
from runwatch.model import json_plain
from runwatch.pipeline.analysis import reference_curves
from runwatch.pipeline.family import family_references
from runwatch.server import schemas as S
from runwatch.server.auth import RateLimit, TokenCheck
from runwatch.server.body import parse_many, read_body, read_model
from runwatch.server.errors import ApiError, install_handlers, responses
from runwatch.server.ingest import IngestWriter, OnChangeFactory
from runwatch.store import RunExistsError, Store
from runwatch.store.ingest import RUN_SUMMARY_KEYS

# Module level: FastAPI resolves the (string) annotations of dependencies in module globals.
bearer = HTTPBearer(auto_error=False, description="the token given to `runwatch serve`")
RunId = Annotated[int, Path(ge=1, le=2**62, description="the run id from POST /api/v1/runs")]


@dataclass
class ServerSettings:
    """Everything ``runwatch serve`` decides once, at start."""

    db: str
    token: str | None
    max_body_bytes: int = 32 * 2**20
    max_inflated_bytes: int = 256 * 2**20
    rate_per_s: float = 5000.0
    rate_burst: float = 10000.0
    detect: bool = True
    detect_config: Mapping[str, str] | None = None
    on_change: OnChangeFactory | None = None
    metrics_app: Any = None
    join_window_s: float = 120.0


class _Service:
    """The stores, the writer and the checks. Opened on startup, closed on shutdown, and
    reopened if a request arrives after a shutdown (test clients run the lifespan per call)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.check_token = TokenCheck(settings.token)
        self.rate = RateLimit(settings.rate_per_s, settings.rate_burst)
        self._lock = threading.Lock()
        self.open()

    def open(self) -> None:
        with self._lock:
            if getattr(self, "writer", None) is not None:
                return
            settings = self.settings
            self.store = Store(settings.db)
            self.reader = Store(settings.db, readonly=True)
            self.writer: IngestWriter | None = IngestWriter(
                self.store,
                detect=settings.detect,
                detect_config=settings.detect_config,
                on_change=settings.on_change,
            )
            self.writer.start()

    @property
    def ingest(self) -> IngestWriter:
        self.open()
        assert self.writer is not None
        return self.writer

    def close(self) -> None:
        with self._lock:
            if self.writer is None:
                return
            self.writer.close()
            self.writer = None
            self.store.close()
            self.reader.close()


def _body_doc(model: type[Any], ndjson: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
    }
    return {"requestBody": {"required": True, "content": content}}


def create_app(settings: ServerSettings) -> FastAPI:
    """Build the app (opening the store now, so the first request finds it ready)."""
    svc = _Service(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        svc.open()
        yield
        await run_in_threadpool(svc.close)

    app = FastAPI(
        title="runwatch ingest API",
        version="1",
        description="Push training-run points and events to `runwatch serve`. Batches are "
        "columnar JSON (one object per series, parallel arrays); NDJSON (one batch per line, "
        "`Content-Type: application/x-ndjson`) and `Content-Encoding: gzip` are accepted.",
        lifespan=lifespan,
    )
    app.state.service = svc
    install_handlers(app)

    async def guard(request: Request, _: Annotated[Any, Depends(bearer)]) -> None:
        svc.open()
        svc.rate(request.client.host if request.client else "unknown")
        svc.check_token(request.headers.get("authorization"))

    auth = [Depends(guard)]
    limits = (settings.max_body_bytes, settings.max_inflated_bytes)
    body_errors = responses(400, 401, 413, 415, 422, 429)

    @app.get("/api/v1/health", response_model=S.Health, tags=["server"])
    async def health() -> dict[str, Any]:
        """Liveness: the server answers and how many points wait to be written."""
        return {"status": "ok", "queued_points": svc.ingest.queued_points}

    @app.post(
        "/api/v1/runs",
        response_model=S.RunStarted,
        dependencies=auth,
        tags=["runs"],
        openapi_extra=_body_doc(S.RunStart),
        responses={**body_errors, **responses(404, 409)},
    )
    async def start_run(request: Request) -> dict[str, Any]:
        """Create, join or resume a run. Every rank of one launch (same ``launch_id``) gets
        the same attempt; a new launch of a known run is a new attempt (a restart)."""
        body = await read_model(request, S.RunStart, *limits)

        def join() -> dict[str, Any]:
            # Reference mode fails before the run is created, as in-process.
            references = _references(svc, body.reference, body.name) if body.reference else None
            if body.family:
                references = _families(svc, body.family, body.name, body.config)
            try:
                run_id, attempt, how = svc.store.join_run(
                    body.name,
                    project=body.project,
                    config=body.config,
                    resume=body.resume,
                    launch_id=body.launch_id,
                    world_size=body.world_size,
                    join_window_s=settings.join_window_s,
                )
            except RunExistsError as exc:
                raise ApiError(409, "run exists", "resume", str(exc)) from None
            if references:
                svc.ingest.use_references(run_id, references)
            seq = (
                svc.store.client_seqs([body.client_id]).get(body.client_id, -1)
                if body.client_id
                else -1
            )
            return {"run_id": run_id, "attempt": attempt, "how": how, "next_seq": seq + 1}

        return await run_in_threadpool(join)

    @app.post(
        "/api/v1/runs/{run_id}/batches",
        response_model=S.BatchReply,
        dependencies=auth,
        tags=["ingest"],
        openapi_extra=_body_doc(S.Batch),
        responses={**body_errors, **responses(404, 409, 503)},
    )
    async def post_batches(run_id: RunId, request: Request) -> dict[str, int]:
        """Store batches of points and events, all or nothing, once each (by client id and
        sequence number). Answered when the batches are durable."""
        raw, ndjson = await read_body(request, *limits)
        batches = parse_many(S.BATCH, raw, ndjson)
        return await asyncio.wrap_future(svc.ingest.submit(run_id, batches))

    @app.post(
        "/api/v1/runs/{run_id}/attempts",
        response_model=S.AttemptOut,
        dependencies=auth,
        tags=["runs"],
        openapi_extra=_body_doc(S.AttemptIn),
        responses={**body_errors, **responses(404)},
    )
    async def new_attempt(run_id: RunId, request: Request) -> dict[str, Any]:
        """A rank's step went back within a launch: the first rank to ask makes the next
        attempt (and the restart event); the others get the same one."""
        body = await read_model(request, S.AttemptIn, *limits)
        if await run_in_threadpool(svc.reader.run_status, run_id) is None:
            raise ApiError(404, "no such run", "run_id", f"run {run_id} does not exist")
        attempt, created = await run_in_threadpool(
            svc.store.advance_attempt, run_id, body.from_attempt, body.step, body.message
        )
        return {"attempt": attempt, "created": created}

    @app.post(
        "/api/v1/runs/{run_id}/finish",
        response_model=S.FinishOut,
        dependencies=auth,
        tags=["runs"],
        openapi_extra=_body_doc(S.FinishIn),
        responses={**body_errors, **responses(404)},
    )
    async def finish(run_id: RunId, request: Request) -> dict[str, Any]:
        """A rank finished: record its finish event and drop counts; the run's status becomes
        ``status`` (a crash reported by any rank is kept over a later ``finished``)."""
        body = await read_model(request, S.FinishIn, *limits)
        status = await run_in_threadpool(_finish, svc, run_id, body)
        if body.rank in (None, 0):
            await run_in_threadpool(svc.ingest.close_detection, run_id)
        return {"run_id": run_id, "status": status}

    @app.get(
        "/api/v1/runs",
        response_model=list[S.RunOut],
        dependencies=auth,
        tags=["read"],
        responses=responses(401, 429),
    )
    def list_runs() -> list[dict[str, Any]]:
        """Every run in the store."""
        return [_run_out(r) for r in svc.reader.runs().to_dict(orient="records")]

    @app.get(
        "/api/v1/runs/{run_id}",
        response_model=S.RunOut,
        dependencies=auth,
        tags=["read"],
        responses=responses(401, 404, 422, 429),
    )
    def get_run(run_id: RunId) -> dict[str, Any]:
        return _run_row(svc, run_id)

    @app.get(
        "/api/v1/runs/{run_id}/series",
        response_model=list[S.SeriesOut],
        dependencies=auth,
        tags=["read"],
        responses=responses(401, 404, 422, 429),
    )
    def list_series(run_id: RunId) -> list[dict[str, Any]]:
        """The run's series (metric and labels) and how many points each holds."""
        _run_row(svc, run_id)
        frame = svc.reader.series(run_id)
        out = []
        for rec in frame.to_dict(orient="records"):
            labels = {
                k: json_plain(rec[k])
                for k in ("rank", "host", "gpu")
                if json_plain(rec[k]) is not None
            }
            out.append(
                {
                    "series_id": int(rec["series_id"]),
                    "metric": rec["metric"],
                    "labels": labels,
                    "points": int(rec["points"]),
                }
            )
        return out

    @app.get(
        "/api/v1/runs/{run_id}/points",
        response_model=S.PointsOut,
        dependencies=auth,
        tags=["read"],
        responses=responses(401, 404, 422, 429),
    )
    def read_points(
        run_id: RunId,
        metric: Annotated[str, Query(min_length=1, max_length=200)],
        rank: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
        host: Annotated[str | None, Query(max_length=255)] = None,
        gpu: Annotated[str | None, Query(max_length=128)] = None,
        start: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        end: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    ) -> dict[str, Any]:
        """One series' live points (the latest attempt wins), in step order."""
        _run_row(svc, run_id)
        labels: dict[str, Any] = {"rank": rank, "host": host}
        if gpu is not None:
            labels["gpu"] = int(gpu) if gpu.isdigit() and len(gpu) < 10 else gpu
        frame = svc.reader.read_series(run_id, metric, labels, start=start, end=end)
        return {
            "metric": metric,
            "labels": {k: v for k, v in labels.items() if v is not None},
            "steps": frame["step"].astype(int).tolist(),
            "times": [None if math.isnan(t) else t for t in frame["time"].tolist()],
            "values": [_json_float(v) for v in frame["value"].tolist()],
            "attempts": frame["attempt"].astype(int).tolist(),
        }

    if settings.metrics_app is not None:
        # A route, not a mount: a mount would answer /metrics with a redirect to /metrics/.
        app.router.routes.append(
            Route("/metrics", endpoint=_AsgiEndpoint(settings.metrics_app), include_in_schema=False)
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in S.BODY_MODELS:
                schema = TypeAdapter(model).json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _references(svc: _Service, reference: str, run: str) -> dict[str, ReferenceCurve]:
    """The loss curves of ``reference`` in the server's store, for ``run``'s detection; an
    error naming the field when the run is unknown (404), or it cannot serve or the server
    runs no detection (409)."""
    if not svc.ingest.detects:
        raise ApiError(409, "no reference mode", "reference", "this server runs no live detection")
    try:
        return reference_curves(svc.store, reference, run, svc.settings.detect_config)
    except LookupError as exc:  # an unknown run
        raise ApiError(404, "no such run", "reference", str(exc).strip("'\"")) from None
    except ValueError as exc:  # itself, or no loss curve of the run
        raise ApiError(409, "no reference mode", "reference", str(exc)) from None


def _families(
    svc: _Service, family: list[str], run: str, config: dict[str, Any]
) -> dict[str, ReferenceCurve]:
    """Family mode: the loss curves ``family`` predicts for ``run`` (of ``config``), from
    the server's store; errors as for a reference, naming the field ``family``."""
    if not svc.ingest.detects:
        raise ApiError(409, "no family mode", "family", "this server runs no live detection")
    try:
        return family_references(svc.store, family, run, config, svc.settings.detect_config)
    except LookupError as exc:  # an unknown run
        raise ApiError(404, "no such run", "family", str(exc).strip("'\"")) from None
    except ValueError as exc:  # itself, no params, no loss curve of the family
        raise ApiError(409, "no family mode", "family", str(exc)) from None


def _finish(svc: _Service, run_id: int, body: S.FinishIn) -> str:
    """One transaction, cheap even for a run of millions of points (256 ranks finish at once)."""
    from runwatch.model import Event

    store = svc.store
    with store.transaction():
        current = store.run_status(run_id)
        if current is None:
            raise ApiError(404, "no such run", "run_id", f"run {run_id} does not exist")
        event = Event("finish", body.last_step, time.time(), body.status, body.rank, body.host)
        store.add_events(run_id, body.attempt, [event])
        store.record_drops(run_id, body.drops)
        if body.rank in (None, 0):
            store.seal_open_blocks(run_id)
        if current == "crashed" and body.status == "finished":
            return current
        store.set_run_status(run_id, body.status)
        return body.status


def _run_row(svc: _Service, run_id: int) -> dict[str, Any]:
    row = svc.reader.run_summary(run_id)
    if row is None:
        raise ApiError(404, "no such run", "run_id", f"run {run_id} does not exist")
    return _run_out(row)


def _run_out(rec: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: json_plain(rec[k]) for k in RUN_SUMMARY_KEYS}
    for k in ("run_id", "attempts", "series", "points"):
        out[k] = int(out[k] or 0)
    if out["last_step"] is not None:
        out["last_step"] = int(out["last_step"])
    return out


def _json_float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


class _AsgiEndpoint:
    """Wraps a plain ASGI callable so Starlette's Route calls it as an app, not a handler."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)
