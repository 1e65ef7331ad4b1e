"""``runwatch serve``: the HTTP ingest server for multi-process and multi-node runs.

- ``app``: the FastAPI app (``/api/v1``, OpenAPI at ``/openapi.json``), auth and limits.
- ``schemas``: the wire format (columnar batches, with ``client_id`` and ``seq``).
- ``body``: reading bodies (size limits, gzip, JSON/NDJSON) and validating them in one pass.
- ``ingest``: the single writer thread (grouped transactions, dedup, live detection).
- ``cli``: the ``serve`` command.

The client is ``runwatch.hook.transport.HttpBackend``.
"""

from typing import Any

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str) -> Any:
    # The app needs the server extra (FastAPI): imported when asked for, so that the CLI,
    # which imports ``runwatch.server.cli`` for every command, loads without it.
    if name in __all__:
        from runwatch.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'runwatch.server' has no attribute {name!r}")
