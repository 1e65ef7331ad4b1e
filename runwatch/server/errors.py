"""Errors as JSON that name the field, for every status the API can answer.

A client (or a person with curl) should learn from one reply what to fix: ``{"error":
"invalid body", "field": "series[2].values[7]", "detail": "Input should be a valid number"}``.
FastAPI's own validation and HTTP errors are mapped to the same shape, and every route
documents the statuses it can return, so the OpenAPI document stays true (schemathesis checks).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from runwatch.server.schemas import ErrorOut
from runwatch.store.errors import StoreUnavailableError

log = logging.getLogger("runwatch.server")


class ApiError(Exception):
    """A refusal: HTTP status, a short error, the field at fault and a detail."""

    def __init__(
        self,
        status: int,
        error: str,
        field: str | None = None,
        detail: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {field}: {detail}")
        self.status = status
        self.error = error
        self.field = field
        self.detail = detail
        self.headers = headers


def field_path(loc: Sequence[Any]) -> str:
    """``("series", 2, "values", 7)`` -> ``series[2].values[7]``.

    >>> field_path(("series", 2, "values", 7))
    'series[2].values[7]'
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("body",) and not out:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def from_pydantic(errors: Iterable[dict[str, Any]], prefix: str = "") -> ApiError:
    """The first validation error, as a 400 (malformed JSON) or 422 (a field is wrong)."""
    first = next(iter(errors))
    if first.get("type") == "json_invalid":
        where = prefix
        return ApiError(400, "malformed JSON body", "body", f"{where}{first.get('msg', '')}")
    # Drop pydantic's union branch names ("function-after[...]") from the location.
    loc = [p for p in first.get("loc", ()) if not _branch_tag(p)]
    return ApiError(422, "invalid body", f"{prefix}{field_path(loc)}", str(first.get("msg", "")))


_TAGS = frozenset({"int", "float", "str", "bool", "none", "list", "dict"})


def _branch_tag(part: object) -> bool:
    """pydantic names union branches in error locations (``constrained-int``); no field of
    ours has a ``-`` or ``[`` in its name or is called like a type."""
    return isinstance(part, str) and ("[" in part or "-" in part or part in _TAGS)


def json_error(exc: ApiError) -> JSONResponse:
    body = ErrorOut(error=exc.error, field=exc.field, detail=exc.detail).model_dump()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def install_handlers(app: FastAPI) -> None:
    """Map every error to the JSON shape above (and log 5xx, which are our bugs)."""

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return json_error(exc)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        loc = list(first.get("loc", ()))
        where = loc[0] if loc and loc[0] in ("path", "query", "header") else None
        field = field_path(loc[1:] if where else loc)
        return json_error(
            ApiError(422, f"invalid {where or 'request'}", field, str(first.get("msg", "")))
        )

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # GET and POST of one path are two routes: list both
            headers["Allow"] = ", ".join(sorted(_allowed(app, request)))
        return json_error(ApiError(exc.status_code, str(exc.detail), None, "", headers))

    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "runwatch serve: internal error on %s %s",
            request.method,
            request.url.path,
            exc_info=exc,
        )
        return json_error(ApiError(500, "internal error", None, type(exc).__name__))

    async def store_unavailable(_: Request, exc: Exception) -> JSONResponse:
        # The database is down or restarting: the client keeps the batch and retries.
        log.warning("runwatch serve: the store is unavailable: %s", exc)
        return json_error(ApiError(503, "store unavailable", None, str(exc), {"Retry-After": "1"}))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(StoreUnavailableError, store_unavailable)
    app.add_exception_handler(Exception, internal_error)


def _allowed(app: FastAPI, request: Request) -> set[str]:
    methods: set[str] = set()
    for route in app.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return methods


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the error statuses a route can return."""
    text = {
        400: "malformed JSON body",
        401: "missing or wrong bearer token",
        404: "no such run (the run, or the reference run named)",
        409: "conflict: the run exists (resume=false), the attempt is unknown, or reference "
        "mode cannot be served (no live detection, or no loss curve of the run)",
        413: "body too large (compressed or decompressed)",
        415: "unsupported Content-Type or Content-Encoding",
        422: "a field is invalid (the reply names it)",
        429: "rate limit exceeded; retry after Retry-After seconds",
        503: "the server is behind; retry after Retry-After seconds",
    }
    return {s: {"description": text[s], "model": ErrorOut} for s in statuses}
