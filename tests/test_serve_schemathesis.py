"""The API fuzzed from its own OpenAPI schema (schemathesis) against a real server on 127.0.0.1:
every operation, requests valid and invalid by the schema; no 5xx, and every answer conforms to
what the schema documents (status codes, content type, body)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from serve_helpers import fuzz_target, running  # noqa: E402

IDS = list(range(100, 140))


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    s = fuzz_target(tmp_path_factory.mktemp("schemathesis"), IDS, max_body_bytes=4000)
    with running(s) as (base, _):
        yield schemathesis.openapi.from_url(f"{base}/openapi.json")


def test_every_operation_answers_as_its_schema_says(api):
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 7  # recommend, batch, similar, reload, healthz, readyz, metrics
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate()

        check()
