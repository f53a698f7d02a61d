"""The sparse model against a straightforward dense implementation, in float64."""

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from vaecf import runtime
from vaecf.data.matrix import CSR
from vaecf.models.multvae import ModelConfig, MultDAE, MultVAE, Scorer, build_model


def dense_loss(model, x: torch.Tensor, beta: float, eps: torch.Tensor | None):
    """The paper's graph on a dense (B, n_items) input, dropout off."""
    h = F.normalize(x, dim=1)  # l2_normalize
    h = h @ model.in_weight + model.in_bias
    layers = list(model.encoder)
    if layers or not model.variational:
        h = torch.tanh(h)
    for i, layer in enumerate(layers):
        h = h @ layer.weight.T + layer.bias
        if i < len(layers) - 1:
            h = torch.tanh(h)
    if model.variational:
        d = model.config.latent_dim
        mu, logvar = h[:, :d], h[:, d:]
        z = mu + eps * torch.exp(0.5 * logvar)
        kl = torch.mean(torch.sum(0.5 * (-logvar + torch.exp(logvar) + mu**2 - 1), dim=1))
    else:
        z, kl = h, torch.zeros((), dtype=x.dtype)
    h = z
    for i, layer in enumerate(model.decoder):
        h = h @ layer.weight.T + layer.bias
        if i < len(model.decoder) - 1:
            h = torch.tanh(h)
    nll = -torch.mean(torch.sum(F.log_softmax(h, 1) * x, dim=1))
    reg = model.config.weight_decay * sum((w**2).sum() for w in model.weights())
    return nll + beta * kl + reg


@pytest.mark.parametrize("kind", ["multvae", "multdae"])
def test_sparse_loss_and_gradients_equal_dense(kind):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n_users, n_items = 13, 40
    x = (rng.random((n_users, n_items)) < 0.15).astype(np.float64)
    x[3] = 0
    x[3, 7] = 1  # a user with one item
    x[5, :] = 0  # and one with none
    model = (
        build_model(
            n_items,
            ModelConfig(
                kind,
                hidden_dims=[16] if kind == "multvae" else [],
                latent_dim=8,
                dropout=0.0,
                weight_decay=0.01,
            ),
        )
        .double()
        .train()
    )
    batch = CSR.from_scipy(sp.csr_matrix(x)).batch(torch.arange(n_users))
    batch.values = batch.values.double()

    torch.manual_seed(1)
    loss_sparse, _ = model.loss(batch, beta=0.3)
    grads_sparse = torch.autograd.grad(loss_sparse, list(model.parameters()))

    torch.manual_seed(1)  # the same eps as the sparse pass drew
    eps = torch.randn(n_users, 8, dtype=torch.float64)
    loss_dense = dense_loss(model, torch.tensor(x), 0.3, eps if model.variational else None)
    grads_dense = torch.autograd.grad(loss_dense, list(model.parameters()))

    assert loss_sparse.item() == pytest.approx(loss_dense.item(), rel=1e-12)
    for gs, gd in zip(grads_sparse, grads_dense):
        torch.testing.assert_close(gs, gd, rtol=1e-10, atol=1e-12)


def test_architecture_is_the_papers():
    vae = MultVAE(1000)
    shapes = [tuple(p.shape) for p in vae.parameters()]
    assert shapes == [
        (1000, 600),
        (600,),
        (400, 600),
        (400,),
        (600, 200),
        (600,),
        (1000, 600),
        (1000,),
    ]
    assert vae.config.weight_decay == 0.0 and vae.config.dropout == 0.5
    dae = MultDAE(1000)
    assert [tuple(p.shape) for p in dae.parameters()] == [(1000, 200), (200,), (1000, 200), (1000,)]
    assert dae.config.weight_decay == 0.01
    # Glorot-uniform weights, tiny biases
    bound = np.sqrt(6 / (1000 + 600))
    assert vae.in_weight.abs().max() <= bound and vae.in_weight.abs().max() > 0.9 * bound
    assert vae.in_bias.abs().max() <= 0.002


