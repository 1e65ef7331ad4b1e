"""Property-based fuzz of the API from its own OpenAPI document (schemathesis, in-process).

Every generated request, valid or not, must get a documented status with a body matching the
documented schema, and no 5xx; requests that break the schema must be refused.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from runwatch.server.app import ServerSettings, create_app

from .conftest import TOKEN

_DB = Path(tempfile.mkdtemp(prefix="runwatch-fuzz-")) / "fuzz.db"
schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_app(ServerSettings(db=str(_DB), token=TOKEN, detect=False))
)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case):
    excluded = []
    if case.path.endswith("/batches"):
        # A series' steps, times and values must have equal lengths: JSON Schema cannot say
        # that, so a "schema-valid" batch with unequal arrays is rightly refused (422).
        excluded.append(positive_data_acceptance)
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, excluded_checks=excluded)
