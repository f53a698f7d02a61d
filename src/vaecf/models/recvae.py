"""RecVAE (Shenbin, Alekseev, Tutubalina, Malykh, Nikolenko, WSDM 2020), sparse input.

As its authors' code trains it:
- encoder: L2-normalised input, dropout, then 5 layers of 600 with dense skip connections,
  h_{k+1} = LayerNorm(swish(W_k h_k + b_k + h_1 + ... + h_k)), layer norm eps 0.1; (mu, logvar)
  of a 200-dimensional z; the decoder is one linear layer (fused with the multinomial NLL);
- composite prior, per latent dimension: 0.15 N(0, 1) + 0.75 the posterior of the encoder as it
  was before the current encoder phase + 0.10 N(0, e^10);
- KL (one-sample estimate log q(z|x) - log p(z)) weighted per user by gamma x |history|;
- each epoch: 3 passes that step only the encoder (input dropout 0.5), then 1 pass that steps only
  the decoder (no dropout); separate Adam optimizers; z = mu at evaluation.
One deviation, documented: the authors' old-posterior encoder starts from its own random
initialisation; here it is a copy of the encoder at the start of every encoder phase (the first
included), as the paper describes the prior.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vaecf.config import specs
from vaecf.config.modelconfigs import RecVAEConfig
from vaecf.data.matrix import SparseBatch
from vaecf.models import first_layer
from vaecf.models.base import Model, Phase, ScoreFn, l2_rows
from vaecf.models.fused import linear_multinomial_nll
from vaecf.models.latent import composite_sample_kl
from vaecf.models.multvae import resolve_vae_train
from vaecf.models.onerow import OneRowRecVAE, float32_on_cpu

PAPER_TRAIN = {"epochs": 50, "batch_size": 500, "lr": 5e-4}  # the authors' run.py defaults


def swish(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), as one kernel (PyTorch's silu) forward and backward."""
    return F.silu(x)


