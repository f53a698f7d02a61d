"""Metrics against a brute-force numpy implementation of the paper's code (recall, NDCG) and of
the definitions in vaecf.metrics (the rest), and against hand-worked examples."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from vaecf.data.matrix import CSR
from vaecf.evaluate import evaluate_scaled, evaluate_scores, per_user_metric, per_user_values
from vaecf.metrics import (
    NAMES,
    coverage,
    gini,
    hit_at_k,
    map_at_k,
    mrr_at_k,
    ndcg_at_k,
    novelty_at_k,
    parse_metric,
    precision_at_k,
    recall_at_k,
    self_information,
)


def brute_force_per_user(scores, fold_in, target, k):
    """Per-user (recall, ndcg) arrays for users with a target, by sorting full score rows."""
    rec, ndcg = [], []
    for s, f, t in zip(scores, fold_in, target):
        if t.sum() == 0:
            continue
        s = np.where(f > 0, -np.inf, s)
        ranked = np.argsort(-s, kind="stable")[:k]
        rel = t[ranked] > 0
        rec.append(rel.sum() / min(k, t.sum()))
        disc = 1.0 / np.log2(np.arange(2, k + 2))
        ndcg.append((rel * disc[: rel.size]).sum() / disc[: min(k, int(t.sum()))].sum())
    return np.array(rec), np.array(ndcg)


def brute_force(scores: np.ndarray, fold_in: np.ndarray, target: np.ndarray, k: int):
    """Mean (recall, ndcg) and the number of users with a target."""
    rec, ndcg = brute_force_per_user(scores, fold_in, target, k)
    return rec.mean(), ndcg.mean(), rec.size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_users, n_items = 97, 300
    fold_in = (rng.random((n_users, n_items)) < 0.05).astype(np.float32)
    # target sizes from 0 to above K, disjoint from the fold-in
    target = np.zeros_like(fold_in)
    for u in range(n_users):
        free = np.flatnonzero(fold_in[u] == 0)
        size = rng.choice([0, 1, 3, 10, 25, 60, 150])
        target[u, rng.choice(free, size=size, replace=False)] = 1
    scores = rng.standard_normal((n_users, n_items))
    s_t = torch.tensor(scores, dtype=torch.float32)

    fi, te = CSR.from_scipy(sp.csr_matrix(fold_in)), CSR.from_scipy(sp.csr_matrix(target))
    order = iter([])

    def score_fn(batch):  # rows arrive in order, batch by batch
        rows = next(order)
        return s_t[rows]

    for k in (1, 5, 20, 100):
        order = iter(torch.arange(n_users).split(32))
        got = evaluate_scores(score_fn, fi, te, [f"recall@{k}", f"ndcg@{k}"], batch_size=32)
        rec, ndcg, n = brute_force(scores.astype(np.float32), fold_in, target, k)
        assert got["n_users"] == n and got["n_skipped"] == n_users - n > 0
        assert got[f"recall@{k}"] == pytest.approx(rec, abs=1e-9)
        assert got[f"ndcg@{k}"] == pytest.approx(ndcg, abs=1e-9)
        # per user (for paired comparisons): the same users, in row order
        per_rec, per_ndcg = brute_force_per_user(scores.astype(np.float32), fold_in, target, k)
        for name, want in (("recall", per_rec), ("ndcg", per_ndcg)):
            order = iter(torch.arange(n_users).split(32))
            per = per_user_metric(score_fn, fi, te, f"{name}@{k}", batch_size=32).numpy()
            np.testing.assert_allclose(per, want, atol=1e-9)


def test_scaled_columns_match_brute_force_and_score_each_batch_once():
    """evaluate_scaled (a linear model's popularity penalties): the metrics of the scores with
    their columns multiplied by each scale, as if each were scored alone, from one call of the
    score function per batch."""
    rng = np.random.default_rng(3)
    n_users, n_items = 80, 200
    fold_in = (rng.random((n_users, n_items)) < 0.05).astype(np.float32)
    target = ((rng.random((n_users, n_items)) < 0.08) & (fold_in == 0)).astype(np.float32)
    scores = rng.standard_normal((n_users, n_items)).astype(np.float32)
    counts = rng.integers(1, 500, n_items).astype(np.float32)
    scales = [np.ones(n_items, np.float32), counts**-0.25, counts**-1.0]
    fi, te = CSR.from_scipy(sp.csr_matrix(fold_in)), CSR.from_scipy(sp.csr_matrix(target))
    s_t, calls = torch.from_numpy(scores), []

    def score_fn(batch):
        calls.append(batch.batch_size)
        return s_t[sum(calls) - batch.batch_size : sum(calls)]

    got = evaluate_scaled(
        score_fn, [torch.from_numpy(c) for c in scales], fi, te, ["recall@20", "ndcg@20"], 32
    )
    assert calls == [32, 32, 16]  # each batch once, for all three scales
    for g, c in zip(got, scales):
        rec, ndcg, n = brute_force(scores * c, fold_in, target, 20)
        assert g["n_users"] == n
        assert g["recall@20"] == pytest.approx(rec, abs=1e-9)
        assert g["ndcg@20"] == pytest.approx(ndcg, abs=1e-9)
    assert got[0] != got[2]  # the scales change the ranking


def test_known_answers():
    # ranks 1 and 3 are hits, 4 targets: recall@3 = 2/3, ndcg@3 = (1 + 1/2) / (1 + 1/log2 3 + 1/2)
    hits = torch.tensor([[True, False, True, False]])
    n = torch.tensor([4])
    assert recall_at_k(hits, n, 3).item() == pytest.approx(2 / 3)
    assert ndcg_at_k(hits, n, 3).item() == pytest.approx(1.5 / (1 + 1 / np.log2(3) + 0.5))
    # one target found at rank 2: recall@4 = 1 (min(K, |target|) = 1), ndcg = 1/log2(3)
    hits = torch.tensor([[False, True, False, False]])
    assert recall_at_k(hits, torch.tensor([1]), 4).item() == 1.0
    assert ndcg_at_k(hits, torch.tensor([1]), 4).item() == pytest.approx(1 / np.log2(3))
    # an empty target is 0, never NaN
    assert recall_at_k(hits, torch.tensor([0]), 4).item() == 0.0
    assert not torch.isnan(ndcg_at_k(hits, torch.tensor([0]), 4)).any()


def test_all_targets_empty_is_counted_not_nan():
    fi = CSR.from_scipy(sp.csr_matrix(np.eye(3, 5, dtype=np.float32)))
    te = CSR.from_scipy(sp.csr_matrix((3, 5), dtype=np.float32))
    got = evaluate_scores(lambda b: torch.zeros(b.batch_size, 5), fi, te, ["ndcg@100"])
    assert got["n_users"] == 0 and got["n_skipped"] == 3


def test_parse_metric_rejects_nonsense():
    assert parse_metric("ndcg@100") == ("ndcg", 100)
    assert parse_metric("map@10") == ("map", 10)
    for bad in ("ndcg", "auc@10", "recall@0", "recall@x", "MAP@10"):
        with pytest.raises(ValueError, match="unknown metric"):
            parse_metric(bad)


def test_evaluation_batches_are_sized_by_memory(monkeypatch):
    """With room for 7 users' scores per batch, batches shrink to 7 and the metrics stay."""
    from vaecf import evaluate

    rng = np.random.default_rng(9)
    n_users, n_items = 40, 120
    fold_in = sp.csr_matrix((rng.random((n_users, n_items)) < 0.1).astype(np.float32))
    target = sp.csr_matrix((rng.random((n_users, n_items)) < 0.1).astype(np.float32))
    target = (target - target.multiply(fold_in)).tocsr()
    target.eliminate_zeros()
    table = torch.tensor(rng.standard_normal((n_items, n_items)), dtype=torch.float32)
    sizes = []

    def score_fn(batch):
        sizes.append(batch.batch_size)
        x = torch.zeros(batch.batch_size, n_items)
        x[batch.row_ids, batch.indices] = batch.values
        return x @ table

    fi, te = CSR.from_scipy(fold_in), CSR.from_scipy(target)
    want = evaluate_scores(score_fn, fi, te, batch_size=2000)
    assert sizes == [n_users]
    sizes.clear()
    monkeypatch.setattr(evaluate, "SCORE_BUDGET", 7 * 4 * n_items)
    assert evaluate_scores(score_fn, fi, te, batch_size=2000) == pytest.approx(want)
    assert max(sizes) == 7 and sum(sizes) == n_users


# -- the metrics beyond the paper's ----------------------------------------------------------------
def in_order(table: torch.Tensor):
    """A score function serving `table`'s rows in order, batch after batch (as evaluation asks)."""
    start = [0]

    def fn(batch):
        rows = table[start[0] : start[0] + batch.batch_size]
        start[0] += batch.batch_size
        return rows

    return fn


def brute_force_all(scores, fold_in, target, k, info):
    """Every metric at k by sorting full score rows: per-user lists and the catalogue's."""
    per = {m: [] for m in ("recall", "ndcg", "precision", "map", "mrr", "hit", "novelty")}
    counts = np.zeros(scores.shape[1])
    for s, f, t in zip(scores, fold_in, target):
        n_t = int(t.sum())
        if n_t == 0:
            continue
        ranked = np.argsort(-np.where(f > 0, -np.inf, s), kind="stable")[:k]
        counts[ranked] += 1
        rel = (t[ranked] > 0).astype(float)
        hits_at = np.cumsum(rel)
        disc = 1.0 / np.log2(np.arange(2, k + 2))
        per["recall"].append(rel.sum() / min(k, n_t))
        per["ndcg"].append((rel * disc[: rel.size]).sum() / disc[: min(k, n_t)].sum())
        per["precision"].append(rel.sum() / k)
        per["map"].append(
            sum(hits_at[r] / (r + 1) for r in range(rel.size) if rel[r]) / min(k, n_t)
        )
        first = np.flatnonzero(rel)
        per["mrr"].append(1.0 / (first[0] + 1) if first.size else 0.0)
        per["hit"].append(float(rel.any()))
        per["novelty"].append(info[ranked].mean())
    out = {f"{m}@{k}": float(np.mean(v)) for m, v in per.items()}
    out[f"coverage@{k}"] = float((counts > 0).mean())
    c = np.sort(counts)
    n = c.size
    out[f"gini@{k}"] = float(((2 * np.arange(1, n + 1) - n - 1) * c).sum() / (n * c.sum()))
    return out


@pytest.mark.parametrize("seed", [3, 4])
def test_every_metric_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_users, n_items = 61, 80
    fold_in = (rng.random((n_users, n_items)) < 0.08).astype(np.float32)
    target = ((rng.random((n_users, n_items)) < 0.1) & (fold_in == 0)).astype(np.float32)
    # popular items score higher, so that the lists are unequal (gini well above 0)
    scores = (rng.standard_normal((n_users, n_items)) + np.linspace(3, 0, n_items)).astype(
        np.float32
    )
    item_users = torch.tensor(rng.integers(0, 50, n_items))
    info = self_information(item_users, 50)
    fi, te = CSR.from_scipy(sp.csr_matrix(fold_in)), CSR.from_scipy(sp.csr_matrix(target))
    s_t = torch.tensor(scores)
    for k in (1, 7, 30):
        labels = [f"{m}@{k}" for m in NAMES]
        got = evaluate_scores(in_order(s_t), fi, te, labels, batch_size=16, info=info)
        want = brute_force_all(scores, fold_in, target, k, info.numpy())
        for label in labels:
            assert got[label] == pytest.approx(want[label], abs=1e-9), label


def test_hand_worked_example():
    """One user, K = 5, targets {1, 3, 7} and the list 0 1 2 3 4: hits at ranks 2 and 4."""
    hits = torch.tensor([[False, True, False, True, False]])
    n_t = torch.tensor([3])
    assert recall_at_k(hits, n_t, 5).item() == pytest.approx(2 / 3)
    assert precision_at_k(hits, n_t, 5).item() == pytest.approx(0.4)
    assert map_at_k(hits, n_t, 5).item() == pytest.approx((1 / 2 + 2 / 4) / 3)
    assert mrr_at_k(hits, n_t, 5).item() == pytest.approx(0.5)
    assert hit_at_k(hits, n_t, 5).item() == 1.0
    assert hit_at_k(hits, n_t, 1).item() == mrr_at_k(hits, n_t, 1).item() == 0.0
    ideal = 1 + 1 / np.log2(3) + 1 / np.log2(4)
    assert ndcg_at_k(hits, n_t, 5).item() == pytest.approx(
        (1 / np.log2(3) + 1 / np.log2(5)) / ideal
    )


def test_catalogue_metrics_hand_worked():
    """Three lists of two over four items, {0, 1}, {0, 2}, {0, 1}: item counts 3, 2, 1, 0."""
    counts = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert coverage(counts) == 0.75
    assert gini(counts) == pytest.approx(10 / 24)  # sorted 0 1 2 3: (-3*0 - 1 + 2 + 9) / (4*6)
    assert gini(torch.full((5,), 2.0)) == 0.0  # every item equally often
    assert gini(torch.tensor([0.0, 0.0, 0.0, 4.0])) == pytest.approx(0.75)  # (n - 1) / n
    info = self_information(torch.tensor([10, 5, 1, 0]), 10)  # shares 1, 1/2, 1/10, (1)/10
    assert info.tolist() == pytest.approx([0.0, 1.0, np.log2(10), np.log2(10)])
    assert novelty_at_k(torch.tensor([[0, 1], [2, 3]]), info, 2).tolist() == pytest.approx(
        [0.5, np.log2(10)]
    )


def test_per_user_values_average_to_the_summary():
    rng = np.random.default_rng(11)
    fold_in = sp.csr_matrix((rng.random((45, 60)) < 0.1).astype(np.float32))
    target = sp.csr_matrix(
        ((rng.random((45, 60)) < 0.08) & (fold_in.toarray() == 0)).astype(np.float32)
    )
    fi, te = CSR.from_scipy(fold_in), CSR.from_scipy(target)
    table = torch.tensor(rng.standard_normal((45, 60)), dtype=torch.float32)
    labels = ["recall@10", "map@10", "mrr@10", "hit@5", "precision@5"]
    summary = evaluate_scores(in_order(table), fi, te, labels, batch_size=7)
    per = per_user_values(in_order(table), fi, te, labels, batch_size=7)
    assert per["row"].tolist() == np.flatnonzero(target.getnnz(axis=1)).tolist()
    for label in labels:
        assert per[label].mean().item() == pytest.approx(summary[label], abs=1e-12)
