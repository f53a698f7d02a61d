"""The API fuzzed from its own OpenAPI schema (schemathesis) against a real server on 127.0.0.1:
every operation, requests valid by the schema and (negative mode) invalid; no 5xx, invalid ones
refused with a documented 4xx, and every answer conforms to what the schema documents (status
codes, content type, body)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from tests.serve.helpers import fuzz_target, running  # noqa: E402

IDS = list(range(100, 140))
# invalid data must be refused with one of these; beside schemathesis' list, 413: a body over
# the server's --max-body-bytes (4,000 here) is refused before it is read
REJECTED = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    s = fuzz_target(tmp_path_factory.mktemp("schemathesis"), IDS, max_body_bytes=4000)
    with running(s) as (base, _):
        yield schemathesis.openapi.from_url(f"{base}/openapi.json", config=CONFIG)


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_operation_answers_as_its_schema_says(api, mode):
    """positive: requests the schema allows; negative: requests it forbids (wrong types,
    missing fields, extra values), which must be refused with a documented 4xx."""
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 7  # recommend, batch, similar, reload, healthz, readyz, metrics
    tried = 0
    for operation in operations:
        try:
            strategy = operation.as_strategy(schemathesis.GenerationMode(mode))
        except Exception:  # nothing to negate (no parameters, no body): positive covers it
            continue

        @given(case=strategy)
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate()

        try:
            check()
        except Unsatisfiable:  # nothing to negate in this operation
            continue
        tried += 1
    assert tried >= (9 if mode == "positive" else 5)  # negative: the 4 with inputs and reload
