"""Serving copies (vaecf.models.serving): int8 item layers against a float64 reference."""

import numpy as np
import pytest
import torch
from torch import nn

import vaecf
from vaecf import models
from vaecf.data.vocab import Vocabulary
from vaecf.errors import ConfigError
from vaecf.models import serving
from vaecf.models.base import cosine_neighbours, vector_norms
from vaecf.models.multvae import Scorer
from vaecf.models.serving import INT8_KERNEL_ROWS, Int8Linear, serving_copy


def _linear(n_in, n_out, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(n_in, n_out)
    with torch.no_grad():  # rows of very different sizes: per-row scales matter
        lin.weight.mul_(torch.logspace(-3, 1, n_out)[:, None])
    return lin


def _quantized(a):
    """float64 numpy: each row of `a` as scale * round(a / scale), scale = max|row| / 127."""
    scale = np.abs(a).max(axis=1, keepdims=True) / 127
    return np.clip(np.round(a / scale), -127, 127) * scale


def _reference(lin, x, int8_x=False):
    """float64 numpy: x @ (scale * q)^T + b, q = round(w / scale), scale = max|row| / 127;
    with `int8_x`, x's rows quantized the same way first."""
    w = _quantized(lin.weight.detach().double().numpy())
    x = x.double().numpy()
    return (_quantized(x) if int8_x else x) @ w.T + lin.bias.detach().double().numpy()


@pytest.mark.parametrize("n_in", [600, 200, 37, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("deq_rows", [2048, 64])
def test_int8_linear_matches_the_reference_at_every_batch_size(n_in, dtype, deq_rows, monkeypatch):
    monkeypatch.setattr(serving, "DEQ_ROWS", deq_rows)  # 64: 301 rows in five blocks
    lin = _linear(n_in, 301)
    q = Int8Linear(lin, dtype)
    assert q.q.dtype == torch.int8 and q.q.shape[1] % 64 == 0
    w = lin.weight.detach().double()
    err = (w - q.dequantized().double()).abs().max(dim=1).values
    rel = 2**-8 if dtype == torch.bfloat16 else 1e-6
    assert bool((err <= w.abs().max(dim=1).values * (0.5 / 127 + rel)).all())
    for rows in (1, INT8_KERNEL_ROWS, INT8_KERNEL_ROWS + 1, 50):
        x = torch.randn(rows, n_in)
        path = q.small if rows <= INT8_KERNEL_ROWS else q.large
        kernel = path == "kernel"  # it takes bf16 activations
        want = _reference(lin, x.to(torch.bfloat16 if kernel else dtype).float(), path == "int8")
        got = q(x)
        assert got.dtype == dtype and got.shape == (rows, 301)
        scale = np.abs(want).max()
        tol = 0.02 * scale if dtype == torch.bfloat16 or kernel else 1e-4 * scale
        if path == "fbgemm":  # each row rounded to 7 bits over +-max|x_row|: at most half a
            step = (2 * x.abs().amax(1) / 127).double().numpy()  # step per input, times the
            rows_l1 = q.dequantized().double().abs().sum(1).numpy()  # weight row's sum of |w|
            tol = tol + step[:, None] / 2 * rows_l1[None, :]
        assert (np.abs(got.double().numpy() - want) <= tol).all(), path


@pytest.mark.parametrize("path", ["int8", "kernel", "fbgemm", "blocks"])
def test_every_path_gives_the_same_scores(path):
    """Each path multiplies by the same int8 weights; int8 x int8 (and fbgemm's 7-bit rows)
    also round the input, which moves the scores by less than rounding the weights did."""
    lin = _linear(600, 301)
    q = Int8Linear(lin, torch.float32)
    available = {
        "int8": serving.int8_products("cpu"),
        "kernel": hasattr(torch, "_weight_int8pack_mm"),
        "fbgemm": "fbgemm" in torch.backends.quantized.supported_engines,
        "blocks": True,
    }
    if not available[path]:
        pytest.skip(f"this PyTorch has no {path} product")
    q.small = q.large = path
    x = torch.tanh(torch.randn(4, 600))  # a hidden layer's output
    exact = x.double().numpy() @ lin.weight.detach().double().numpy().T
    exact += lin.bias.detach().double().numpy()
    err = np.abs(q(x).double().numpy() - exact).max()
    err_w = np.abs(_reference(lin, x) - exact).max()  # from the weights' rounding alone
    # fbgemm rounds each row to 7 bits over +-max|x_row| (twice int8 x int8's steps): 2.9x
    # the weights' rounding here
    allowed = 4 if path == "fbgemm" else 2
    assert err <= allowed * err_w + 1e-3 * np.abs(exact).max()


def test_a_rows_int8_scores_do_not_depend_on_the_rest_of_its_batch():
    """The small batches' path scores each row alone: the same bits whatever else is in the
    batch (a file scored in chunks equals the same users recommended in other batches)."""
    q = Int8Linear(_linear(600, 301), torch.float32)
    x = torch.tanh(torch.randn(6, 600))
    other = x.clone()
    other[1:] = 3 * torch.randn(5, 600)  # other rows, other ranges and signs
    alone = torch.cat([q(x[i : i + 1]) for i in range(6)])
    assert torch.equal(q(x), alone), q.small
    assert torch.equal(q(other)[0], alone[0]), q.small


def test_int8_linear_keeps_one_copy_of_the_weight():
    """Its buffers hold the int8 rows once; the only other copy is fbgemm's packed one, where
    that path serves small batches (x86 without VNNI)."""
    lin = _linear(600, 2000)
    q = Int8Linear(lin, torch.float32)
    assert (q.packed is not None) == (q.small == "fbgemm")
    held = sum(t.untyped_storage().nbytes() for t in q.buffers())
    # int8 rows (600 padded to 640) + fp32 and bf16 scales + fp32 bias: no float copy
    assert held == 2000 * 640 + 2000 * (4 + 2 + 4)
    assert held < 0.3 * lin.weight.numel() * 4
    assert q.weight.dtype == torch.int8 and q.weight.data_ptr() == q.q.data_ptr()


def test_similar_items_from_int8_rows_are_the_dequantized_weights_cosines():
    q = Int8Linear(_linear(600, 500), torch.float32)
    for idx in (0, 123, 499):
        i8, s8 = cosine_neighbours(q.weight, idx, 20, vector_norms(q.weight))
        ref, sr = cosine_neighbours(q.dequantized(), idx, 20)
        np.testing.assert_allclose(s8, sr, atol=1e-5)  # the same similarities, scale-free
        assert len(set(i8) & set(ref)) >= 18  # the same items, up to near-ties


def test_products_that_give_wrong_answers_are_not_used(monkeypatch):
    monkeypatch.setattr(
        torch, "_weight_int8pack_mm", lambda x, q, s: torch.full((x.shape[0], q.shape[0]), 1e30)
    )
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: torch.ones(a.shape[0], b.shape[1]))
    monkeypatch.setattr(
        torch.ops.quantized, "linear_dynamic", lambda x, w, r: torch.zeros(x.shape[0], 30)
    )
    serving.int8_products.cache_clear()
    q = Int8Linear(_linear(40, 30), torch.float32)
    serving.int8_products.cache_clear()
    assert q.small == q.large == "blocks"
    x = torch.randn(1, 40)
    np.testing.assert_allclose(q(x).double().numpy(), _reference(_linear(40, 30), x), atol=1e-4)


def test_int8_products_are_used_where_they_work():
    # the CPU build of the pinned PyTorch has it on this project's CPUs with VNNI; if this
    # fails there, the fast path is lost
    if not serving.int8_products("cpu"):
        pytest.skip("this CPU has no int8 dot-product instructions (VNNI, AMX)")
    q = Int8Linear(_linear(600, 500), torch.bfloat16)
    assert (q.small, q.large) == ("int8", "int8")
    torch.manual_seed(0)
    net, _ = serving_copy(models.build("multvae", 300), "int8")
    assert net.decoder[0].weight.dtype == torch.float32


def test_a_saturating_int8_product_is_refused(monkeypatch):
    """oneDNN's int8 product without VNNI clips its 16-bit pair sums: such a product must not
    be used; the weight-only kernel serves small batches and dequantized blocks large ones."""

    def saturating(a, b):  # a + 128 as u8 times b, pair sums clipped to int16 (vpmaddubsw)
        u = (a.long() + 128).view(a.shape[0], 1, -1, 2)
        pairs = (u * b.t().long().reshape(1, b.shape[1], -1, 2)).sum(-1).clamp(-32768, 32767)
        return (pairs.sum(-1) - 128 * b.long().sum(0)).to(torch.int32)  # the +128 taken back

    monkeypatch.setattr(torch, "_int_mm", saturating)
    serving.int8_products.cache_clear()
    try:
        assert not serving.int8_products("cpu")
        q = Int8Linear(_linear(600, 500), torch.bfloat16)
        torch.manual_seed(0)
        net, _ = serving_copy(models.build("multvae", 300), "int8")
    finally:
        serving.int8_products.cache_clear()
    fbgemm = "fbgemm" in torch.backends.quantized.supported_engines  # x86
    assert (q.small, q.large) == ("fbgemm" if fbgemm else "kernel", "blocks")
    native = serving.prec.native_bf16(net.device)
    assert net.decoder[0].weight.dtype == (torch.bfloat16 if native else torch.float32)


def _model_batch_scores(name):
    """An untrained `name` over 300 items, a batch of two histories and its fp32 scores."""
    torch.manual_seed(0)
    net = models.build(name, 300)
    rec = vaecf.Recommender(net, Vocabulary(list(range(300))))
    batch = rec.batch_of(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([3, 2]))
    with torch.no_grad():
        return net, batch, net.scores(batch)


@pytest.mark.parametrize("name", ["multvae", "multdae", "recvae"])
def test_int8_copy_quantizes_the_item_layers_only(name):
    net, batch, want = _model_batch_scores(name)
    net8, fn = serving_copy(net, "int8")
    q = [m for m in net8.modules() if isinstance(m, Int8Linear)]
    assert len(q) == 1 and q[0].q.shape[0] == 300
    assert not any(isinstance(m, nn.Linear) and m.out_features == 300 for m in net8.modules())
    with torch.no_grad():
        got = fn(batch).float()
    top = lambda s: set(s.topk(20, dim=1).indices.flatten().tolist())  # noqa: E731
    assert len(top(got) & top(want)) >= 0.9 * len(top(want))
    assert torch.allclose(got, want, atol=0.05 * float(want.abs().max()))


def test_int8_is_refused_for_models_without_an_item_layer():
    with pytest.raises(ConfigError, match="int8 applies to"):
        serving_copy(models.build("popular", 10), "int8")
    with pytest.raises(ConfigError, match="precision must be one of"):
        serving_copy(models.build("multvae", 10), "int4")


@pytest.mark.parametrize("name", ["multvae", "recvae"])
def test_fp32_copy_keeps_one_copy_of_the_item_layer(name):
    net, batch, want = _model_batch_scores(name)
    net32, fn = serving_copy(net, "fp32")
    outs = [m for m in net32.modules() if isinstance(m, nn.Linear) and m.out_features == 300]
    assert len(outs) == 1 and outs[0].weight.t().is_contiguous()  # stored transposed
    if name == "multvae":  # its score function reads that storage, not a transposed copy
        assert Scorer(net32).weight_t.data_ptr() == outs[0].weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(fn(batch), want, rtol=1e-5, atol=1e-5)
