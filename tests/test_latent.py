"""Mult-VAE's Gaussian latent as one autograd function (models/latent.py): the sample and the KL
against plain autograd of the textbook formulas, their gradients by finite differences, and the
noise drawn as the model always drew it."""

import pytest
import torch

from vaecf.models.latent import GaussianSampleKL, sample_and_kl


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
