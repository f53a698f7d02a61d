"""One history at a time on a CPU: the small layers of Mult-VAE and Mult-DAE in numpy.

A batch-1 answer reads the output layer once and runs some twenty small operations before it
(the history's L2 norm, the first layer's rows, the hidden layers). In a serving loop on a
2-core Zen 3 each PyTorch call among those cost 10-20 us (dispatch, Module hooks, caches cold
after the output layer's read); the same arithmetic as numpy calls makes an answer 0.28-0.41
ms faster (int8: 1.64 -> 1.36 ms mean; benchmarks/README.md). So a one-row batch goes through
`OneRow` up to the output layer's input, and the output layer (PyTorch's: MKL's fp32 product
or the int8 copy's kernel) does the rest. Only float32 weights on a CPU qualify (numpy has no
bf16); the answers equal the batched path's within float32 rounding (tests/test_model.py).
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
        v = values.numpy().astype(np.float32, copy=False)  # as the batched path casts them
        v = v * (1.0 / max(float(v @ v), 1e-12) ** 0.5)  # tf.nn.l2_normalize (stays float32)
        h = v @ self.in_weight[indices.numpy(), : self.first_cols] + self.in_bias[: self.first_cols]
        if self.first_tanh:
            h = np.tanh(h)
        for w, b, tanh in self.layers:
            h = w @ h + b
            if tanh:
                h = np.tanh(h)
        return torch.from_numpy(h[None])

    @staticmethod
    def fits(model, precision: str) -> bool:
        """Whether `model`'s small layers can run here: float32 on a CPU, fp32/tf32 scoring."""
        return (
            precision in ("fp32", "tf32")
            and model.in_weight.device.type == "cpu"
            and all(
                p.dtype == torch.float32
                for m in [*model.encoder, *model.decoder[:-1]]
                for p in m.parameters()
            )
            and model.in_weight.dtype == torch.float32
        )
