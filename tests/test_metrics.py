"""Metrics against a brute-force numpy implementation of the paper's code."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from vaecf.data.matrix import CSR
from vaecf.evaluate import evaluate_scaled, evaluate_scores, per_user_metric
from vaecf.metrics import ndcg_at_k, parse_metric, recall_at_k


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
    for bad in ("ndcg", "map@10", "recall@0", "recall@x"):
        with pytest.raises(ValueError):
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
