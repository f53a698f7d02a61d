"""Every model's settings: its config dataclass (one declaration per setting: default, help and
check) and the defaults they share (the linear models' grids and popularity penalty), importing
no torch. `vaecf.config.specs` declares the models on these; the command line builds its options
from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vaecf.config.settings import setting, validate_fields
from vaecf.errors import ConfigError

# EASE's lambda grid; p = 0 (EASE) is on EDLAE's dropout grid, so without the popularity
# penalty the search can only match or beat EASE up to noise; Steck's notebook used 0.25 (MSD)
# and 0.33 (ML-20M, Netflix).
DEFAULT_GRID = [1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0]
DEFAULT_DROPOUT_GRID = [0.0, 0.1, 0.2, 0.33, 0.5]
# EDLAE's default popularity penalty (beta), measured on the two real datasets and the synthetic
# demo data (README "Accuracy"): 0.1 gained on all three; 0.25 gained more on the real ones but
# cost 0.004 on the demo data. EASE keeps 0: it is the reference baseline.
POPULARITY_EXPONENT = 0.1
LINEAR_CV_BETAS = [0.0, 0.1, 0.25, 0.4]  # the penalties auto's linear candidates choose from
POPULARITY_HELP = (
    "beta: B's column j divided by item j's count in X^T X to the power beta after each "
    "solve, so that lambda and p are chosen with it (a popularity penalty, as RP3beta's, "
    f"Paudel et al. 2017); 0: none (EASE's default; EDLAE's {POPULARITY_EXPONENT})"
)


FOLD_IN_TRAIN_HELP = (
    "train on the held-out users' fold-in rows too (never their targets), as EASE's X^T X "
    "holds them: they are known inputs at scoring time; false: the training users' rows only, "
    "as the paper trains"
)


@dataclass
class ModelConfig:
    """Mult-VAE and Mult-DAE (`model` says which)."""

    model: str = setting("multvae", "multvae (variational) or multdae (denoising)")
    hidden_dims: list[int] | None = setting(
        None,
        "encoder hidden layer sizes, mirrored by the decoder; unset: Mult-VAE [600], Mult-DAE []",
    )
    latent_dim: int = setting(200, "size of z (Mult-DAE: its one hidden layer)")
    dropout: float = setting(0.5, "dropout rate on the normalised input")
    weight_decay: float | None = setting(None, "lam in lam * sum(W^2) (Mult-VAE 0, Mult-DAE 0.01)")
    fold_in_rows: bool | None = setting(
        None,
        FOLD_IN_TRAIN_HELP + "; unset: true for Mult-VAE with --preset auto, else false (the "
        "one flag for every model: EASE and EDLAE add the rows to X^T X, default true; "
        "RecVAE and RecVAE+EDLAE default false)",
    )

    def __post_init__(self) -> None:
        if self.model not in ("multvae", "multdae"):
            raise ConfigError(f"model must be 'multvae' or 'multdae', not {self.model!r}")
        if self.hidden_dims is None:  # the paper's networks; Mult-DAE: [n_items -> 200 -> n_items]
            self.hidden_dims = [] if self.model == "multdae" else [600]
        if self.weight_decay is None:
            self.weight_decay = 0.0 if self.model == "multvae" else 0.01
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout must lie in [0, 1)")


@dataclass
class RecVAEConfig:
    hidden_dim: int = setting(600, "width of each encoder layer")
    n_layers: int = setting(5, "encoder layers, with dense skip connections")
    latent_dim: int = setting(200, "size of z")
    dropout: float = setting(0.5, "input dropout in the encoder phase")
    gamma: float = setting(0.005, "KL weight per user = gamma x that user's number of items")
    prior_weights: list[float] = setting(
        help="composite prior mixture weights: standard normal, old posterior, wide normal",
        factory=lambda: [0.15, 0.75, 0.10],
    )
    wide_logvar: float = setting(10.0, "log variance of the wide prior component")
    layer_norm_eps: float = setting(0.1, "epsilon of the encoder's layer norms")
    encoder_passes: int = setting(3, "encoder passes over the users per epoch")
    decoder_passes: int = setting(1, "decoder passes over the users per epoch")
    fold_in_rows: bool = setting(False, FOLD_IN_TRAIN_HELP)

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout must lie in [0, 1)")
        if len(self.prior_weights) != 3 or min(self.prior_weights) <= 0:
            raise ConfigError("prior_weights must be three positive weights")
        for name in ("hidden_dim", "n_layers", "latent_dim", "encoder_passes", "decoder_passes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.gamma < 0:
            raise ConfigError("gamma must be >= 0")


@dataclass
class HybridConfig(RecVAEConfig):
    linear_l2: float | None = setting(
        None, "EDLAE path: lambda; unset: searched on validation as --model edlae does"
    )
    linear_dropout: float | None = setting(
        None, "EDLAE path: dropout rate p; unset: searched on validation"
    )
    linear_popularity_exponent: float = setting(
        0.0, "EDLAE path: its popularity penalty beta (--popularity-exponent); 0: none"
    )
    alpha: float | None = setting(
        None,
        "initial weight of the EDLAE path's scores (then trained); unset: the likeliest on "
        "the training users",
    )
    train_linear: bool = setting(
        False,
        "train the EDLAE path's item-item matrix B jointly with the decoder (its diagonal "
        "held at zero; VASP-style, Vančura & Kordík 2021); false: B stays frozen",
    )
    distil: float = setting(
        0.0,
        "when positive, the EDLAE path is a teacher (knowledge distillation, Hinton et al. 2015) "
        "instead of a part of the logits: the network alone scores, trained toward "
        "(1 - distil) x + distil n_u softmax(alpha x B)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.distil <= 1.0:
            raise ConfigError("distil must lie in [0, 1]")
        if self.distil and self.train_linear:
            raise ConfigError("distil (a frozen teacher) and train_linear exclude each other")


@dataclass
class EASEConfig:
    l2: float | None = setting(
        None, "lambda, the L2 weight; unset: chosen on validation NDCG@100 from --l2-grid"
    )
    l2_grid: list[float] = setting(
        help="lambdas to try when --l2 is unset", factory=lambda: list(DEFAULT_GRID)
    )
    search: Literal["fast", "grid"] = setting(
        "fast",
        "fast: the grid on the --coarse-items most popular items, then the full catalogue at "
        "the best lambda and half a step toward its better neighbour; grid: every grid point "
        "on every item",
    )
    coarse_items: int = setting(
        3000, "items of the fast search's coarse stage (at or below it, fast is grid)"
    )
    fold_in_rows: bool = setting(
        True,
        "add the held-out users' fold-in rows (never their targets) to X^T X: they are known "
        "inputs at scoring time; false: the training users' rows only",
    )
    solve_dtype: Literal["float32", "float64"] = setting(
        "float32", "dtype of the solve (float32 is ample for lambda >= 1)"
    )
    solver: Literal["auto", "dense", "sparse"] = setting(
        "auto",
        "dense: the exact n_items^2 solve; sparse: each item's column of B solved over its "
        "--neighbours nearest items (no n_items^2 array; for large catalogues); "
        "auto: dense where its arrays fit the device's free memory, else sparse",
    )
    neighbours: int = setting(
        256, "the sparse solver's items per column of B (its cost grows with the cube)"
    )
    popular_share: float = setting(
        0.02,
        "the sparse solver: this share of the items, the most popular, get --popular-"
        "neighbours per column (they are recommended most and co-occur with the most "
        "items); 0: none",
    )
    popular_neighbours: int = setting(1024, "items per column of B for --popular-share")
    neighbour_rank: Literal["count", "cosine"] = setting(
        "cosine",
        "the sparse solver's choice of an item j's neighbours: cosine: the items i of largest "
        "G_ij / sqrt(G_ii), how far i alone moves j's scores (specific, less popular items "
        "come in); count: of largest co-occurrence G_ij (mostly the popular items)",
    )
    popularity_exponent: float = setting(0.0, POPULARITY_HELP)
    popularity_grid: list[float] = setting(
        help="penalties beta to choose from with lambda (and p), by the same selection (no "
        "extra solve: B's columns are rescaled); empty: --popularity-exponent alone",
        factory=list,
    )
    selection: Literal["validation", "cv"] = setting(
        "validation",
        "what a search scores each tried point on: validation: the validation users; cv: "
        "those and --cv-folds folds of the training users (each fold's users held out of "
        "X^T X but for a random 80 percent of their items, their other 20 percent predicted, "
        "as held-out users are): cv-folds + 1 solves per point, a choice made on many more "
        "users (either solver)",
    )
    cv_folds: int = setting(5, "folds of the training users for --selection cv")
    cv_repeats: int = setting(
        1, "--selection cv: the folds drawn this many times (other folds and 80/20 draws)"
    )

    def __post_init__(self) -> None:
        betas = [self.popularity_exponent, *self.popularity_grid]
        if not all(0.0 <= b <= 1.0 for b in betas):
            raise ConfigError(
                "popularity_exponent (and every popularity_grid value) must be in [0, 1]"
            )
        if self.cv_folds < 2:
            raise ConfigError("cv_folds must be at least 2")
        if self.cv_repeats < 1:
            raise ConfigError("cv_repeats must be at least 1")
        if self.l2 is not None and self.l2 <= 0:
            raise ConfigError("l2 (lambda) must be positive")
        if not self.l2_grid or min(self.l2_grid) <= 0:
            raise ConfigError("l2_grid must hold positive values")
        if self.neighbours < 1 or self.popular_neighbours < 1:
            raise ConfigError("neighbours and popular_neighbours must be at least 1")
        if not 0.0 <= self.popular_share <= 1.0:
            raise ConfigError("popular_share must be in [0, 1]")
        if self.coarse_items < 10:
            raise ConfigError("coarse_items must be at least 10")
        validate_fields(self)


@dataclass
class EDLAEConfig(EASEConfig):
    dropout: float | None = setting(
        None,
        "EDLAE's dropout rate p in [0, 1) (0 is EASE); unset: chosen on validation with "
        "lambda from --dropout-grid",
    )
    dropout_grid: list[float] = setting(
        help="dropout rates to try when --dropout is unset",
        factory=lambda: list(DEFAULT_DROPOUT_GRID),
    )
    emphasis: Literal["full", "none"] = setting(
        "full",
        "full: EDLAE, B = I - P diagMat(1/diag P), zero diagonal (p = 0 is EASE); none: DLAE, "
        "B = I - P Lambda, the denoising without emphasis (Steck, NeurIPS 2020)",
    )
    popularity_exponent: float = setting(POPULARITY_EXPONENT, POPULARITY_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [p for p in [self.dropout, *self.dropout_grid] if p is not None and not 0 <= p < 1]
        if bad or not self.dropout_grid:
            raise ConfigError("dropout (and every dropout_grid value) must be in [0, 1)")


@dataclass
class PopularConfig:
    pass


@dataclass
class BlendConfig:
    parts: list[str] = setting(help="the two models' registry names", factory=list)
    configs: list[dict] = setting(help="the two models' settings", factory=list)
    weight: float = setting(0.5, "weight of the first part's standardised scores, in [0, 1]")

    def __post_init__(self) -> None:
        if len(self.parts) != 2 or len(self.configs) != 2:
            raise ConfigError("a blend has exactly two parts, each with its settings")
        if not 0.0 <= self.weight <= 1.0:
            raise ConfigError("the blend weight must be in [0, 1]")


@dataclass
class AutoConfig:
    candidates: list[str] = setting(
        help="models to fit and compare on validation, cheapest first",
        factory=lambda: ["edlae", "multvae", "recvae"],
    )
    blend: bool = setting(
        True, "also try a validation-weighted blend of the best linear and best autoencoder"
    )
    linear_cv: bool = setting(
        True,
        "the linear candidates choose lambda, p and the popularity penalty beta (from "
        f"{LINEAR_CV_BETAS}) on folds of the training users as well as on the validation "
        "users (their --selection cv --popularity-grid) where validation has fewer than "
        "2,000 users: more users behind the choice, at cv-folds + 1 solves per tried point; "
        "false: their defaults",
    )
    margin_z: float = setting(
        1.645,
        "another candidate displaces the best linear one only when its per-user validation "
        "gain over it exceeds z standard errors (1.645: one-sided 95 percent); 0: the plain "
        "best on validation",
    )

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ConfigError("--candidates names no model")
        if not self.margin_z >= 0:
            raise ConfigError("--margin-z must be >= 0 (standard errors of the paired gain)")


@dataclass
class InfAEConfig:
    ridge: float | None = setting(
        None,
        "inf-AE: the kernel ridge lambda, in units of the mean of K's diagonal (the mean "
        "squared history norm); unset: chosen on validation NDCG@100 from --ridge-grid",
    )
    ridge_grid: list[float] = setting(
        help="inf-AE: lambdas to try when --ridge is unset, then two geometric midpoints "
        "between the best and its better neighbour; on at most 2,000 validation users",
        factory=lambda: [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0],
    )
    fold_in_rows: bool = setting(
        True,
        "add the held-out users' fold-in rows (never their targets) to the users the kernel "
        "regression is fitted on, as EASE adds them to X^T X; false: the training users only",
    )
    max_users: int = setting(
        10000,
        "inf-AE: the kernel's users: every user up to this many (the exact fit), a seeded "
        "random sample beyond it (the fit holds a sample x sample kernel and its factor, and "
        "every score reads a sample x items matrix)",
    )
    beyond_max_users: Literal["nystrom", "sample"] = setting(
        "nystrom",
        "inf-AE above --max-users: nystrom (the sample are the kernel's landmarks and every "
        "user a target of the regression: Nystrom's subset of regressors) or sample (fit "
        "the sample alone)",
    )
    kernel_dtype: Literal["float32", "float64"] = setting(
        "float64", "inf-AE: dtype of the kernel and its Cholesky solve"
    )
    sample_seed: int = setting(0, "inf-AE: seed of the --max-users sample")

    def __post_init__(self) -> None:
        if self.ridge is not None and self.ridge <= 0:
            raise ConfigError("ridge (lambda) must be positive")
        if not self.ridge_grid or min(self.ridge_grid) <= 0:
            raise ConfigError("ridge_grid must hold positive lambdas")
        if self.max_users < 1:
            raise ConfigError("max_users must be at least 1")
