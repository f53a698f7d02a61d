"""What a CUDA-graph training step is built from, checked where it runs without a GPU: the
padded, sync-free batch gather adds exactly nothing to a step; the GPU's first-layer product
equals embedding_bag; the capacity covers random batches. The graph itself:
tests/training/test_cuda.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vaecf
from vaecf import models, rundir
from vaecf.bench.speed import synthetic_csr
from vaecf.data.matrix import CSR
from vaecf.models import first_layer
from vaecf.training import graphs


@pytest.fixture(scope="module")
def csr():
    return CSR.from_scipy(synthetic_csr(400, 300, 9_000, seed=3))


def test_padded_batch_holds_the_batch_then_zeros(csr):
    rows = torch.tensor([5, 0, 399, 17, 5])  # a repeated row, the first and the last
    eager = csr.batch(rows)
    total = eager.indices.numel()
    padded = csr.padded_batch(rows, total + 37)
    assert torch.equal(padded.offsets, eager.offsets)
    assert torch.equal(padded.indices[:total], eager.indices)
    assert torch.equal(padded.values[:total], eager.values)
    assert torch.equal(padded.row_ids[:total], eager.row_ids)
    assert torch.all(padded.values[total:] == 0)
    assert torch.all(padded.row_ids[total:] == rows.numel() - 1)
    exact = csr.padded_batch(rows, total)
    assert torch.equal(exact.indices, eager.indices) and torch.equal(exact.row_ids, eager.row_ids)
    # each row's sum and inverse L2 norm, read from the matrix's, equal the batch's own
    assert eager.row_stats is None and padded.row_stats is not None
    torch.testing.assert_close(padded.row_sums(), eager.row_sums(), rtol=0, atol=0)
    torch.testing.assert_close(padded.inverse_norms(), eager.inverse_norms(), rtol=0, atol=0)


def test_the_matrix_row_statistics_equal_each_batch_computing_its_own():
    """Ratings rather than ones (sums in another order: float32 rounding apart), and an empty
    row (sum 0, inverse norm 1e6, as the batch computes it)."""
    m = synthetic_csr(50, 40, 600, seed=4)
    m.data = np.random.default_rng(0).uniform(0.5, 5.0, m.nnz).astype(np.float32)
    m = m.tolil()
    m[7, :] = 0
    csr = CSR.from_scipy(m.tocsr())
    rows = torch.tensor([7, 3, 49, 0, 3])
    eager, padded = csr.batch(rows), csr.padded_batch(rows, 4096)
    assert padded.row_sums()[0] == 0 and padded.inverse_norms()[0] == pytest.approx(1e6)
    torch.testing.assert_close(padded.row_sums(), eager.row_sums(), rtol=1e-6, atol=0)
    torch.testing.assert_close(padded.inverse_norms(), eager.inverse_norms(), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "name,phase",
    [("multvae", 0), ("multdae", 0), ("recvae", 0), ("recvae", 1), ("recvae-edlae", 1)],
)
def test_a_padded_step_equals_the_eager_step(csr, name, phase):
    """Loss and every gradient on the same weights (no dropout or sampling: eval mode), in
    each phase of RecVAE's epoch (encoder, decoder)."""
    rows = torch.randperm(csr.n_rows, generator=torch.Generator().manual_seed(1))[:64]
    eager = csr.batch(rows)
    out = []
    for batch in (eager, csr.padded_batch(rows, eager.indices.numel() + 500)):
        torch.manual_seed(0)
        net = models.build(name, csr.shape[1]).eval()
        if name == "recvae-edlae":  # a linear path that is not zero
            net.shallow.copy_(torch.rand(net.shallow.shape) / 10)
        loss, _ = net.loss(batch, 0.2, 64, net.phases()[phase])
        loss.backward()
        grads = {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}
        out.append((loss.item(), grads))
    (l0, g0), (l1, g1) = out
    assert l1 == pytest.approx(l0, rel=1e-6)
    assert g0.keys() == g1.keys() and g0
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-7, msg=k)


