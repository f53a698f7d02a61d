"""Mult-VAE's and RecVAE's latents as autograd functions (models/latent.py): the sample and the
KL against plain autograd of the textbook formulas, their gradients by finite differences, and
the noise drawn as the models always drew it."""

import math

import pytest
import torch

from vaecf.models.latent import (
    CompositePriorSampleKL,
    GaussianSampleKL,
    composite_sample_kl,
    sample_and_kl,
)


def reference(h, eps):
    """The textbook formulas under plain autograd."""
    d = h.shape[1] // 2
    mu, logvar = h[:, :d].double(), h[:, d:].double()
    z = mu + eps.double() * torch.exp(0.5 * logvar)
    kl = (0.5 * (-logvar + logvar.exp() + mu * mu - 1.0)).sum()
    return z, kl


def test_gradients_equal_finite_differences():
    torch.manual_seed(0)
    h = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    eps = torch.randn(5, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: GaussianSampleKL.apply(x, eps), (h,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_kl_and_gradients_equal_plain_autograd(dtype):
    torch.manual_seed(1)
    h = (torch.randn(7, 8) * 2).to(dtype).requires_grad_()
    eps = torch.randn(7, 4).to(dtype)
    z, kl = GaussianSampleKL.apply(h, eps)
    assert z.dtype == kl.dtype == torch.float32  # computed in float32 from bf16 inputs
    w = torch.randn(7, 4)  # a downstream loss that weighs each z, and the KL by 0.3
    (gh,) = torch.autograd.grad((z * w).sum() + 0.3 * kl, h)
    ref = h.detach().double().requires_grad_()
    rz, rkl = reference(ref, eps)
    (rgh,) = torch.autograd.grad((rz * w.double()).sum() + 0.3 * rkl, ref)
    torch.testing.assert_close(z.double(), rz, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kl.double(), rkl, rtol=1e-6, atol=1e-5)
    assert gh.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2**-7  # bf16: the gradient rounded once
    torch.testing.assert_close(gh.double(), rgh.to(dtype).double(), rtol=tol, atol=tol)


def test_the_noise_is_drawn_as_randn_like_mu_and_eval_takes_the_mean():
    h = torch.randn(4, 6)
    torch.manual_seed(5)
    z, kl = sample_and_kl(h, sample=True)
    torch.manual_seed(5)
    eps = torch.randn_like(h[:, :3])
    torch.testing.assert_close(z, h[:, :3] + eps * torch.exp(0.5 * h[:, 3:]))
    z0, kl0 = sample_and_kl(h, sample=False)
    assert torch.equal(z0, h[:, :3]) and torch.equal(kl0, kl)  # the KL does not depend on eps


LOG_W = torch.log(torch.tensor([0.15, 0.75, 0.10]))


def log_normal(z, mu, logvar):
    return -0.5 * (logvar + math.log(2 * math.pi) + (z - mu) ** 2 * torch.exp(-logvar))


def composite_reference(mu, logvar, eps, pm, plv, w, wide_logvar=10.0):
    """RecVAE's latent as its authors write it, under plain autograd in float64: z, then
    log q(z|x) - log p(z) with p the three-component mixture, summed per user."""
    mu, logvar = mu.double(), logvar.double()
    z = mu + eps.double() * torch.exp(0.5 * logvar)
    zero = torch.zeros((), dtype=torch.float64)
    parts = (
        torch.stack(
            [
                log_normal(z, zero, zero),
                log_normal(z, pm.double(), plv.double()),
                log_normal(z, zero, zero + wide_logvar),
            ],
            dim=-1,
        )
        + LOG_W.double()
    )
    kl = (log_normal(z, mu, logvar) - torch.logsumexp(parts, dim=-1)).sum(1)
    return z, kl.sum(), (w.double() * kl).sum()


def composite_inputs(dtype, b=6, d=5, seed=2):
    g = torch.Generator().manual_seed(seed)
    mu = (torch.randn(b, d, generator=g) * 1.5).to(dtype).requires_grad_()
    logvar = (torch.randn(b, d, generator=g) - 1).to(dtype).requires_grad_()
    eps = torch.randn(b, d, generator=g).to(dtype)
    pm = (torch.randn(b, d, generator=g) * 1.5).to(dtype)
    plv = (torch.randn(b, d, generator=g) - 1).to(dtype)
    w = torch.rand(b, generator=g) * 3
    return mu, logvar, eps, pm, plv, w


def test_recvae_latent_gradients_equal_finite_differences():
    mu, logvar, eps, pm, plv, w = composite_inputs(torch.float64)

    def f(m, lv):
        z, kl, term = CompositePriorSampleKL.apply(m, lv, eps, pm, plv, LOG_W, 10.0, w)
        return z, kl, term

    assert torch.autograd.gradcheck(f, (mu, logvar))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recvae_latent_and_gradients_equal_plain_autograd(dtype):
    mu, logvar, eps, pm, plv, w = composite_inputs(dtype)
    z, kl, term = CompositePriorSampleKL.apply(mu, logvar, eps, pm, plv, LOG_W, 10.0, w)
    assert z.dtype == kl.dtype == term.dtype == torch.float32
    v = torch.randn(z.shape, generator=torch.Generator().manual_seed(3))  # a downstream loss
    got = torch.autograd.grad((z * v).sum() + 0.7 * term + 0.2 * kl, [mu, logvar])
    ref = [t.detach().double().requires_grad_() for t in (mu, logvar)]
    rz, rkl, rterm = composite_reference(*ref, eps, pm, plv, w)
    want = torch.autograd.grad((rz * v.double()).sum() + 0.7 * rterm + 0.2 * rkl, ref)
    torch.testing.assert_close(z.double(), rz, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kl.double(), rkl, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(term.double(), rterm, rtol=1e-6, atol=1e-4)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 2**-7  # bf16: the gradient rounded once
        torch.testing.assert_close(a.double(), b.to(dtype).double(), rtol=tol, atol=tol)


def test_recvae_latent_draws_noise_as_randn_like_mu_and_eval_takes_the_mean():
    mu, logvar, _, pm, plv, w = (t.detach() for t in composite_inputs(torch.float32))
    torch.manual_seed(7)
    z, kl, term = composite_sample_kl(mu, logvar, pm, plv, LOG_W, 10.0, w, sample=True)
    torch.manual_seed(7)
    eps = torch.randn_like(mu)
    rz, rkl, rterm = composite_reference(mu, logvar, eps, pm, plv, w)
    torch.testing.assert_close(z.double(), rz, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(term.double(), rterm, rtol=1e-6, atol=1e-4)
    z0, _, _ = composite_sample_kl(mu, logvar, pm, plv, LOG_W, 10.0, w, sample=False)
    assert torch.equal(z0, mu)
