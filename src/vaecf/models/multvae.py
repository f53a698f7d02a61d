"""Mult-VAE and Mult-DAE (Liang et al., WWW'18), sparse from the first layer to the loss.

As the paper's code: input L2-normalised then dropout; tanh between layers; Glorot-uniform
weights and N(0, 0.001) (truncated at 2 sd) biases; Mult-VAE samples z = mu + eps * sigma in
training and uses z = mu otherwise; loss = multinomial NLL + beta * KL + lam * sum(W^2) (the
paper's `2 * l2_regularizer(lam)`; lam = 0 for Mult-VAE, 0.01 for Mult-DAE).

Sparse: the first layer is `embedding_bag` over the batch's non-zeros (a sparse x dense product),
and the NLL is n_u * logsumexp(logits_u) - sum of logits at u's items, so the user x item input
is never densified. Only the logits (B, n_items) are dense: they are the model's output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vaecf import precision as prec
from vaecf import runtime
from vaecf.config import specs
from vaecf.config.modelconfigs import ModelConfig
from vaecf.data.matrix import SparseBatch
from vaecf.models import first_layer
from vaecf.models.base import Model, Phase, ScoreFn, l2_rows
from vaecf.models.fused import linear_multinomial_nll
from vaecf.models.latent import sample_and_kl
from vaecf.models.onerow import OneRow, float32_on_cpu

# The paper's training settings (Liang et al. 2018, section 4 and its code).
PAPER_TRAIN = {
    "epochs": 200,
    "batch_size": 500,
    "lr": 1e-3,
    "total_anneal_steps": 200_000,
    "anneal_cap": 0.2,
}
# On ML-20M the paper's schedule reaches the KL cap after 40,000 of its 46,800 updates (200
# epochs x 234 batches of 500): the auto defaults keep that shape at any size.
CAP_AT = 40_000 / 46_800


def _init_bias(b: torch.Tensor) -> None:
    nn.init.trunc_normal_(b, mean=0.0, std=0.001, a=-0.002, b=0.002)


def auto_batch_size(n_train_users: int) -> int:
    """Users per update that fit the data: the paper's 500 from 50,000 training users up (at
    least 100 updates an epoch), 100 on small data (the paper's 500 gives ml-latest-small one
    update an epoch), and n_train / 100 in between."""
    return int(min(500, max(100, n_train_users // 100)))


def scaled_anneal_steps(epochs: int, updates_per_epoch: int, cap: float) -> int:
    """total_anneal_steps such that beta reaches `cap` after the paper's share (85%) of the
    run's updates."""
    return max(1, round(CAP_AT * epochs * updates_per_epoch / max(cap, 1e-12)))


def large_batch_lr(lr: float, batch_size: int, auto_batch: int) -> float:
    """The paper's learning rate, scaled by sqrt(batch / the data's auto batch) above that
    batch (Adam's square-root rule: the gradient's noise falls as 1 / sqrt(batch)), so that a
    large batch's few updates cover the same ground (on ML-20M, whose auto batch is the
    paper's 500, NVIDIA's 24,576 gets 7.0e-3; benchmarks/README.md, "Training speed: GPU")."""
    return lr * math.sqrt(max(1.0, batch_size / auto_batch))


def resolve_vae_train(given: dict, n_train_users: int, preset: str, paper: dict) -> dict:
    """Fill the unset annealed-VAE training settings: the paper's (`preset` "paper"), or with
    the batch size, learning rate and annealing length fitted to the data and the batch
    ("auto")."""
    out = {k: paper[k] for k in paper if given.get(k) is None}
    if preset == "paper":
        return out
    if given.get("batch_size") is None:
        out["batch_size"] = auto_batch_size(n_train_users)
    if given.get("lr") is None:
        batch = given.get("batch_size") or out["batch_size"]
        out["lr"] = large_batch_lr(paper["lr"], batch, auto_batch_size(n_train_users))
    if "total_anneal_steps" in paper and given.get("total_anneal_steps") is None:
        epochs = given.get("epochs") or out["epochs"]
        batch = given.get("batch_size") or out["batch_size"]
        cap = given.get("anneal_cap") if given.get("anneal_cap") is not None else out["anneal_cap"]
        out["total_anneal_steps"] = scaled_anneal_steps(
            epochs, math.ceil(n_train_users / batch), cap
        )
    return out