@pytest.mark.parametrize("padded", [False, True])
def test_every_first_layer_kernel_equals_the_dense_product(csr, padded):
    """Each kernel (models/first_layer.py) against a dense brute-force product, forward and the
    weight's gradient, in float32 to 1e-5; a padded batch (a CUDA graph's) changes nothing."""
    rows = torch.arange(50)
    batch = (
        csr.padded_batch(rows, csr.batch(rows).indices.numel() + 37) if padded else csr.batch(rows)
    )
    w = torch.randn(csr.shape[1], 16, requires_grad=True)
    v = torch.rand(batch.values.numel()) * (batch.values != 0)  # padding slots stay zero
    dense = torch.zeros(50, csr.shape[1]).index_put_(
        (batch.row_ids, batch.indices), v, accumulate=True
    )
    probe = torch.linspace(-1, 1, 16)
    (dense @ w * probe).sum().backward()
    want_out, want_grad = (dense @ w).detach(), w.grad.clone()
    for kernel in first_layer.KERNELS:
        w.grad = None
        out = first_layer.product(batch, w, v, kernel)
        (out * probe).sum().backward()
        torch.testing.assert_close(out.detach(), want_out, rtol=1e-5, atol=1e-5, msg=kernel)
        torch.testing.assert_close(w.grad, want_grad, rtol=1e-5, atol=1e-5, msg=kernel)
    with pytest.raises(ValueError, match="unknown first-layer kernel"):
        first_layer.product(batch, w, v, "spmv")


def test_the_cpus_bag_backward_equals_embedding_bags():
    """On a CPU "bag" computes the weight's gradient as a second embedding_bag over the
    transposed batch (first_layer.BagProduct): the same gradient as embedding_bag's own backward,
    in float32 and under bf16 autocast (a float32 gradient for the float32 weight), with an
    empty row and unused items; without gradients it is embedding_bag itself."""
    m = synthetic_csr(60, 300, 900, seed=5).tolil()
    m[4, :] = 0  # an empty row
    m = CSR.from_scipy(m.tocsr())
    batch = m.batch(torch.tensor([3, 4, 7, 7, 12, 40]))
    w = torch.randn(300, 24, requires_grad=True)
    v = torch.rand(batch.values.numel())
    probe = torch.randn(6, 24)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = first_layer.product(batch, w, v, "bag")
            assert "BagProduct" in out.grad_fn.name()
            (out.float() * probe).sum().backward()
            got, w.grad = w.grad, None
            ref = F.embedding_bag(batch.indices, w, batch.offsets, per_sample_weights=v, mode="sum")
            (ref.float() * probe).sum().backward()
            want, w.grad = w.grad, None
        assert got.dtype == torch.float32
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert torch.equal(out[1], torch.zeros(24))
    with torch.no_grad():
        assert first_layer.product(batch, w, v, "bag").grad_fn is None


def test_a_cpu_keeps_embedding_bag_without_measuring(csr):
    batch = csr.batch(torch.arange(20))
    w = torch.randn(csr.shape[1], 8)
    assert first_layer.choose(batch, w, batch.values) == ("bag", {})
    net = models.build("multdae", csr.shape[1])
    rng = torch.get_rng_state()
    assert first_layer.choose_for(net, csr, 100, "fp32", graphed=True) == ("bag", {}, True)
    assert torch.equal(torch.get_rng_state(), rng)
    # an explicit kernel is used as it is; CSR cannot be captured in a CUDA graph
    assert first_layer.choose_for(net, csr, 100, "fp32", "csr") == ("csr", {}, False)
    assert net.first_layer == "csr" and net.training
    assert first_layer.choose_for(models.build("ease", 10), csr, 100, "fp32").kernel is None


def test_the_capacity_covers_random_batches():
    rng = np.random.default_rng(0)
    lens = np.minimum(rng.lognormal(3.5, 1.2, 50_000).astype(int) + 5, 5_000)  # heavy tailed
    cap = graphs.graph_capacity(lens, 500)
    assert cap % 4096 == 0
    totals = [lens[rng.integers(0, lens.size, 500)].sum() for _ in range(3000)]
    assert max(totals) <= cap
    assert cap < 2.0 * np.mean(totals)  # not padded to the worst case
    # never more slots than the largest rows hold (rounded up): 10 rows of 7
    assert graphs.graph_capacity(np.full(10, 7), 500) == 4096


