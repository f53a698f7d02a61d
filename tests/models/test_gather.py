"""The sparse solver's compiled gathers (vaecf.models.gather) against plain NumPy/scipy."""

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from vaecf.models import gather
from vaecf.models.neighbourhood import dense_block, neighbours_of, rank_weights


def gram(seed: int, n: int = 60, users: int = 200, dtype=np.float32) -> sp.csr_matrix:
    """X^T X of a random binary X: integer counts, so many ties among a row's entries."""
    rng = np.random.default_rng(seed)
    x = sp.random(users, n, density=0.08, random_state=rng, format="csr", dtype=dtype)
    x.data[:] = 1
    return (x.T @ x).tocsr()


def reference_neighbours(g: sp.csr_matrix, k: int, items, weight):
    """Each item's k other items of highest G_ij weight_i, ties by lower index, sorted;
    padded with n; and its most co-occurring item (lowest index among equals; itself if none)."""
    n = g.shape[0]
    out, strongest = np.full((len(items), k), n), np.array(items)
    dense = g.toarray()
    for r, j in enumerate(items):
        cand = [i for i in range(n) if i != j and dense[j, i] != 0]
        if cand:
            strongest[r] = max(cand, key=lambda i: (dense[j, i], -i))
        top = sorted(cand, key=lambda i: (-(np.float64(dense[j, i]) * weight[i]), i))[:k]
        out[r, : len(top)] = sorted(top)
    return out, strongest


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("unsorted", [False, True])
@pytest.mark.parametrize("rank", ["count", "cosine"])
def test_neighbours_equal_a_brute_force_ranking(seed, unsorted, rank):
    g = gram(seed)
    if unsorted:  # the same matrix with each row's entries reversed
        g = sp.csr_matrix(
            (
                np.concatenate([g.data[a:b][::-1] for a, b in zip(g.indptr, g.indptr[1:])]),
                np.concatenate([g.indices[a:b][::-1] for a, b in zip(g.indptr, g.indptr[1:])]),
                g.indptr,
            ),
            shape=g.shape,
        )
    items = np.random.default_rng(seed).permutation(g.shape[0])[:25]
    weight = rank_weights(rank, g.diagonal())
    for k in (1, 4, 59):
        got = neighbours_of(g, k, items, weight)
        want = reference_neighbours(g, k, items, weight)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_an_item_without_co_occurrences_has_only_padding_and_itself():
    g = sp.csr_matrix(np.array([[2.0, 1.0, 0.0], [1.0, 3.0, 0.0], [0.0, 0.0, 4.0]]))
    nbrs, strongest = neighbours_of(g, 2, np.array([2, 0]))
    np.testing.assert_array_equal(nbrs, [[3, 3], [1, 3]])
    np.testing.assert_array_equal(strongest, [2, 1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_block_equals_scipys_selection(dtype):
    g = gram(3, n=80, dtype=dtype)
    items = np.random.default_rng(3).permutation(80)[:37]  # unsorted, distinct
    want = g[items][:, items].toarray()
    np.testing.assert_array_equal(dense_block(g, items), want)
    out = np.zeros((40, 40), dtype=np.float32)
    dense_block(g, items, out)
    np.testing.assert_array_equal(out[:37, :37], want)
    assert not out[37:].any() and not out[:, 37:].any()


def test_systems_equal_numpys_fancy_indexing():
    rng = np.random.default_rng(4)
    full = rng.standard_normal((30, 30)).astype(np.float32)
    p = rng.integers(0, 30, size=(7, 5))
    lam = rng.random(30).astype(np.float32)
    at = rng.integers(0, 30, size=7)
    a, rhs = gather.systems(full, p, lam, at)
    want = full[p[:, :, None], p[:, None, :]]
    want[:, np.arange(5), np.arange(5)] += lam[p]
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(rhs, full[p, at[:, None]])


@pytest.mark.parametrize("k", [1, 3, 4, 7, 8, 41])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_solved_systems_equal_numpys_solve(k, dtype):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((120, 60))
    full = (x.T @ x).astype(dtype)  # positive definite on every subset
    p = np.stack([rng.choice(60, size=k, replace=False) for _ in range(9)])
    lam = rng.random(60).astype(dtype)
    at = rng.integers(0, 60, size=9)
    a, rhs = gather.systems(full, p, lam, at)
    want = np.linalg.solve(a.astype(np.float64), rhs.astype(np.float64)[:, :, None])[:, :, 0]
    got = gather.solve_systems(full, p, lam, at)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == np.float32 else 1e-9, atol=1e-6)


def test_a_system_not_positive_definite_is_reported():
    full = np.eye(10, dtype=np.float32)
    full[6, 6] = -2.0
    p = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    lam = np.ones(10, dtype=np.float32)  # item 6: -2 + 1 < 0
    assert gather.solve_systems(full, p, lam, np.zeros(2, dtype=np.int64)) is None
    assert gather.solve_systems(full, p[:1], lam, np.zeros(1, dtype=np.int64)) is not None


def reference_spans(items, nbrs, order, limit, max_items, n):
    """Runs of `order` grown greedily while the union of their items and neighbourhoods (the
    padding n counted, then dropped) stays within `limit`: the solver's rule, with sets."""
    start = 0
    while start < len(order):
        span, stop = set(nbrs[order[start]].tolist()) | {int(items[order[start]])}, start + 1
        while stop < len(order) and stop - start < max_items:
            r = order[stop]
            more = (set(nbrs[r].tolist()) | {int(items[r])}) - span
            if len(span) + len(more) > limit:
                break
            span, stop = span | more, stop + 1
        yield order[start:stop], np.array(sorted(span - {n}), dtype=np.int64)
        start = stop


@pytest.mark.parametrize("seed", range(40))
def test_spans_equal_a_set_based_greedy_grouping(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    k = int(rng.integers(1, min(n, 12)))
    items = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
    nbrs = np.full((len(items), k), n)  # padded with n where an item has fewer neighbours
    for r, j in enumerate(items):
        others = np.setdiff1d(np.arange(n), [j])
        c = min(int(rng.integers(0, k + 1)), len(others))
        nbrs[r, :c] = np.sort(rng.choice(others, size=c, replace=False))
    order = rng.permutation(len(items))
    limit, max_items = int(rng.integers(1, 3 * k + 3)), int(rng.integers(1, 10))
    got = list(gather.spans(items, nbrs, order, limit, max_items, n))
    want = list(reference_spans(items, nbrs, order, limit, max_items, n))
    assert len(got) == len(want)
    for (rows, span), (rows_want, span_want) in zip(got, want):
        np.testing.assert_array_equal(rows, rows_want)
        np.testing.assert_array_equal(span, span_want)


@pytest.mark.parametrize("hubs", [0, 10, 80])
def test_blocks_with_hubs_equal_scipys_selection_span_after_span(hubs):
    g = gram(5, n=80, users=300)  # some rows much longer than others: hubs and the rest
    blocks = gather.Blocks(g, np.float32, hubs)
    rng = np.random.default_rng(5)
    for size in (50, 12, 79, 3):  # a smaller span reuses a larger one's memory
        span = rng.permutation(80)[:size]
        got = blocks.dense(span)
        assert got.shape == (size + 1, size + 1)
        np.testing.assert_array_equal(got[:size, :size], g[span][:, span].toarray())
        assert not got[size].any() and not got[:, size].any()  # the padding's row and column


def test_loading_a_linear_model_does_not_import_numba():
    """Serving an EASE run (dense or sparse B) never compiles: Numba is the solve's alone."""
    code = "import sys, vaecf.models.ease; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_where_numba_cannot_cache_the_loops_are_compiled_uncached():
    """A read-only install without a writable cache directory: Numba refuses `cache=True` at
    decoration; the module still loads and its loops run."""
    code = (
        "import numba, numpy as np\n"
        "real = numba.njit\n"
        "def njit(*a, **k):\n"
        "    if k.get('cache'):\n"
        "        raise RuntimeError('cannot cache function: no locator available')\n"
        "    return real(*a, **k)\n"
        "numba.njit = njit\n"
        "from vaecf.models import gather\n"
        "nbrs = np.array([[1, 3], [0, 3], [3, 3]])\n"
        "print([s.tolist() for _, s in gather.spans(np.arange(3), nbrs, np.arange(3), 3, 9, 3)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[0, 1], [2]]"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_is_scipys_product_to_the_bit(dtype):
    rng = np.random.default_rng(6)
    x = sp.random(500, 90, density=0.1, random_state=rng, format="csr", dtype=dtype)
    x.data = rng.random(x.nnz).astype(dtype) * 3  # weighted: sums that rounding can tell apart
    x = sp.diags((np.arange(500) != 3).astype(dtype)) @ x  # user 3 without items
    x.eliminate_zeros()
    got, want = gather.gram(x), (x.T @ x).tocsr()
    want.sort_indices()
    assert got.has_sorted_indices and got.dtype == want.dtype and got.indices.dtype == np.int32
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)
