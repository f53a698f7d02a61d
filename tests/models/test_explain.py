"""Explanations tested for truth, not shape: a linear model's weights sum to the item's score;
batched leave-one-out equals a loop of single removals; on planted data whose cause is known
(items that always come in pairs) every model family names the partner first; popularity and a
cold start say why they have none; the work per request is capped."""

import numpy as np
import polars as pl
import pytest
import torch

import vaecf
from tests.helpers import cli_in_process, cpu_config
from vaecf import models
from vaecf.errors import ConfigError
from vaecf.models.explain import MAX_EXPLAIN_WORK, leave_one_out

N_PAIRS = 30  # items 2p and 2p + 1 always come together


def paired(seed: int = 0, n_users: int = 600) -> pl.DataFrame:
    """Each user takes 5-8 of the pairs, both items of each."""
    rng = np.random.default_rng(seed)
    users, items = [], []
    for u in range(n_users):
        for p in rng.choice(N_PAIRS, size=rng.integers(5, 9), replace=False):
            users += [u, u]
            items += [2 * int(p), 2 * int(p) + 1]
    return pl.DataFrame({"user_id": users, "item_id": items})


SMALL = {
    "multvae": {"hidden_dims": [64], "latent_dim": 16},
    "recvae": {"hidden_dim": 64, "latent_dim": 16, "n_layers": 2},
    "ease": {"l2_grid": [10.0]},
    "edlae": {"l2_grid": [10.0], "dropout_grid": [0.25], "popularity_grid": [0.2]},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    ds = vaecf.prepare_frame(paired(), root / "data", vaecf.PrepareSettings(heldout_users=50))
    out = {}
    for name in ("ease", "edlae", "multvae", "recvae", "infae", "popular"):
        closed = models.get(name).closed_form
        cfg = cpu_config(seed=1) if closed else cpu_config(seed=1, epochs=20, batch_size=100)
        mcfg = models.config_from_dict(name, SMALL.get(name))
        out[name] = vaecf.train(ds, cfg, root / name, mcfg, model=name).run_dir
    return out


def history_missing_a_partner(rng) -> tuple[list[int], int, int]:
    """Both items of three pairs, and one item of a fourth: (history, the lone item, its
    partner, the item the pair structure says is missing)."""
    pairs = rng.choice(N_PAIRS, size=4, replace=False)
    history = [i for p in pairs[:3] for i in (2 * int(p), 2 * int(p) + 1)]
    lone = 2 * int(pairs[3]) + int(rng.integers(2))
    return [*history, lone], lone, lone ^ 1


@pytest.mark.parametrize("name", ["ease", "edlae", "multvae", "recvae", "infae"])
def test_every_family_names_the_partner_first(runs, name):
    rec = vaecf.Recommender.load(runs[name])
    rng = np.random.default_rng(7)
    for _ in range(5):
        history, lone, partner = history_missing_a_partner(rng)
        r = rec.recommend(history, k=1, explain=True, allow=[partner])  # why the partner?
        assert r.item_ids == [partner]
        assert r.because[0][0]["item_id"] == lone, (name, history, r.because[0])


@pytest.mark.parametrize("name", ["ease", "edlae"])
def test_linear_weights_sum_to_the_score(runs, name):
    rec = vaecf.Recommender.load(runs[name])
    rng = np.random.default_rng(3)
    histories = [history_missing_a_partner(rng)[0] for _ in range(4)]
    for r in rec.recommend_many(histories, k=10, explain=True, explain_top=None):
        for score, why in zip(r.scores, r.because):
            total = sum(w["weight"] for w in why)
            assert total == pytest.approx(score, rel=1e-5, abs=1e-6)
            weights = [w["weight"] for w in why]
            assert weights == sorted(weights, reverse=True)  # strongest first


@pytest.mark.parametrize("name", ["multvae", "recvae", "infae"])
def test_batched_leave_one_out_equals_a_loop_of_single_removals(runs, name):
    rec = vaecf.Recommender.load(runs[name])
    rng = np.random.default_rng(5)
    hist = [sorted(rng.choice(2 * N_PAIRS, size=n, replace=False).tolist()) for n in (3, 7, 1)]
    items = [torch.tensor(rng.choice(2 * N_PAIRS, size=4, replace=False)) for _ in hist]
    got = leave_one_out(rec.score_fn, [torch.tensor(h) for h in hist], items,
                        rec.model.n_items, rec.model.multinomial, rec.device)  # fmt: skip
    for h, its, w in zip(hist, items, got):
        full = rec.scores([h])[0][0][its]
        for j in range(len(h)):
            without = rec.scores([h[:j] + h[j + 1 :]])[0][0][its]
            # float32 scores of the order of 1 (inf-AE sums cancelling terms): 1e-6 apart
            assert torch.allclose(w[j], full - without, rtol=1e-5, atol=2e-6), (h, j)


def test_popularity_and_a_cold_start_say_why_they_have_no_because(runs):
    pop = vaecf.Recommender.load(runs["popular"])
    r = pop.recommend([0, 1, 2], k=3, explain=True)
    assert r.because is None and r.fallback == "popular"
    assert all("because" not in item for item in r.to_dict()["items"])
    ease = vaecf.Recommender.load(runs["ease"])
    cold = ease.recommend(["never seen"], k=3, explain=True)
    assert cold.because is None and cold.fallback == "popular"
    warm = ease.recommend([0, 1, 2], k=3, explain=True)
    assert warm.fallback is None and len(warm.to_dict()["items"][0]["because"]) == 3


def test_the_explain_work_is_capped(runs):
    rec = vaecf.Recommender.load(runs["ease"])
    history = list(range(2 * N_PAIRS))
    many = [history] * (MAX_EXPLAIN_WORK // (len(history) * 10) + 1)
    with pytest.raises(ConfigError, match="more than the 100,000 one request may explain"):
        rec.recommend_many(many, k=10, explain=True)
    rec.recommend_many(many, k=10)  # without explain: no cap of this kind


def test_cli_explains_in_text_and_json(runs):
    rc, err = cli_in_process(["recommend", runs["ease"], "--items", "0,1,2,4", "-k", "2",
                              "--explain", "--json"])  # fmt: skip
    assert rc == 0, err


def test_the_server_explains_every_route_and_refuses_past_the_cap(runs):
    from tests.serve.helpers import client, running
    from vaecf.config.serve import ServeSettings

    rec = vaecf.Recommender.load(runs["ease"])
    want = rec.recommend([0, 1, 4], k=2, explain=True).to_dict()["items"]
    with running(ServeSettings(run=str(runs["ease"]))) as (base, _), client(base) as c:
        one = c.post("/v1/recommend", json={"items": [0, 1, 4], "k": 2, "explain": True}).json()
        assert [i["because"] for i in one["items"]] == [i["because"] for i in want]
        plain = c.post("/v1/recommend", json={"items": [0, 1, 4], "k": 2}).json()
        assert all("because" not in i for i in plain["items"])
        two = {"histories": [[0, 1, 4], [2]], "k": 2, "explain": True}
        batch = c.post("/v1/recommend/batch", json=two).json()
        assert batch["results"][0]["items"] == one["items"]
        assert all(i["because"] for r in batch["results"] for i in r["items"])
        user = c.get("/v1/users/3/recommend", params={"k": 2, "explain": "true"}).json()
        assert all(i["because"] for i in user["items"])
        big = {"histories": [list(range(2 * N_PAIRS))] * 40, "k": 50, "explain": True}
        refused = c.post("/v1/recommend/batch", json=big)
        assert refused.status_code == 422 and "one request may explain" in refused.json()["message"]
        schema = c.get("/openapi.json").json()["components"]["schemas"]
        assert "explain" in schema["RecommendRequest"]["properties"]
        assert "because" in schema["ItemScore"]["properties"]