def test_graphs_apply_only_to_single_process_gpu_steps():
    mult, rec = models.build("multvae", 30), models.build("recvae", 30)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graphs.graphs_apply(mult, cuda, "fp32") is None
    assert graphs.graphs_apply(mult, cuda, "bf16") is None
    assert graphs.graphs_apply(mult, cpu, "fp32") == "not on a GPU"
    assert graphs.graphs_apply(mult, cuda, "fp32", world=2) == "data-parallel"
    assert graphs.graphs_apply(rec, cuda, "bf16") is None  # a graph for each phase
    assert graphs.graphs_apply(models.build("ease", 30), cuda, "fp32") == "ease steps eagerly"
    assert graphs.graphs_apply(mult, cuda, "fp16") == "fp16"
    assert graphs.graphs_apply(mult, cuda, "fp32", data_on="host")
    assert graphs.graphs_apply(mult, cuda, "fp32", enabled=False)


def test_cpu_training_replays_no_graph_and_closed_forms_refuse_the_setting(tmp_path):
    from vaecf.data import synthetic
    from vaecf.errors import ConfigError

    df = synthetic.generate(n_users=300, n_items=60, n_groups=4, mean_items=10, seed=2)
    ds = vaecf.prepare_frame(df, tmp_path / "d", vaecf.PrepareSettings(heldout_users=30, seed=2))
    run = vaecf.train(ds, vaecf.TrainConfig(epochs=1, device="cpu", progress=False), tmp_path / "r")
    timing = rundir.load_results(run.run_dir)["timing"]
    assert timing["graph_steps"] == 0
    with pytest.raises(ConfigError, match="cuda_graphs="):
        vaecf.train(
            ds,
            vaecf.TrainConfig(cuda_graphs=False, progress=False),
            tmp_path / "e",
            model="ease",
        )


def test_no_graph_where_the_device_lacks_room_for_it(tmp_path, monkeypatch, capsys):
    """The graph's own activations and gradients are checked against the free memory first;
    short of it, the run says so and steps eagerly (here: a CPU run told graphs apply)."""
    from vaecf import memory
    from vaecf.data import synthetic

    asked = []
    real = memory.available_bytes
    monkeypatch.setattr(graphs, "graphs_apply", lambda *a, **k: asked.append(1))  # None: apply
    monkeypatch.setattr(memory, "available_bytes", lambda d: 0 if asked else real(d))
    df = synthetic.generate(n_users=300, n_items=60, n_groups=4, mean_items=10, seed=2)
    ds = vaecf.prepare_frame(df, tmp_path / "d", vaecf.PrepareSettings(heldout_users=30, seed=2))
    run = vaecf.train(ds, vaecf.TrainConfig(epochs=2, device="cpu"), tmp_path / "r")
    assert asked == [1]  # decided once for the run
    assert "CUDA graphs off: the GPU has less than" in capsys.readouterr().out
    assert rundir.load_results(run.run_dir)["timing"]["graph_steps"] == 0
    assert run.test_metrics["ndcg@100"] > 0


def test_the_dense_first_layer_padded_equals_the_unpadded(csr):
    """On a GPU "dense" pads its rows to 16-byte multiples (first_layer.dense_width): the
    product and the weight's gradient must be those of the unpadded array, in float32 and
    (under autocast) bf16."""
    assert first_layer.dense_width(20108, torch.bfloat16, torch.device("cuda")) == 20160
    assert first_layer.dense_width(20108, torch.float32, torch.device("cuda")) == 20108
    assert first_layer.dense_width(20112, torch.bfloat16, torch.device("cuda")) == 20112
    assert first_layer.dense_width(20108, torch.bfloat16, torch.device("cpu")) == 20108
    batch = csr.batch(torch.arange(50))
    n = csr.shape[1]
    probe = torch.linspace(-1, 1, 16)
    for dtype in (torch.float32, torch.bfloat16):
        got = []
        for width in (n, n + 61):
            w = torch.randn(n, 16, generator=torch.Generator().manual_seed(5), requires_grad=True)
            with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
                out = first_layer.dense_product(batch, w, batch.values, width)
            (out.float() * probe).sum().backward()
            got.append((out.detach(), w.grad))
        (a, ga), (b, gb) = got
        assert a.shape == b.shape == (50, 16) and ga.shape == gb.shape == (n, 16)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5)
