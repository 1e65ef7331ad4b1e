"""``runwatch serve``: the HTTP ingest server for multi-process and multi-node runs.

- ``app``: the FastAPI app (``/api/v1``, OpenAPI at ``/openapi.json``), auth and limits.
- ``schemas``: the wire format (columnar batches, with ``client_id`` and ``seq``).
- ``body``: reading bodies (size limits, gzip, JSON/NDJSON) and validating them in one pass.
- ``ingest``: the single writer thread (grouped transactions, dedup, live detection).
- ``cli``: the ``serve`` command.

The client is ``runwatch.hook.transport.HttpBackend``.
"""

from runwatch.server.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
