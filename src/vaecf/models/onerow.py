"""One history at a time on a CPU: the small layers of Mult-VAE, Mult-DAE and RecVAE in numpy.

A batch-1 answer reads the output layer once and runs some twenty small operations before it
(the history's L2 norm, the first layer's rows, the hidden layers). In a serving loop on a
2-core Zen 3 each PyTorch call among those cost 10-20 us (dispatch, Module hooks, caches cold
after the output layer's read); the same arithmetic as numpy calls makes an answer 0.28-0.41
ms faster for Mult-VAE (int8: 1.64 -> 1.36 ms mean) and 0.53-0.63 ms for RecVAE, whose encoder
has five layers (benchmarks/README.md). So a one-row batch goes through `OneRow` (or
`OneRowRecVAE`) up to the output layer's input, and the output layer (PyTorch's: MKL's fp32
product or the int8 copy's kernel; for Mult-VAE/DAE in fp32 on AMD CPUs numpy's BLAS on one
thread, `vaecf.runtime`) does the rest. Only float32 weights on a CPU qualify (numpy
has no bf16); the answers equal the batched path's within float32 rounding
(tests/models/test_model.py).
"""

from __future__ import annotations

import numpy as np
import torch


class OneRow:
    """The input of a MultAE's output layer for one history, from numpy views of its weights
    (the model's own memory: no copy, and later updates in place are seen). The model must be
    in eval mode: no dropout, z = mu."""

    def __init__(self, model):
        def arrays(layer, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
            w, b = layer.weight.detach(), layer.bias.detach()
            return w[:rows].numpy(), b[:rows].numpy()

        self.in_weight = model.in_weight.detach().numpy()  # (n_items, d1)
        self.in_bias = model.in_bias.detach().numpy()
        d = model.config.latent_dim
        last = len(model.encoder) - 1
        # (weight, bias, tanh after it) of each layer after the first, up to the output layer;
        # Mult-VAE's last encoder layer computes mu alone (its first latent_dim rows)
        self.layers = [
            (*arrays(layer, d if i == last and model.variational else None), i < last)
            for i, layer in enumerate(model.encoder)
        ]
        self.layers += [(*arrays(layer), True) for layer in model.decoder[:-1]]
        self.first_tanh = bool(model.encoder) or not model.variational
        # Mult-VAE without encoder layers: the first layer gives (mu, logvar)
        self.first_cols = d if model.variational and not model.encoder else None

    def __call__(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(1, d) float32: the output layer's input for the history (item indices, values)."""
        cols = self.first_cols
        h = first_layer(indices, values, self.in_weight[:, :cols], self.in_bias[:cols])
        if self.first_tanh:
            h = np.tanh(h)
        for w, b, tanh in self.layers:
            h = w @ h + b
            if tanh:
                h = np.tanh(h)
        return torch.from_numpy(h[None])


def first_layer(indices: torch.Tensor, values: torch.Tensor, weight, bias) -> np.ndarray:
    """(d,) the history (item indices, values) L2-normalised times `weight` (n_items, d), plus
    `bias`: the autoencoders' sparse first layer, before its activation."""
    v = values.numpy().astype(np.float32, copy=False)  # as the batched path casts them
    v = v * (1.0 / max(float(v @ v), 1e-12) ** 0.5)  # tf.nn.l2_normalize (stays float32)
    return v @ weight[indices.numpy()] + bias


def float32_on_cpu(modules, precision: str) -> bool:
    """Whether these modules' parameters can run in numpy: float32 on a CPU, fp32/tf32 scoring
    (numpy has no bf16)."""
    params = [p for m in modules for p in m.parameters()]
    return precision in ("fp32", "tf32") and all(
        p.dtype == torch.float32 and p.device.type == "cpu" for p in params
    )


class OneRowRecVAE:
    """RecVAE's mu for one history (its encoder at dropout 0: swish, layer norms and dense skip
    connections), from numpy views of the encoder's weights; the decoder does the rest."""

    def __init__(self, model):
        enc = model.encoder
        self.in_weight = enc.in_weight.detach().numpy()
        self.in_bias = enc.in_bias.detach().numpy()
        self.layers = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in enc.layers]
        self.norms = [
            (n.weight.detach().numpy(), n.bias.detach().numpy(), n.eps) for n in enc.norms
        ]
        d = enc.latent_dim
        self.out = enc.out.weight.detach()[:d].numpy(), enc.out.bias.detach()[:d].numpy()

    def __call__(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(1, latent_dim) float32: mu, the decoder's input for the history."""
        h = _norm(_swish(first_layer(indices, values, self.in_weight, self.in_bias)), self.norms[0])
        skip = h
        for (w, b), norm in zip(self.layers, self.norms[1:]):
            h = _norm(_swish(w @ h + b + skip), norm)
            skip = skip + h
        w, b = self.out
        return torch.from_numpy((w @ h + b)[None])


def _swish(x: np.ndarray) -> np.ndarray:
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))  # x * sigmoid(x), without exp's overflow


def _norm(x: np.ndarray, norm) -> np.ndarray:
    """nn.LayerNorm over x's one row: biased variance, then the affine weight and bias."""
    weight, bias, eps = norm
    c = x - x.mean()
    return c * (1.0 / float(np.sqrt((c @ c) / len(c) + eps))) * weight + bias
