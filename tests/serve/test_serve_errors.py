"""HTTP errors in words (issue 38, item 10): a body that is not JSON, not sent as JSON, not an
object or empty, and item ids of neither kind, each answered with one sentence that says what
to send, not pydantic's own words; on a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.serve.helpers import client, running
from vaecf.config.serve import ServeSettings
from vaecf.serve.fixtures import fresh_run

JSON = {"Content-Type": "application/json"}
PYDANTIC = ("JSON decode error", "Input should be", "constrained-str", ".int:", "dictionary")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    run = fresh_run(tmp_path_factory.mktemp("errors") / "run", 10, "popular")
    with running(ServeSettings(run=str(run))) as (url, _):
        yield url


def _said(r, *words: str) -> str:
    """The 422's message, after checking it is one sentence in words holding `words`."""
    assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
    msg = r.json()["message"]
    assert "\n" not in msg and "; " not in msg and msg.count(": send") == 1, msg
    assert not any(p in msg for p in PYDANTIC), msg
    for w in words:
        assert w in msg, (w, msg)
    return msg


@pytest.mark.parametrize(
    ("path", "example"),
    [("/v1/recommend", '{"items": [1, 2, 3]'), ("/v1/recommend/batch", '{"histories": [[1, 2]')],
)
def test_a_body_that_is_not_json_says_what_to_send(base, path, example):
    with client(base) as c:
        _said(c.post(path, content=b"not json", headers=JSON), "not valid JSON", example)
        _said(c.post(path, content=b"{", headers=JSON), "at character 1", example)
        _said(c.post(path, content=b"", headers=JSON), "the body is empty", example)
        _said(c.post(path, content=b"[1, 2]", headers=JSON), "[1, 2], not a JSON object")


def test_a_body_not_sent_as_json_says_which_content_type_to_send(base):
    body = b'{"items": [1]}'
    with client(base) as c:
        none = c.post("/v1/recommend", content=body)
        assert "content-type" not in none.request.headers
        _said(none, "no Content-Type", "Content-Type: application/json", '{"items"')
        text = c.post("/v1/recommend", content=body, headers={"Content-Type": "text/plain"})
        _said(text, "Content-Type text/plain", "Content-Type: application/json")
        assert c.post("/v1/recommend", content=body, headers=JSON).status_code == 200


def test_an_item_id_of_neither_kind_is_one_sentence_per_request(base):
    with client(base) as c:
        one = c.post("/v1/recommend", json={"items": [None]})
        _said(one, "items.0 (null) is not an item id", "JSON integer or a string")
        (err,) = one.json()["errors"]  # one error per bad id, for a program
        assert err["loc"] == ["items", "0"] and err["type"] == "item_id"
        many = c.post("/v1/recommend", json={"items": [1, 1.5, True, "", "x" * 300]})
        _said(many, 'items.1 (1.5), items.2 (true), items.3 ("") and items.4', "are not")
        assert len(many.json()["errors"]) == 4
        batch = c.post("/v1/recommend/batch", json={"histories": [[1], [None]]})
        _said(batch, "histories.1.0 (null) is not an item id")
        deny = c.post("/v1/recommend", json={"items": [1], "deny": [None]})
        _said(deny, "deny.0 (null) is not an item id")