def test_eval_is_deterministic_and_uses_mu():
    torch.manual_seed(0)
    model = MultVAE(50).eval()
    batch = CSR.from_scipy(
        sp.random(4, 50, density=0.2, format="csr", random_state=0, dtype=np.float32)
    ).batch(torch.arange(4))
    a, mu, _ = model(batch)
    b, _, _ = model(batch)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, model.decode(mu))
    model.train()
    c, _, _ = model(batch)
    assert not torch.equal(a, c)  # dropout and sampling in training


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_output_layer_matches_autograd(precision):
    from vaecf.models.fused import linear_multinomial_nll
    from vaecf.models.multvae import multinomial_nll

    torch.manual_seed(0)
    n_items = 3000  # several row chunks on the CPU
    h = torch.randn(70, 32, requires_grad=True)
    lin = torch.nn.Linear(32, n_items)
    m = sp.random(70, n_items, density=0.01, format="csr", random_state=0, dtype=np.float32)
    m.data[:] = 1
    batch = CSR.from_scipy(m).batch(torch.arange(70))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.no_grad()
    if precision == "fp32":
        import contextlib

        ctx = contextlib.nullcontext()
    with ctx:
        fused = linear_multinomial_nll(h, lin.weight, lin.bias, batch)
    g_fused = torch.autograd.grad(fused, [h, lin.weight, lin.bias])
    with ctx:
        plain = multinomial_nll(lin(h), batch) * 70
    g_plain = torch.autograd.grad(plain, [h, lin.weight, lin.bias])
    for a in g_fused:
        assert a.dtype == torch.float32
    if precision == "fp32":
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
        for a, b in zip(g_fused, g_plain):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        return
    # bf16: both are rounded; each must be as close to the float64 truth as plain autograd is
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, lin.weight, lin.bias))
    batch64 = CSR.from_scipy(m.astype(np.float64)).batch(torch.arange(70))
    truth = multinomial_nll(torch.addmm(b64, h64, w64.t()), batch64) * 70
    g_truth = torch.autograd.grad(truth, [h64, w64, b64])

    def err(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    assert err(fused, truth) < 1e-2
    for a, b, t in zip(g_fused, g_plain, g_truth):
        assert err(a, t) < 1e-2
        assert err(a, t) <= 1.25 * err(b, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_softmax_with_bias_equals_float64(dtype):
    """The CPU's sweep against float64 over several chunks: softmax(logits + bias) in the
    buffer, each row's log-sum-exp read off its largest probability."""
    from vaecf.models.fused import softmax_chunked

    torch.manual_seed(5)
    logits, bias = torch.randn(120, 3000) * 4, torch.randn(3000)
    buffer = logits.to(dtype)
    z = buffer.double() + bias.double()
    lse = softmax_chunked(buffer, torch.float32, bias)
    p = torch.softmax(z, dim=1)
    torch.testing.assert_close(lse.double(), torch.logsumexp(z, dim=1), rtol=1e-6, atol=1e-5)
    step = 1e-6 if dtype == torch.float32 else 2**-8  # the buffer rounds to its dtype
    torch.testing.assert_close(buffer.double(), p, rtol=step, atol=1e-7)


def test_fused_half_width_loss_is_the_float64_loss_of_its_rounded_logits():
    """Under bf16 the product's output is rounded once; from there (on a CPU the bias added
    in float32, the log-sum-exp and the softmax) all is float32: the loss must be the float64
    loss of those logits to float32 accuracy."""
    from vaecf.models.fused import linear_multinomial_nll

    torch.manual_seed(2)
    n_items = 3000  # several row chunks
    h, lin = torch.randn(50, 32), torch.nn.Linear(32, n_items)
    m = sp.random(50, n_items, density=0.01, format="csr", random_state=3, dtype=np.float32)
    m.data[:] = 1
    batch = CSR.from_scipy(m).batch(torch.arange(50))
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fused = linear_multinomial_nll(h, lin.weight, lin.bias, batch)
        bf = torch.bfloat16
        logits = (h.to(bf) @ lin.weight.to(bf).t()).double() + lin.bias.double()
    x = torch.from_numpy(m.toarray()).double()
    want = (x.sum(1) * torch.logsumexp(logits, dim=1) - (x * logits).sum(1)).sum()
    assert fused.dtype == torch.float32
    assert abs(fused.double() - want) / want < 1e-6


@pytest.mark.parametrize("kind", ["multvae", "multdae"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scorer_equals_the_models_eval_forward(kind, dtype):
    torch.manual_seed(0)
    x = sp.random(9, 50, density=0.2, format="csr", random_state=1, dtype=np.float32)
    x.data[:] = 1.0
    model = build_model(50, ModelConfig(kind, latent_dim=8)).to(dtype).eval()
    scorer = Scorer(model)
    assert (scorer.weight_t is not None) == (dtype == torch.float32)  # transposed: fp32 CPU
    assert Scorer(model, precision="bf16").weight_t is None  # autocast: nn.Linear layout
    batch = CSR.from_scipy(x).batch(torch.arange(9))
    with torch.no_grad():
        want = model(batch)[0]
        got = scorer(batch)
    assert got.shape == (9, 50) and got.dtype == dtype
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["multvae", "multdae"])
@pytest.mark.parametrize("hidden", [(), (12,), (16, 12)])
def test_one_history_in_numpy_equals_the_batched_scores(kind, hidden, monkeypatch):
    """A one-row batch on a CPU runs the small layers in numpy (models/onerow.py): the same
    scores as that row in a batch, for weighted and empty histories alike."""
    torch.manual_seed(0)
    x = sp.random(6, 50, density=0.2, format="csr", random_state=1, dtype=np.float32)
    x[2] = 0  # an empty history
    x.eliminate_zeros()
    x.data *= 3  # weights, not only ones: the L2 norm matters
    model = build_model(50, ModelConfig(kind, latent_dim=8, hidden_dims=hidden)).eval()
    scorer = Scorer(model)
    assert scorer.one_row is not None and Scorer(model, precision="bf16").one_row is None
    # the output layer in numpy's BLAS (AMD CPUs) or PyTorch's (elsewhere): both are checked
    monkeypatch.setattr(runtime, "numpy_gemv_faster", lambda: True)
    numpy_out = Scorer(model)
    assert numpy_out.one_row_out is not None
    csr = CSR.from_scipy(x)
    with torch.no_grad():
        want = model(csr.batch(torch.arange(6)))[0]
        for r in range(6):
            for s in (scorer, numpy_out):
                got = s(csr.batch(torch.tensor([r])))
                assert got.shape == (1, 50) and got.dtype == torch.float32
                torch.testing.assert_close(got[0], want[r], atol=1e-5, rtol=1e-5)


def test_one_blas_thread_holds_numpy_blas_to_the_calling_thread_and_restores_it():
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    with threadpool_limits(limits=2, user_api="blas"):  # the suite runs on one thread
        before = blas_threads()
        assert set(before) == {2}
        with runtime.one_blas_thread():
            assert set(blas_threads()) == {1}
        assert blas_threads() == before


@pytest.mark.parametrize("given, seen", [(None, runtime.OPENBLAS_SPIN), ("28", "28")])
def test_importing_vaecf_shortens_openblas_spin_before_scipys_copy_loads(given, seen):
    """OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when it loads: `import vaecf` sets it (keeping a
    value the user set) and loads no scipy.linalg, whose OpenBLAS the linear models' solves use."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if given:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    code = "import os, sys, vaecf; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])\n"
    code += "print('scipy.linalg' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [seen, "False"]


@pytest.mark.parametrize("n_layers", [1, 3])
def test_recvae_one_history_in_numpy_equals_the_batched_scores(n_layers):
    """RecVAE's encoder for one history in numpy (swish, layer norms with their affine
    weights, dense skips): the batched scores; the hybrid, whose scores add a path, keeps
    PyTorch for one history too."""
    from vaecf import models

    torch.manual_seed(0)
    cfg = {"hidden_dim": 16, "latent_dim": 6, "n_layers": n_layers}
    model = models.build("recvae", 50, cfg).eval()
    with torch.no_grad():
        for norm in model.encoder.norms:  # not LayerNorm's initial ones and zeros
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.2, 0.2)
    x = sp.random(6, 50, density=0.2, format="csr", random_state=1, dtype=np.float32)
    x[2] = 0  # an empty history
    x.eliminate_zeros()
    x.data *= 3
    csr = CSR.from_scipy(x)
    hybrid = models.build("recvae-edlae", 50, cfg).eval()
    with torch.no_grad():
        want = model.scores(csr.batch(torch.arange(6)))
        for r in range(6):
            one = csr.batch(torch.tensor([r]))
            torch.testing.assert_close(model.scorer()(one)[0], want[r], atol=1e-5, rtol=1e-5)
            assert torch.equal(hybrid.scorer()(one), hybrid.scores(one))


def test_fused_output_layer_with_an_offset_matches_autograd():
    """The hybrid's extra logits: loss and every gradient, the offset's included."""
    from vaecf.models.fused import linear_multinomial_nll
    from vaecf.models.multvae import multinomial_nll

    torch.manual_seed(1)
    n_items = 2500
    h = torch.randn(40, 16, requires_grad=True)
    lin = torch.nn.Linear(16, n_items)
    alpha = torch.tensor(3.0, requires_grad=True)
    base = torch.randn(40, n_items)
    m = sp.random(40, n_items, density=0.01, format="csr", random_state=2, dtype=np.float32)
    m.data[:] = 1
    batch = CSR.from_scipy(m).batch(torch.arange(40))
    fused = linear_multinomial_nll(h, lin.weight, lin.bias, batch, alpha * base)
    g_fused = torch.autograd.grad(fused, [h, lin.weight, alpha])
    plain = multinomial_nll(lin(h) + alpha * base, batch) * 40
    g_plain = torch.autograd.grad(plain, [h, lin.weight, alpha])
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-4)
    for a, b in zip(g_fused, g_plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_logits_give_the_unpadded_loss_and_gradients(dtype):
    """On a GPU the logits' rows are padded to a multiple of 64 (zero weights, -inf bias): the
    loss and every gradient, the offset's included, must be those of the unpadded layer (2,500
    items: padded to 2,560 at 64, 2,500 at 1)."""
    from vaecf.models.fused import linear_multinomial_nll, logits_width

    assert logits_width(2500, torch.device("cpu")) == 2500
    assert logits_width(2500, torch.device("cpu"), 64) == 2560
    assert logits_width(2560, torch.device("cpu"), 64) == 2560
    torch.manual_seed(3)
    n_items = 2500
    h = torch.randn(40, 16, dtype=dtype, requires_grad=True)
    w = torch.randn(n_items, 16, dtype=dtype, requires_grad=True)
    b = torch.randn(n_items, dtype=dtype, requires_grad=True)
    base = torch.randn(40, n_items, dtype=dtype, requires_grad=True)
    m = sp.random(40, n_items, density=0.01, format="csr", random_state=4, dtype=np.float32)
    m.data[:] = 1
    batch = CSR.from_scipy(m).batch(torch.arange(40))
    got = {}
    for multiple in (1, 64):
        loss = linear_multinomial_nll(h, w, b, batch, base, multiple=multiple)
        got[multiple] = (loss, *torch.autograd.grad(loss, [h, w, b, base]))
    for a, c in zip(got[1], got[64]):
        assert a.shape == c.shape and a.dtype == c.dtype
        tol = {} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-3}
        torch.testing.assert_close(a, c, **tol)


def test_an_explicit_hidden_layer_is_honoured_for_either_model():
    """Unset, each model gets the paper's network (Mult-VAE [600], Mult-DAE []); given, the
    layers are what was asked for, [600] included (it was silently dropped for Mult-DAE)."""
    from vaecf import models

    assert models.config_from_dict("multvae").hidden_dims == [600]
    assert models.config_from_dict("multdae").hidden_dims == []
    assert models.config_from_dict("multdae", {"hidden_dims": [600]}).hidden_dims == [600]
    assert models.config_from_dict("multvae", {"hidden_dims": []}).hidden_dims == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gpus_whole_row_softmax_equals_the_chunked_one(dtype):
    """The GPU's softmax (whole rows, the log-sum-exp read off the largest probability) against
    the CPU's chunked in-place sweep: equal in float32; in bf16 within one bf16 step (2^-7
    relative: the two round differently, and with native bf16 kernels torch.softmax's own
    rounding can land on the neighbouring value)."""
    from vaecf.models.fused import softmax_chunked, softmax_whole

    torch.manual_seed(4)
    logits = (torch.randn(300, 5000) * 3).to(dtype)
    probs, lse = softmax_whole(logits.clone(), torch.float32)
    buffer = logits.clone()
    want = softmax_chunked(buffer, torch.float32)
    tol = 1e-6 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(lse, want, rtol=tol, atol=tol)
    step = 1e-6 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(probs.float(), buffer.float(), rtol=step, atol=1e-7)
    assert lse.dtype == torch.float32 and probs.dtype == dtype


def test_column_sums_in_row_chunks_equal_float64():
    from vaecf.models.fused import column_sums

    g = torch.randn(130, 40_000).to(torch.bfloat16)  # 26 rows a chunk: five chunks, one short
    got = column_sums(g, torch.float32)
    assert got.dtype == torch.float32 and got.shape == (40_000,)
    torch.testing.assert_close(got.double(), g.double().sum(0), rtol=1e-6, atol=1e-5)
    assert torch.equal(column_sums(g.float(), torch.float32), g.float().sum(0))  # no chunks


def test_the_weight_gradient_in_pieces_equals_one_product():
    from vaecf.models.fused import weight_grad

    torch.manual_seed(0)
    g = torch.randn(8, 9000).to(torch.bfloat16)  # 9,000 items: three pieces, one short
    h = torch.randn(8, 16).to(torch.bfloat16)
    got = weight_grad(g, h, 8990, torch.float32)  # the last 10 columns are padding
    want = (g.t() @ h)[:8990].float()
    assert got.dtype == torch.float32 and got.shape == (8990, 16)
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-6)  # bf16: at most one rounding
    g32, h32 = g.float(), h.float()  # float32: one product, as before
    assert torch.equal(weight_grad(g32, h32, 8990, torch.float32), (g32.t() @ h32)[:8990])
