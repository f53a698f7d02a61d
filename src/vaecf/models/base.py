"""The model contract: what every model (Mult-VAE, Mult-DAE, RecVAE, EASE, popularity) provides.

A model is a `torch.nn.Module` whose state dict is all it needs to score (weights-only
checkpoints), built from `(n_items, config)` where `config` is the dataclass its class declares.
Everything outside training (`evaluate`, `Recommender`, `bench infer`, serving) uses only:

- `scores(batch) -> (B, n_items)`: fold-in scores of a sparse batch of histories, higher is
  better, in eval semantics (no dropout, z = mu); the caller masks the history.
- `scorer(precision) -> ScoreFn`: the same, laid out for repeated calls in `precision`.
- `item_vectors() -> (n_items, d)`: one vector per item, whose cosine similarity is the model's
  notion of "similar items".
- `contributions(history, items)`: each history item's exact share of the items' scores, for
  the models whose score is a sum over the history; None otherwise (explanations are then
  leave-one-out: vaecf.models.explain).
- `multinomial`: True where scores are logits of a multinomial over items (softmax gives each
  item's probability); otherwise scores are shown as they are.

How it is fitted: gradient models (`closed_form = False`) go through the GradientFit, which owns
epochs, precision, data parallelism, checkpoints, resume and model selection; they provide
`param_groups()`, `phases()` and `loss()`. Closed-form models (`closed_form = True`) provide
`fit()`. Each class resolves the training settings left unset from the data in `resolve_train()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

from vaecf import precision as prec
from vaecf.config.specs import GRADIENT_SETTINGS, Spec
from vaecf.data.matrix import SparseBatch

ScoreFn = Callable[[SparseBatch], torch.Tensor]  # batch -> (B, n_items) scores


@dataclass(frozen=True)
class Phase:
    """One part of a gradient model's epoch: `passes` sweeps over the training users in which
    only the optimizers of `groups` step; `log`: its losses are the ones the epoch reports."""

    name: str
    groups: tuple[str, ...]
    passes: int = 1
    log: bool = True


class Model(nn.Module):
    # the declaration (vaecf.config.specs, torch-free); a class with a `spec` has its fields as
    # class attributes: name, title, family, summary, Config, closed_form, trainable,
    # train_settings
    spec: ClassVar[Spec]
    name: ClassVar[str]  # registry name, `--model NAME`
    Config: ClassVar[type]  # the config dataclass
    title: ClassVar[str] = ""
    family: ClassVar[str] = "autoencoder"
    summary: ClassVar[str] = ""
    closed_form: ClassVar[bool] = False
    trainable: ClassVar[bool] = True
    train_settings: ClassVar[tuple[str, ...]] = GRADIENT_SETTINGS
    # a `loss` free of host reads: each phase's step may be a CUDA graph (graphs.py)
    graph_step: ClassVar[bool] = False
    multinomial: ClassVar[bool] = False
    # an unset `fold_in_rows` setting under --preset auto (gradient models: vaecf.training.run)
    fold_in_default: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            for f in fields(spec):
                setattr(cls, f.name, getattr(spec, f.name))

    def __init__(self, n_items: int, config: Any = None):
        super().__init__()
        self.n_items = n_items
        self.config = config if config is not None else self.Config()

    # -- scoring: every model -----------------------------------------------------------------
    def scores(self, batch: SparseBatch) -> torch.Tensor:
        raise NotImplementedError

    def scorer(self, precision: str = "fp32") -> ScoreFn:
        """Score function for the current weights in eval mode, under `precision`."""
        device = self.device

        def fn(batch: SparseBatch) -> torch.Tensor:
            with prec.autocast(device, precision):
                return self.scores(batch)

        return fn

    def contributions(self, history: torch.Tensor, items: torch.Tensor) -> torch.Tensor | None:
        """(len(history), len(items)) float32: each history item's exact share of each of
        `items`' scores, where a score is a sum over the history (the linear models); None
        where it is not, and an explanation is leave-one-out (vaecf.models.explain)."""
        return None

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        """`scores` of dense multi-hot rows x (B, n_items), in plain tensor operations that
        ONNX export traces (`vaecf export`); a model without it cannot be exported."""
        from vaecf.errors import ConfigError

        raise ConfigError(f"no ONNX export for model {type(self).__name__}")

    def item_vectors(self) -> torch.Tensor:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        for t in self.state_dict().values():
            return t.device
        return torch.device("cpu")

    # -- fitting: closed-form models ------------------------------------------------------------
    def fit(
        self,
        train: Any,
        validate: Callable[[Model], dict] | None = None,
        select_metric: str = "ndcg@100",
        log: Callable[[str], None] | None = None,
        validation: tuple[Any, Any] | None = None,
        fold_in: Any = None,
        deadline: float | None = None,
    ) -> dict:
        """Closed-form models: fit on the training matrix (scipy CSR, users x items). Choices
        the model makes itself are scored with `validate(model) -> validation metrics`, or on
        `validation` (fold-in, target) CSR matrices directly. `fold_in`: the held-out users'
        fold-in rows (never their targets), which a model may add to what it fits on;
        `deadline` (a `time.perf_counter()` value, passed only under a --budget): a search
        stops trying points before one that would end past it and keeps its best so far
        (recording "stopped": "budget"). Returns what to record."""
        raise NotImplementedError

    # -- fitting: gradient models ---------------------------------------------------------------
    def prepare(self, train: Any, validation: tuple[Any, Any]) -> dict:
        """Called once before the first epoch of a new run with the training matrix and the
        validation (fold-in, target) CSR matrices, for data-dependent parts (a frozen linear
        path); returns what to record. Resumed runs restore them from the checkpoint."""
        return {}

    def prepare_bytes(self) -> int:
        """Bytes `prepare` holds at its peak beyond the model's own tensors, for the memory
        check before anything is allocated (vaecf.training.footprint); default none."""
        return 0

    def first_layer_input(self) -> tuple[torch.Tensor, Callable] | None:
        """(the sparse first layer's weight, batch -> its training input values) for choosing
        that layer's kernel (vaecf.models.first_layer.choose); None: no sparse first layer."""
        return None

    def use_first_layer(self, kernel: str) -> None:
        """Train with this first-layer kernel (scoring keeps "bag")."""
        for m in self.modules():
            if hasattr(m, "first_layer"):
                m.first_layer = kernel

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by optimizer (one Adam each); default one group."""
        return {"all": [p for p in self.parameters() if p.requires_grad]}

    def phases(self) -> list[Phase]:
        return self.phases_of(self.config)

    @classmethod
    def phases_of(cls, config) -> list[Phase]:
        """The parts of an epoch of a model with settings `config`; default one."""
        return [Phase("all", ("all",))]

    def begin_phase(self, phase: Phase) -> None:
        """Called before each phase of every epoch (RecVAE refreshes its prior here)."""

    def loss(
        self, batch: SparseBatch, beta: float, denom: float, phase: Phase
    ) -> tuple[torch.Tensor, dict]:
        """(objective / denom, {"nll_sum", "kl_sum", "kl_term_sum"} detached sums)."""
        raise NotImplementedError

    @classmethod
    def resolve_train(cls, given: dict, n_train_users: int, preset: str = "auto") -> dict:
        """Values for the TrainConfig fields left unset (None) in `given`, resolved from the
        data (`preset` "auto") or the model's paper ("paper")."""
        return {}

    @classmethod
    def search_space(cls, trial: Any, n_train_users: int) -> dict[str, dict]:
        """Hyper-parameters for `vaecf tune`: `{"train": {...}, "model": {...}}`, TrainConfig
        and Config settings drawn with `trial.suggest_*` (an optuna.Trial, duck-typed: models do
        not import optuna). The sampled parameters need not be settings themselves (e.g. an
        annealing fraction turned into total_anneal_steps), but must determine them."""
        from vaecf.errors import ConfigError

        raise ConfigError(
            f"model {cls.name} has no hyper-parameters to tune; train it with `vaecf train`"
        )


def make_optimizer(params, lr: float, device: torch.device):
    """Adam (the paper's) over `params` (a module's, or a model's group of them); the fused
    single-kernel implementation on CPU and CUDA."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    return torch.optim.Adam(params, lr=lr, fused=device.type in ("cpu", "cuda"))


class LossModule(nn.Module):
    """A model's loss as a forward(), so that DDP can wrap the training step."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    def forward(self, batch, beta: float, denom: float, phase: Phase):
        return self.model.loss(batch, beta, denom, phase)


def l2_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit L2 norm (zero rows stay zero), in traceable operations."""
    return x * torch.rsqrt((x * x).sum(1, keepdim=True).clamp_min(1e-12))


def vector_norms(vectors: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """(n,) float32 row norms, floored away from 0 (what `cosine_neighbours` divides by), in
    blocks of `rows` (a half-width EASE B or int8 rows are never copied whole to float32)."""
    if vectors.is_sparse:  # a sparse COO matrix (the sparse EASE solver's B)
        v = vectors.coalesce()
        sq = torch.zeros(v.shape[0], device=v.device).index_add_(
            0, v.indices()[0], v.values().float() ** 2
        )
        return sq.sqrt().clamp_min(1e-12)
    norms = [torch.linalg.vector_norm(b.float(), dim=1) for b in vectors.split(rows)]
    return torch.cat(norms).clamp_min(1e-12)


def cosine_neighbours(
    vectors: torch.Tensor, idx: int, k: int, norms: torch.Tensor | None = None
) -> tuple[list[int], list[float]]:
    """The k items whose vectors have the highest cosine similarity to item `idx` (itself
    excluded), best first. With `norms` (from `vector_norms`, kept by the caller) a call costs
    one matrix-vector product and no copy of `vectors`."""
    norms = vector_norms(vectors) if norms is None else norms
    row = vectors[idx].to_dense() if vectors.is_sparse else vectors[idx]
    if vectors.is_sparse:
        sim = (vectors @ row[:, None])[:, 0].to_dense()
    elif vectors.is_floating_point():
        sim = vectors @ row
    else:  # int8 rows (an int8 serving copy): in float, a block at a time
        sim = torch.cat([b.float() @ row.float() for b in vectors.split(4096)])
    sim = sim.float() / (norms * norms[idx])
    sim[idx] = -torch.inf
    top = sim.topk(min(k, sim.numel() - 1))
    return top.indices.tolist(), top.values.tolist()
