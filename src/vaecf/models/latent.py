"""Mult-VAE's Gaussian latent as one autograd function: the sample z = mu + eps * exp(logvar / 2)
and the KL divergence of N(mu, exp(logvar)) from N(0, I), summed over the batch.

Written as plain autograd, these are ~30 small elementwise operations a step (forward and
backward, the split of the encoder's output into mu and logvar and its gradient's re-assembly
among them); on a GPU each is a kernel of a few microseconds, and at the paper's batch of 500
a step is bound by how many kernels it runs rather than by its arithmetic. Here they are ~17:
the forward keeps the sample's noise and the variance, and the backward is written out,

    d z / d mu = 1              d z / d logvar = noise / 2           (noise = eps * std)
    d KL / d mu = mu            d KL / d logvar = (exp(logvar) - 1) / 2

The arithmetic runs in float32 whatever the encoder's dtype (float64 stays float64): under
bf16 autocast mu and logvar arrive in bf16, and the KL is a reduction.
"""

from __future__ import annotations

import torch


class GaussianSampleKL(torch.autograd.Function):
    """(z (B, d), KL summed over the batch) from h = [mu | logvar] (B, 2d) and eps (B, d),
    standard normal noise (zeros: z = mu)."""

    @staticmethod
    def forward(ctx, h, eps):
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        d = h.shape[1] // 2
        with torch.autocast(h.device.type, enabled=False):
            hf = h.to(acc)
            mu, logvar = hf[:, :d], hf[:, d:]
            std = torch.exp(0.5 * logvar)
            var = std * std
            kl = 0.5 * (torch.addcmul(var - logvar, mu, mu).sum() - mu.numel())
            noise = eps.to(acc) * std
        ctx.save_for_backward(mu, noise, var)
        ctx.h_dtype = h.dtype
        return mu + noise, kl

    @staticmethod
    def backward(ctx, grad_z, grad_kl):
        mu, noise, var = ctx.saved_tensors  # an unused output's gradient comes as zeros
        grad_mu = torch.addcmul(grad_z, mu, grad_kl)
        grad_logvar = 0.5 * torch.addcmul(grad_z * noise, var - 1.0, grad_kl)
        return torch.cat([grad_mu, grad_logvar], dim=1).to(ctx.h_dtype), None


def sample_and_kl(h: torch.Tensor, sample: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(z, KL summed over the batch) from the encoder's output h = [mu | logvar]; `sample`:
    z = mu + eps * std with eps drawn as `torch.randn_like(mu)` (training), else z = mu."""
    d = h.shape[1] // 2
    mu = h[:, :d]
    eps = torch.randn_like(mu) if sample else torch.zeros_like(mu)
    return GaussianSampleKL.apply(h, eps)