class Encoder(nn.Module):
    first_layer = "bag"  # the training kernel of the sparse first layer (Model.use_first_layer)

    def __init__(self, n_items: int, cfg: RecVAEConfig):
        super().__init__()
        h = cfg.hidden_dim
        self.in_weight = nn.Parameter(torch.empty(n_items, h))  # (n_items, h), sparse product
        self.in_bias = nn.Parameter(torch.empty(h))
        self.layers = nn.ModuleList(nn.Linear(h, h) for _ in range(cfg.n_layers - 1))
        self.norms = nn.ModuleList(
            nn.LayerNorm(h, eps=cfg.layer_norm_eps) for _ in range(cfg.n_layers)
        )
        self.out = nn.Linear(h, 2 * cfg.latent_dim)  # (mu, logvar)
        self.latent_dim = cfg.latent_dim
        bound = 1.0 / math.sqrt(n_items)  # nn.Linear's default init for the first layer
        nn.init.uniform_(self.in_weight, -bound, bound)
        nn.init.uniform_(self.in_bias, -bound, bound)

    def input_values(self, batch: SparseBatch, dropout: float) -> torch.Tensor:
        v = batch.values * batch.inverse_norms()[batch.row_ids]
        return F.dropout(v, dropout, self.training and dropout > 0)

    def forward(self, batch: SparseBatch, dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
        v = self.input_values(batch, dropout)
        kernel = self.first_layer if self.training else "bag"  # models/first_layer.py
        h = first_layer.product(batch, self.in_weight, v, kernel)
        h = self.norms[0](swish(h + self.in_bias))  # (B, hidden)
        skip = h
        for layer, norm in zip(self.layers, self.norms[1:]):
            h = norm(swish(layer(h) + skip))
            skip = skip + h
        out = self.out(h)
        return out[:, : self.latent_dim], out[:, self.latent_dim :]


class RecVAE(Model):
    spec = specs.RECVAE
    multinomial = True
    graph_step = True  # one graph per phase

    def __init__(self, n_items: int, config: RecVAEConfig | None = None):
        super().__init__(n_items, config)
        cfg = self.config
        self.encoder = Encoder(n_items, cfg)
        self.prior_encoder = Encoder(n_items, cfg).requires_grad_(False)  # the old posterior
        self.prior_encoder.load_state_dict(self.encoder.state_dict())
        self.decoder = nn.Linear(cfg.latent_dim, n_items)
        self.register_buffer("log_weights", torch.log(torch.tensor(cfg.prior_weights)))

    # -- scoring ------------------------------------------------------------------------------
    def scores(self, batch: SparseBatch) -> torch.Tensor:
        mu, _ = self.encoder(batch, 0.0)
        return self.decoder(mu)  # (B, n_items) logits

    def scorer(self, precision: str = "fp32") -> ScoreFn:
        """The scores; one history on a CPU has its encoder run in numpy (models/onerow.py).
        Subclasses that change `scores` (the hybrid) keep the batched path."""
        batched = super().scorer(precision)
        one_row = type(self).scores is RecVAE.scores and float32_on_cpu([self.encoder], precision)
        if not one_row:
            return batched
        encode = OneRowRecVAE(self)

        def fn(batch: SparseBatch) -> torch.Tensor:
            if batch.batch_size == 1:
                return self.decoder(encode(batch.indices, batch.values))
            return batched(batch)

        return fn

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        enc = self.encoder  # as Encoder.forward at dropout 0, the first layer dense
        h = enc.norms[0](swish(l2_rows(x) @ enc.in_weight + enc.in_bias))
        skip = h
        for layer, norm in zip(enc.layers, enc.norms[1:]):
            h = norm(swish(layer(h) + skip))
            skip = skip + h
        return self.decoder(enc.out(h)[:, : enc.latent_dim])

    def item_vectors(self) -> torch.Tensor:
        return self.decoder.weight.detach()

    # -- training -----------------------------------------------------------------------------
    @classmethod
    def resolve_train(cls, given: dict, n_train_users: int, preset: str = "auto") -> dict:
        return resolve_vae_train(given, n_train_users, preset, PAPER_TRAIN)

    @classmethod
    def search_space(cls, trial, n_train_users: int) -> dict[str, dict]:
        """gamma (the KL weight per interaction), the learning rate and the latent size; the
        rest as the authors train it."""
        return {
            "train": {"lr": trial.suggest_float("lr", 1e-4, 3e-3, log=True)},
            "model": {
                "gamma": trial.suggest_float("gamma", 1e-3, 3e-2, log=True),
                "latent_dim": trial.suggest_categorical("latent_dim", [100, 200, 400]),
            },
        }

    def first_layer_input(self):
        enc = self.encoder
        return enc.in_weight, lambda batch: enc.input_values(batch, self.config.dropout)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {
            "encoder": list(self.encoder.parameters()),
            "decoder": list(self.decoder.parameters()),
        }

    @classmethod
    def phases_of(cls, config) -> list[Phase]:
        return [
            Phase("encoder", ("encoder",), config.encoder_passes),
            Phase("decoder", ("decoder",), config.decoder_passes, log=False),
        ]

    def begin_phase(self, phase: Phase) -> None:
        if phase.name == "encoder":
            with torch.no_grad():
                for old, new in zip(self.prior_encoder.parameters(), self.encoder.parameters()):
                    old.copy_(new)

    def nll(self, z, w, b, batch: SparseBatch, phase: Phase | None) -> torch.Tensor:
        """Summed multinomial NLL of the decoder's logits (fused with the output layer)."""
        return linear_multinomial_nll(z, w, b, batch)

    def loss(
        self, batch: SparseBatch, beta: float, denom: float, phase: Phase | None = None
    ) -> tuple[torch.Tensor, dict]:
        decoder_phase = phase is not None and phase.name == "decoder"
        with torch.set_grad_enabled(torch.is_grad_enabled() and not decoder_phase):
            mu, logvar = self.encoder(batch, 0.0 if decoder_phase else self.config.dropout)
        if decoder_phase:
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        else:  # the sample and its KL against the composite prior as one function
            with torch.no_grad():
                prior_mu, prior_logvar = self.prior_encoder(batch, 0.0)
            c = self.config
            z, kl, term = composite_sample_kl(
                mu, logvar, prior_mu, prior_logvar, self.log_weights, c.wide_logvar,
                c.gamma * batch.row_sums(), sample=self.training,
            )  # fmt: skip
            z = z.to(mu.dtype)
        w, b = self.decoder.weight, self.decoder.bias
        if phase is not None and phase.name == "encoder":
            w, b = w.detach(), b.detach()  # the decoder does not move: skip its gradient
        nll = self.nll(z, w, b, batch, phase)
        parts = {"nll_sum": nll.detach()}
        if decoder_phase:
            return nll / max(denom, 1), parts
        parts["kl_sum"] = kl.detach()
        parts["kl_term_sum"] = term.detach()
        return (nll + term) / max(denom, 1), parts