class MultAE(Model):
    """The shared network; `variational` selects Mult-VAE or Mult-DAE."""

    Config = ModelConfig
    multinomial = True
    graph_step = True
    first_layer = "bag"  # the training kernel of the sparse first layer (use_first_layer)

    def __init__(self, n_items: int, config: ModelConfig | None = None):
        super().__init__(n_items, config or ModelConfig(self.name))
        config = self.config
        self.variational = config.model == "multvae"
        enc = [n_items, *config.hidden_dims, config.latent_dim * (2 if self.variational else 1)]
        dec = [config.latent_dim, *reversed(config.hidden_dims), n_items]
        # first layer as a (n_items, d) table for the sparse product
        self.in_weight = nn.Parameter(torch.empty(n_items, enc[1]))  # (n_items, d1)
        self.in_bias = nn.Parameter(torch.empty(enc[1]))
        self.encoder = nn.ModuleList(nn.Linear(a, b) for a, b in zip(enc[1:-1], enc[2:]))
        self.decoder = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dec[:-1], dec[1:]))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.in_weight)
        _init_bias(self.in_bias)
        for layer in [*self.encoder, *self.decoder]:
            nn.init.xavier_uniform_(layer.weight)
            _init_bias(layer.bias)

    def weights(self) -> list[torch.Tensor]:
        return [self.in_weight] + [m.weight for m in [*self.encoder, *self.decoder]]

    def _input_values(self, batch: SparseBatch) -> torch.Tensor:
        """(nnz,) the first layer's input: each history L2-normalised, then dropout."""
        v = batch.values * batch.inverse_norms()[batch.row_ids]  # tf.nn.l2_normalize
        return F.dropout(v, self.config.dropout, self.training)

    def first_layer_input(self):
        return self.in_weight, self._input_values

    def _encode_rest(self, h: torch.Tensor, mean_only: bool = False) -> torch.Tensor:
        """The encoder after its first layer's pre-activation h. `mean_only`: Mult-VAE's last
        layer computes mu alone (the first latent_dim rows of its weight), not logvar."""
        if self.encoder or not self.variational:
            h = torch.tanh(h)
        for i, layer in enumerate(self.encoder):
            if i < len(self.encoder) - 1:
                h = torch.tanh(layer(h))
            elif mean_only and self.variational and isinstance(layer, nn.Linear):
                d = self.config.latent_dim
                h = F.linear(h, layer.weight[:d], layer.bias[:d])
            else:
                h = layer(h)
        return h

    def latent_mean(self, batch: SparseBatch) -> torch.Tensor:
        """(B, latent_dim) what scoring decodes (z = mu): `encode`'s first half, without
        computing logvar."""
        h = self._encoded(batch, mean_only=True)
        return h[:, : self.config.latent_dim] if self.variational else h

    def _encoded(self, batch: SparseBatch, mean_only: bool = False) -> torch.Tensor:
        v = self._input_values(batch)
        # training: the kernel chosen for the run (models/first_layer.py); scoring keeps
        # embedding_bag, without the temporaries of large scoring batches
        kernel = self.first_layer if self.training else "bag"
        h = first_layer.product(batch, self.in_weight, v, kernel) + self.in_bias  # (B, d1)
        return self._encode_rest(h, mean_only)

    def decode_hidden(self, z: torch.Tensor) -> torch.Tensor:
        """The decoder up to the input of its output layer."""
        h = z
        for layer in self.decoder[:-1]:
            h = torch.tanh(layer(h))
        return h

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder[-1](self.decode_hidden(z))  # (B, n_items) logits

    def _latent(self, batch: SparseBatch):
        """(z, mu, logvar); mu and logvar are None for Mult-DAE, whose z is the encoding."""
        h = self._encoded(batch)
        if not self.variational:
            return h, None, None
        d = self.config.latent_dim
        z, _ = sample_and_kl(h, sample=self.training)  # z = mu in eval
        return z.to(h.dtype), h[:, :d], h[:, d:]

    def forward(self, batch: SparseBatch):
        """(logits (B, n_items), mu, logvar); mu and logvar are None for Mult-DAE."""
        z, mu, logvar = self._latent(batch)
        return self.decode(z), mu, logvar

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        return self.decode(self.latent_mean(batch))  # (B, n_items) logits, z = mu

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        h = self._encode_rest(l2_rows(x) @ self.in_weight + self.in_bias)  # the first dense
        if self.variational:
            h = h[:, : self.config.latent_dim]
        return self.decode(h)

    def scorer(self, precision: str = "fp32") -> ScoreFn:
        scorer = Scorer(self, precision)
        device = self.device

        def fn(batch: SparseBatch) -> torch.Tensor:
            with prec.autocast(device, precision):
                return scorer(batch)

        return fn

    def item_vectors(self) -> torch.Tensor:
        """(n_items, d) the output layer's rows: items the decoder ranks alike are similar."""
        return self.decoder[-1].weight.detach()

    @classmethod
    def resolve_train(cls, given: dict, n_train_users: int, preset: str = "auto") -> dict:
        return resolve_vae_train(given, n_train_users, preset, PAPER_TRAIN)

    @classmethod
    def search_space(cls, trial, n_train_users: int) -> dict[str, dict]:
        """Learning rate, batch size (the data's auto size x 1/2 to 4), epochs, input dropout,
        one hidden layer (or none) and the latent size; Mult-VAE: the KL cap and the share of the
        run's updates over which beta climbs to it (`anneal_frac`, turned into
        total_anneal_steps); Mult-DAE: the weight decay."""
        auto = auto_batch_size(n_train_users)
        epochs = trial.suggest_int("epochs", 20, 200, step=20)
        batch = trial.suggest_categorical("batch_size", [auto // 2, auto, auto * 2, auto * 4])
        train: dict = {
            "epochs": epochs,
            "batch_size": batch,
            "lr": trial.suggest_float("lr", 1e-4, 1e-2, log=True),
        }
        hidden = trial.suggest_categorical("hidden_dim", [0, 300, 600, 1000])
        model: dict = {
            "hidden_dims": [hidden] if hidden else [],
            "latent_dim": trial.suggest_categorical("latent_dim", [50, 100, 200, 400]),
            "dropout": trial.suggest_float("dropout", 0.0, 0.8),
        }
        if cls.name == "multvae":
            cap = trial.suggest_float("anneal_cap", 0.0, 1.0)
            frac = trial.suggest_float("anneal_frac", 0.1, 1.0)
            updates = epochs * math.ceil(n_train_users / batch)
            train["anneal_cap"] = cap
            train["total_anneal_steps"] = max(1, round(frac * updates / max(cap, 1e-3)))
        else:
            model["weight_decay"] = trial.suggest_float("weight_decay", 1e-5, 1e-1, log=True)
        return {"train": train, "model": model}

    def loss(
        self,
        batch: SparseBatch,
        beta: float = 0.0,
        denom: float | None = None,
        phase: Phase | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """(NLL + beta * KL) summed over the batch / denom (default: the batch size, i.e. the
        mean), plus the weight penalty; and the summed NLL and KL (detached).

        The output layer and the NLL are fused (models/fused.py): the logits never leave it.
        Data-parallel ranks pass denom = global batch / world so that averaged gradients are
        those of the global mean (an empty shard then contributes zero, not NaN)."""
        denom = batch.batch_size if denom is None else denom
        if self.variational:  # the sample and its KL as one function (models/latent.py)
            z, kl = sample_and_kl(self._encoded(batch), sample=self.training)
        else:
            z = self._encoded(batch)
        out = self.decoder[-1]
        nll = linear_multinomial_nll(self.decode_hidden(z), out.weight, out.bias, batch)
        total = nll
        parts = {"nll_sum": nll.detach()}
        if self.variational:
            total = total + beta * kl
            parts["kl_sum"] = kl.detach()
            parts["kl_term_sum"] = beta * parts["kl_sum"]
        loss = total / max(denom, 1)
        if self.config.weight_decay:
            loss = loss + self.config.weight_decay * sum(
                wide(w).pow(2).sum() for w in self.weights()
            )
        return loss, parts


def wide(t: torch.Tensor) -> torch.Tensor:
    """At least float32: reductions of bf16/fp16 activations are done in float32."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def multinomial_nll(logits: torch.Tensor, batch: SparseBatch) -> torch.Tensor:
    """Mean over users of -sum_i x_ui log softmax(logits_u)_i, from the non-zeros only."""
    lse = torch.logsumexp(wide(logits), dim=1)  # (B,)
    picked = wide(logits[batch.row_ids, batch.indices]) * batch.values  # (nnz,)
    return (batch.row_sums() * lse - batch.row_sums(picked)).mean()


class Scorer:
    """Evaluation-time logits of a MultAE (z = mu, no dropout), laid out for scoring.

    Where the products run in float32 on a CPU, the output layer's weight is kept transposed,
    (d, n_items) and contiguous: MKL's sgemm then streams it once per call, which is what
    small batches are bound by (on a 2-core AVX2 CPU, batch 1: ~4 ms instead of ~7 ms;
    batches of 256 and more: the same within noise; benchmarks/matmul.py). Half-width weights
    or a bf16/fp16 `precision` (autocast), and other devices, keep the nn.Linear layout, which
    their libraries prefer (bf16 on a CPU without native bf16 is 8x slower transposed).
    A one-row batch with float32 weights on a CPU reaches the output layer through `OneRow`
    (numpy: models/onerow.py), and on AMD CPUs goes through it in numpy too (vaecf.runtime).
    Build a Scorer after the weights have changed, not before.
    """

    def __init__(self, model: MultAE, precision: str = "fp32"):
        self.model = model
        out = model.decoder[-1]
        self.bias = out.bias.detach()
        transpose = (
            isinstance(out, nn.Linear)
            and out.weight.device.type == "cpu"
            and out.weight.dtype == torch.float32
            and precision in ("fp32", "tf32")
        )
        self.weight_t = out.weight.detach().t().contiguous() if transpose else None
        self.one_row = OneRow(model) if float32_on_cpu([model], precision) else None
        # one row's output layer in numpy too where its BLAS is the faster (vaecf.runtime)
        one = self.one_row is not None and self.weight_t is not None
        fast = one and runtime.numpy_gemv_faster()
        self.one_row_out = (self.weight_t.numpy(), self.bias.numpy()) if fast else None

    def __call__(self, batch: SparseBatch) -> torch.Tensor:
        """(B, n_items) logits; the model must be in eval mode."""
        net = self.model
        if self.one_row is not None and batch.batch_size == 1:
            h = self.one_row(batch.indices, batch.values)
            if self.one_row_out is not None:
                w, b = self.one_row_out
                with runtime.one_blas_thread():
                    return torch.from_numpy((h.numpy() @ w) + b)
        else:
            h = net.decode_hidden(net.latent_mean(batch))
        if self.weight_t is None:
            return net.decoder[-1](h)
        return torch.addmm(self.bias, h, self.weight_t)


class MultVAE(MultAE):
    spec = specs.MULTVAE
    # measured with --preset auto, 5 split seeds: ml-latest-small +0.0077, FilmTrust +0.0067
    # test NDCG@100 (RecVAE: -0.0085 / +0.0071, so not there); benchmarks/README.md
    fold_in_default = True


class MultDAE(MultAE):
    spec = specs.MULTDAE


def build_model(n_items: int, config: ModelConfig) -> MultAE:
    return (MultVAE if config.model == "multvae" else MultDAE)(n_items, config)
