"""The autoencoders' Gaussian latents as autograd functions: the sample z = mu + eps *
exp(logvar / 2) and its KL divergence, from N(0, I) for Mult-VAE (GaussianSampleKL) and from
RecVAE's composite prior (CompositePriorSampleKL), summed over the batch.

Written as plain autograd, these are ~30 small elementwise operations a step (forward and
backward, the split of the encoder's output into mu and logvar and its gradient's re-assembly
among them); on a GPU each is a kernel of a few microseconds, and at the paper's batch of 500
a step is bound by how many kernels it runs rather than by its arithmetic. Here they are ~17:
the forward keeps the sample's noise and the variance, and the backward is written out,

    d z / d mu = 1              d z / d logvar = noise / 2           (noise = eps * std)
    d KL / d mu = mu            d KL / d logvar = (exp(logvar) - 1) / 2

The arithmetic runs in float32 whatever the encoder's dtype (float64 stays float64): under
bf16 autocast mu and logvar arrive in bf16, and the KL is a reduction. RecVAE's is written the
same way (its class's docstring).
"""

from __future__ import annotations

import math

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


class CompositePriorSampleKL(torch.autograd.Function):
    """RecVAE's latent: (z, sum_u KL_u, sum_u w_u KL_u) from mu, logvar (B, d), standard normal
    noise eps, the old posterior's prior_mu and prior_logvar (no gradient), the composite
    prior's three log weights and its wide component's log variance, and per-user weights w
    (B,). KL_u is the one-sample estimate sum_d [log q(z|x) - log p(z)] at z = mu + eps * std,
    p the mixture N(0, 1), N(prior_mu, exp(prior_logvar)), N(0, exp(wide_logvar)).

    With z reparametrised, log q(z|x) = -(logvar + log 2 pi + eps^2) / 2: its gradient is -1/2
    in logvar and 0 in mu (log 2 pi / 2 is in every density, q's and the mixture's components,
    and cancels). Writing s = -d log p / d z = sum_k r_k (z - m_k) / var_k (r the mixture's
    responsibilities), the backward is

        d L / d z = g_z + c s     (c = g_kl + g_term w, per user)
        d L / d mu = d L / d z    d L / d logvar = (d L / d z * eps * std - c) / 2

    Autograd of the same formulas ran ~85 small operations an encoder step on a GPU's code
    path (three log-densities, their stack and log-sum-exp, and the backward of each); this
    runs ~35 (benchmarks/README.md, probe_op_count)."""

    @staticmethod
    def forward(ctx, mu, logvar, eps, prior_mu, prior_logvar, log_weights, wide_logvar, w):
        acc = torch.float64 if mu.dtype == torch.float64 else torch.float32
        ctx.set_materialize_grads(False)
        with torch.autocast(mu.device.type, enabled=False):
            m, lv, e = mu.to(acc), logvar.to(acc), eps.to(acc)
            pm, plv, lw = prior_mu.to(acc), prior_logvar.to(acc), log_weights.to(acc)
            w = w.to(acc)
            noise = e * torch.exp(0.5 * lv)
            z = m + noise
            zz = z * z
            gap = z - pm
            gap_inv = gap * torch.exp(-plv)  # (z - m_2) / var_2
            wide_inv = math.exp(-wide_logvar)
            parts = torch.stack(  # log w_k + log N(z; m_k, var_k) + log(2 pi) / 2
                [
                    torch.add(lw[0], zz, alpha=-0.5),
                    torch.add(lw[1], torch.addcmul(plv, gap, gap_inv), alpha=-0.5),
                    torch.add(lw[2] - 0.5 * wide_logvar, zz, alpha=-0.5 * wide_inv),
                ],
                dim=-1,
            )  # (B, d, 3)
            log_p = torch.logsumexp(parts, dim=-1)
            kl = torch.add(log_p, torch.addcmul(lv, e, e), alpha=0.5).sum(1).neg()  # (B,)
            r = torch.exp(parts - log_p[..., None])  # (softmax over 3 is slow on a CPU)
            score = torch.addcmul(
                torch.add(r[..., 0], r[..., 2], alpha=wide_inv) * z, r[..., 1], gap_inv
            )
        ctx.save_for_backward(noise, score, w)
        ctx.dtypes = (mu.dtype, logvar.dtype)
        return z, kl.sum(), torch.dot(w, kl)

    @staticmethod
    def backward(ctx, grad_z, grad_kl, grad_term):
        noise, score, w = ctx.saved_tensors
        c = torch.zeros_like(w) if grad_term is None else grad_term * w
        if grad_kl is not None:
            c = c + grad_kl
        g = c[:, None] * score
        if grad_z is not None:
            g = g + grad_z.to(g.dtype)
        grad_logvar = 0.5 * (g * noise - c[:, None])
        return (
            g.to(ctx.dtypes[0]),
            grad_logvar.to(ctx.dtypes[1]),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def composite_sample_kl(mu, logvar, prior_mu, prior_logvar, log_weights, wide_logvar, w, sample):
    """(z, sum_u KL_u, sum_u w_u KL_u) of RecVAE's latent against its composite prior
    (CompositePriorSampleKL); `sample`: noise drawn as `torch.randn_like(mu)`, else z = mu."""
    eps = torch.randn_like(mu) if sample else torch.zeros_like(mu)
    return CompositePriorSampleKL.apply(
        mu, logvar, eps, prior_mu, prior_logvar, log_weights, wide_logvar, w
    )
