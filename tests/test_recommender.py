"""Recommender on a known-answer dataset: blocks of users who share blocks of items."""

import numpy as np
import polars as pl
import pytest
import torch

import vaecf
from vaecf.data import synthetic


@pytest.fixture(scope="module")
def block_run(tmp_path_factory):
    """4 groups x 10 items; every user of group g has 8 of g's items, never another group's.

    Item ids are strings 'g{g}-{j}' so the vocabulary path for string ids is exercised."""
    root = tmp_path_factory.mktemp("rec")
    rng = np.random.default_rng(0)
    users, items = [], []
    for u in range(800):
        g = u % 4
        for j in rng.choice(10, size=8, replace=False):
            users.append(f"u{u}")
            items.append(f"g{g}-{j}")
    df = pl.DataFrame({"user_id": users, "item_id": items})
    ds = vaecf.prepare_frame(df, root / "prep", vaecf.PrepareSettings(heldout_users=40, seed=0))
    vaecf.train(
        ds,
        vaecf.TrainConfig(epochs=15, batch_size=100, seed=0, device="cpu", progress=False),
        root / "run",
    )
    return root / "run"


def test_recommends_the_rest_of_the_users_block(block_run):
    rec = vaecf.Recommender.load(block_run)
    for g in range(4):
        history = [f"g{g}-{j}" for j in range(6)]
        r = rec.recommend(history, k=4)
        assert set(r.item_ids[:4]) == {f"g{g}-6", f"g{g}-7", f"g{g}-8", f"g{g}-9"}
        assert not set(r.item_ids) & set(history)
        assert r.scores == sorted(r.scores, reverse=True)
        assert r.unknown == []


def test_unknown_ids_are_reported_not_dropped(block_run):
    rec = vaecf.Recommender.load(block_run)
    r = rec.recommend(["g1-0", "nope", "g1-1", 42], k=3)
    assert r.unknown == ["nope", 42]
    assert all(i.startswith("g1-") for i in r.item_ids)
    assert rec.recommend(["nope"], k=3).unknown == ["nope"]  # all unknown: still an answer


def test_batch_equals_single_and_history_exclusion(block_run):
    rec = vaecf.Recommender.load(block_run)
    hs = [["g0-1", "g0-2"], ["g3-0"], ["g2-5", "g2-6", "g2-7"]]
    batch = rec.recommend_batch(hs, k=5)
    for h, b in zip(hs, batch):
        one = rec.recommend(h, k=5)
        assert one.item_ids == b.item_ids
        np.testing.assert_allclose(one.scores, b.scores, rtol=1e-5)
    with_hist = rec.recommend(["g0-1"], k=40, exclude_history=False)
    assert "g0-1" in with_hist.item_ids and len(with_hist.item_ids) == 40
    assert len(rec.recommend(["g0-1"], k=100).item_ids) == 39  # fewer items left than k


def test_integer_ids_accept_strings(tmp_path):
    df = synthetic.generate(n_users=300, n_items=60, n_groups=3, seed=2)
    ds = vaecf.prepare_frame(df, tmp_path / "p", vaecf.PrepareSettings(heldout_users=20, seed=0))
    vaecf.train(ds, vaecf.TrainConfig(epochs=1, device="cpu", progress=False), tmp_path / "r")
    rec = vaecf.Recommender.load(tmp_path / "r")
    a = rec.recommend([1, 2, 3], k=5)
    b = rec.recommend(["1", "2", "3"], k=5)
    assert a.item_ids == b.item_ids and b.unknown == []
    assert all(isinstance(i, int) for i in a.item_ids)
    # one spelling of an integer id as text, as in every verb: nothing lenient
    odd = [" 3", "3 ", "+3", "0_3", "\u0663", "3.0", True]
    assert rec.recommend(["1", *odd], k=5).unknown == odd


