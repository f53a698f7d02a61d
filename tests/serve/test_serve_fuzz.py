"""Property-based fuzzing of the request schemas (Hypothesis, against a real server): whatever
JSON a client sends to the POST routes, the answer is 200, 413 or 422 with a JSON body, never a
500 or a traceback; and 200 answers keep their promises (at most k items, none of the history
when excluded)."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.serve.helpers import client, fuzz_target, running  # noqa: E402
from vaecf.serve.schemas import BatchResponse, RecommendResponse  # noqa: E402

IDS = list(range(100, 140))

item_ids = st.one_of(
    st.sampled_from(IDS),
    st.sampled_from([str(i) for i in IDS]),
    st.integers(-(2**70), 2**70),
    st.text(max_size=20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
filters = st.fixed_dictionaries(
    {},
    optional={
        "k": st.one_of(st.integers(-5, 40), json_values),
        "exclude_seen": st.one_of(st.booleans(), json_values),
        "allow": st.one_of(st.lists(item_ids, max_size=10), json_values),
        "deny": st.one_of(st.lists(item_ids, max_size=10), json_values),
        "junk": json_values,
    },
)
recommend_bodies = st.one_of(
    st.tuples(st.lists(item_ids, max_size=25), filters).map(lambda t: {"items": t[0], **t[1]}),
    json_values,
)
batch_bodies = st.one_of(
    st.tuples(st.lists(st.lists(item_ids, max_size=6), max_size=5), filters).map(
        lambda t: {"histories": t[0], **t[1]}
    ),
    json_values,
)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    s = fuzz_target(tmp_path_factory.mktemp("fuzz"), IDS, max_body_bytes=2000)
    with running(s) as (url, _), client(url) as c:
        yield c


def check(r, body, history_of, schema) -> None:
    assert r.status_code in (200, 413, 422), (r.status_code, body, r.text)
    answer = r.json()  # always JSON
    assert "Traceback" not in r.text
    if r.status_code != 200:
        assert answer["error"] and answer["message"]
        return
    # the route encodes its answers itself: they must be what its OpenAPI schema says
    assert r.headers["content-type"] == "application/json"
    assert schema.model_validate(answer).model_dump(exclude_unset=True) == answer
    k = body.get("k", 10)
    for history, ranked in history_of(answer):
        assert len(ranked["items"]) <= k
        if body.get("exclude_seen", True):
            seen = {int(i) for i in history if str(i) in {str(x) for x in IDS}}
            assert seen.isdisjoint(i["item_id"] for i in ranked["items"])


FUZZ = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(body=recommend_bodies)
def test_recommend_answers_any_json_with_json(http, body):
    r = http.post("/v1/recommend", json=body)
    check(
        r, body if isinstance(body, dict) else {}, lambda a: [(body["items"], a)], RecommendResponse
    )


@FUZZ
@given(body=batch_bodies)
def test_batch_answers_any_json_with_json(http, body):
    r = http.post("/v1/recommend/batch", json=body)
    check(
        r,
        body if isinstance(body, dict) else {},
        lambda a: list(zip(body["histories"], a["results"])),
        BatchResponse,
    )
