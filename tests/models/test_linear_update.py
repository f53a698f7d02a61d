"""EASE updated by the rows that changed (vaecf.models.linear_update) against brute force: the
inverse of the newer Gram solved directly, and the changed rows counted as tuples."""

from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from vaecf.models import linear_update
from vaecf.models.linear import linear_weights, penalty


def binary(rng, n_rows: int, n_items: int, density: float) -> sp.csr_matrix:
    m = sp.random(n_rows, n_items, density=density, random_state=rng, format="csr")
    m.data[:] = 1.0
    return m


def inverse(x: sp.csr_matrix, l2: float) -> torch.Tensor:
    g = torch.from_numpy((x.T @ x).toarray()).double()
    g.diagonal().add_(l2)
    return torch.linalg.inv(g)


def test_changed_rows_are_the_multiset_difference():
    rng = np.random.default_rng(0)
    old = binary(rng, 60, 12, 0.3)
    keep = [0, 0, 3, 5, 7, *range(10, 60)]  # row 0 twice, rows 1, 2, 4, 6, 8, 9 gone
    new = sp.vstack([old[keep], binary(rng, 5, 12, 0.3), sp.csr_matrix((1, 12))]).tocsr()
    added, removed = linear_update.changed(old, new)

    def as_sets(m):
        return [tuple(m.indices[m.indptr[i] : m.indptr[i + 1]].tolist()) for i in range(m.shape[0])]

    a, b = as_sets(old), as_sets(new)
    assert Counter(b[i] for i in added) == Counter(b) - Counter(a)
    assert Counter(a[i] for i in removed) == Counter(a) - Counter(b)
    assert len(set(added)) == len(added) and len(set(removed)) == len(removed)


def test_inverse_diag_is_the_inverse_diagonal():
    rng = np.random.default_rng(1)
    x = binary(rng, 200, 30, 0.2)
    g = torch.from_numpy((x.T @ x).toarray()).double()
    scale = penalty(g.diagonal(), 0.25).double()
    b = linear_weights(g, 7.0).mul_(scale)
    d = linear_update.inverse_diag(g, b, 7.0, scale)
    torch.testing.assert_close(d, inverse(x, 7.0).diagonal(), rtol=1e-9, atol=0)


@pytest.mark.parametrize("lost", [False, True])
def test_the_updated_inverse_is_the_newer_rows_solve(lost):
    """Rows removed (2), grown (3), added (3), two new items, and (`lost`) an item the newer
    data lost, gone from its two rows: the inverse equals the direct solve on the newer rows."""
    rng = np.random.default_rng(2)
    l2 = 3.0
    old = binary(rng, 400, 60, 0.1).tolil()
    old[:, 0] = 0
    old[0, 0] = old[1, 0] = 1  # item 0 in rows 0 and 1 alone
    old = old.tocsr()
    newer = sp.hstack([old[:398], sp.csr_matrix((398, 2))]).tolil()  # rows 398, 399 removed
    for i, j in ((2, 60), (3, 61), (4, 59)):  # grown: a new item, or one the row lacked
        newer[i, j if j >= 60 or not old[i, j] else 58] = 1
    newer = sp.vstack([newer.tocsr(), binary(rng, 3, 62, 0.2)]).tocsr()
    kept = np.arange(1 if lost else 0, 62)
    newer = newer[:, kept].tocsr()
    newer.data[:] = 1.0
    g = torch.from_numpy((old.T @ old).toarray()).double()
    b = linear_weights(g, l2)
    d = linear_update.inverse_diag(g, b, l2, torch.ones(60))
    pos = np.where(kept < 60, kept, -1)  # each newer item's index among the run's
    got = linear_update.Inverse(lambda: (b, d), l2, old, pos).updated(newer, l2)
    assert got is not None
    p, added, removed = got
    assert (added, removed) == ((8, 7) if lost else (6, 5))
    torch.testing.assert_close(p, inverse(newer, l2), rtol=1e-8, atol=1e-12)


def test_a_change_too_large_another_lambda_or_no_diag_p_is_left_to_the_solve():
    rng = np.random.default_rng(3)
    old, other = binary(rng, 100, 20, 0.2), binary(rng, 100, 20, 0.2)
    g = torch.from_numpy((old.T @ old).toarray()).double()
    b = linear_weights(g, 2.0)
    d = linear_update.inverse_diag(g, b, 2.0, torch.ones(20))
    pos = np.arange(20)
    start = linear_update.Inverse(lambda: (b.clone(), d), 2.0, old, pos)
    assert start.updated(other, 2.0) is None
    assert start.said(None).endswith("96 removed: solving costs less")  # the line logged
    assert start.updated(old, 3.0) is None and "lambda 3 is not the run's 2" in start.said(None)
    weighted = old.copy()
    weighted.data[:] = 2.0
    assert (
        linear_update.Inverse(lambda: (b.clone(), d), 2.0, weighted, pos).updated(old, 2.0) is None
    )
    sparse = linear_update.Inverse(lambda: None, 2.0, old, pos)  # no diag P
    assert sparse.updated(old, 2.0) is None and "sparse" in sparse.said(None)
    got = linear_update.Inverse(lambda: (b.clone(), d), 2.0, old, pos).updated(old, 2.0)
    p, added, removed = got
    assert (added, removed) == (0, 0)
    assert start.said(got).endswith("(0 added, 0 removed) in place of the solve")
    torch.testing.assert_close(p, inverse(old, 2.0), rtol=1e-9, atol=1e-13)


def test_a_removal_that_rounding_makes_indefinite_is_left_to_the_solve():
    """d claims a far smaller inverse than B's: removing a row then leaves I - U P U^T
    indefinite, and the update hands over to the solve instead of failing."""
    rng = np.random.default_rng(4)
    old = binary(rng, 50, 30, 0.3)
    g = torch.from_numpy((old.T @ old).toarray()).double()
    b = linear_weights(g, 0.01)
    d = linear_update.inverse_diag(g, b, 0.01, torch.ones(30)) * 1e6
    start = linear_update.Inverse(lambda: (b, d), 0.01, old, np.arange(30))
    assert start.updated(old[1:], 0.01) is None and "rounding" in start.said(None)