def test_bf16_serving_agrees_with_fp32(block_run):
    fp32 = vaecf.Recommender.load(block_run)
    bf16 = vaecf.Recommender.load(block_run, precision="bf16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    for g in range(4):
        h = [f"g{g}-{j}" for j in range(5)]
        assert_near_top(bf16.recommend(h, k=5), fp32.recommend(h, k=15), k=5)


def assert_near_top(small, ref, k: int, rel: float = 0.02) -> None:
    """Each item a reduced-precision copy ranks in its top k is one the fp32 model also puts
    there, or one whose fp32 score is within `rel` of fp32's k-th best: kernels that round
    differently may swap near-ties (at the cut-off too), never a clearly worse item in."""
    fp32 = dict(zip(ref.item_ids, ref.scores))
    kth = ref.scores[k - 1]
    for item in small.item_ids:
        assert item in fp32, f"{item} is not among fp32's top {len(ref.item_ids)}"
        assert fp32[item] >= kth - rel * abs(kth), (item, fp32[item], kth)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_serving_copies_agree_with_fp32(block_run, precision):
    fp32 = vaecf.Recommender.load(block_run)
    small = vaecf.Recommender.load(block_run, precision=precision)
    for g in range(4):
        h = [f"g{g}-{j}" for j in range(5)]
        assert_near_top(small.recommend(h, k=5), fp32.recommend(h, k=15), k=5)
        # the same neighbours up to near-ties (int8 rounding may swap 0.11236 and 0.11217)
        assert_near_top(small.similar_items(h[0], k=3), fp32.similar_items(h[0], k=13), k=3)


@pytest.fixture(scope="module")
def cold_runs(tmp_path_factory):
    """One run per model family on skewed data (item popularity falls with the item id)."""
    root = tmp_path_factory.mktemp("cold")
    df = synthetic.generate(n_users=400, n_items=60, n_groups=3, mean_items=10, seed=4)
    ds = vaecf.prepare_frame(df, root / "prep", vaecf.PrepareSettings(heldout_users=30, seed=0))
    cfg = {"device": "cpu", "progress": False}
    runs = {
        "multdae": vaecf.train(ds, vaecf.TrainConfig(epochs=1, **cfg), root / "d", model="multdae"),
        "ease": vaecf.train(ds, vaecf.TrainConfig(**cfg), root / "e", model="ease"),
    }
    runs = {m: r.run_dir for m, r in runs.items()}
    return ds, runs


@pytest.mark.parametrize("model", ["multdae", "ease"])
def test_cold_start_gets_the_popular_items_flagged(cold_runs, model):
    from vaecf import rundir

    ds, runs = cold_runs
    rec = vaecf.Recommender.load(runs[model])
    counts = np.bincount(ds.split("train").indices, minlength=ds.n_items)
    assert (rundir.load_popularity(runs[model], ds.n_items) == counts).all()
    share = dict(zip(rec.items.ids.to_list(), counts / counts.sum()))
    warm = rec.recommend([rec.items.ids[0]], k=5)
    assert warm.fallback is None and warm.to_dict()["fallback"] is None
    for history in ([], ["no-such-item", 10**9]):
        r = rec.recommend(history, k=8)
        assert r.fallback == "popular" and r.to_dict()["fallback"] == "popular"
        assert r.unknown == history
        # the 8 most popular training items (ties in any order), scored by their share
        np.testing.assert_allclose(r.scores, [share[i] for i in r.item_ids], rtol=1e-6)
        assert r.scores == sorted(r.scores, reverse=True)
        assert min(r.scores) >= np.sort(counts / counts.sum())[-8] - 1e-9
    # filters still apply; in a batch only the cold history falls back
    top = rec.recommend([], k=3).item_ids
    denied = rec.recommend([], k=3, deny=top[:1])
    assert top[0] not in denied.item_ids and denied.fallback == "popular"
    mixed = rec.recommend_batch([[], [rec.items.ids[0]]], k=3)
    assert [m.fallback for m in mixed] == ["popular", None]


def test_a_run_without_counts_scores_a_cold_history_as_before(cold_runs, tmp_path):
    import shutil

    from vaecf import rundir

    _, runs = cold_runs
    old = tmp_path / "old"
    shutil.copytree(runs["ease"], old)
    (old / rundir.POPULARITY).unlink()  # a run written before the counts were kept
    r = vaecf.Recommender.load(old).recommend([], k=3)
    assert r.fallback is None and len(r.item_ids) == 3
    (old / rundir.POPULARITY).write_bytes(b"not numpy")
    with pytest.raises(vaecf.VaecfError, match="popularity.npy is corrupted"):
        vaecf.Recommender.load(old)


def test_a_damaged_results_json_does_not_stop_the_model_loading(block_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(block_run, run)
    assert vaecf.Recommender.load(run).results is not None
    (run / "results.json").write_text('{"best_epoch": 3, "valid')  # torn
    rec = vaecf.Recommender.load(run)
    assert rec.results is None and rec.recommend(["g0-1", "g0-2"], k=3).item_ids
