"""CSR slicing on the device against scipy."""

import numpy as np
import scipy.sparse as sp
import torch

from vaecf.data.matrix import CSR, SparseBatch, load_csr, save_csr


def test_batch_rows_equal_scipy_rows():
    m = sp.random(50, 30, density=0.2, format="csr", random_state=1, dtype=np.float32)
    m[7] = 0  # an empty row
    m.eliminate_zeros()
    csr = CSR.from_scipy(m)
    rows = torch.tensor([7, 3, 3, 49, 0, 12])
    b = csr.batch(rows)
    assert b.batch_size == 6
    dense = np.zeros((6, 30), dtype=np.float32)
    np.add.at(dense, (b.row_ids.numpy(), b.indices.numpy()), b.values.numpy())
    np.testing.assert_array_equal(dense, m[rows.numpy()].toarray())
    # offsets point at each row's first non-zero
    lens = np.diff(m.indptr)[rows.numpy()]
    np.testing.assert_array_equal(b.offsets.numpy(), np.concatenate([[0], np.cumsum(lens)[:-1]]))
    np.testing.assert_allclose(b.row_sums().numpy(), m[rows.numpy()].sum(1).A1)


def test_a_batch_of_index_lists_equals_the_csr_batch_of_those_rows():
    rows = [[1, 4, 7], [], [0], [2, 3]]
    m = sp.csr_matrix((np.ones(6, dtype=np.float32), [1, 4, 7, 0, 2, 3], [0, 3, 3, 4, 6]), (4, 9))
    want, got = CSR.from_scipy(m).batch(torch.arange(4)), SparseBatch.of_rows(rows)
    assert got.batch_size == want.batch_size == 4
    for name in ("indices", "offsets", "values", "row_ids"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_a_one_row_batch_equals_that_row_of_a_larger_batch():
    m = sp.random(40, 25, density=0.2, format="csr", random_state=3, dtype=np.float32)
    m[5] = 0  # an empty row
    m.eliminate_zeros()
    csr = CSR.from_scipy(m)
    for r in (0, 5, 17, 39):
        one, pair = csr.batch(torch.tensor([r])), csr.batch(torch.tensor([r, 0]))
        n = int(m.indptr[r + 1] - m.indptr[r])
        assert one.batch_size == 1 and one.offsets.tolist() == [0]
        torch.testing.assert_close(one.indices, pair.indices[:n])
        torch.testing.assert_close(one.values, pair.values[:n])
        torch.testing.assert_close(one.row_ids, pair.row_ids[:n])
        assert one.indices.dtype == one.row_ids.dtype == one.offsets.dtype == torch.int64


def test_keys_are_sorted_and_unique():
    m = sp.random(20, 9, density=0.3, format="csr", random_state=2, dtype=np.float32)
    k = CSR.from_scipy(m).keys().numpy()
    r, c = m.nonzero()
    np.testing.assert_array_equal(np.sort(k), k)
    assert set(k.tolist()) == set((r * 9 + c).tolist())


def test_save_load_roundtrip(tmp_path):
    m = sp.random(5, 4, density=0.5, format="csr", random_state=3, dtype=np.float32)
    save_csr(tmp_path / "m.npz", m)
    assert (load_csr(tmp_path / "m.npz") != m).nnz == 0
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]
