"""What the models are, without the models: every model's declaration (registry name, title,
family, one line on what it is, its settings dataclass from `vaecf.config.modelconfigs`, which
training settings it reads), importing no torch. The command line builds its options, choices
and help from here, so `vaecf --help` and the data verbs start without torch; each model class
(vaecf.models) takes its declaration from its `Spec`, so every fact is stated once.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from vaecf.config.modelconfigs import (
    AutoConfig,
    BlendConfig,
    EASEConfig,
    EDLAEConfig,
    HybridConfig,
    InfAEConfig,
    ModelConfig,
    PopularConfig,
    RecVAEConfig,
)

# Training settings (vaecf.config.TrainConfig) that only gradient models read, and those only
# a KL-annealed model reads. A model declares what it reads in `train_settings`; the others,
# given, are refused before a run starts.
GRADIENT_SETTINGS = (
    "epochs",
    "batch_size",
    "lr",
    "data_on",
    "cuda_graphs",
    "first_layer",
    "eval_every",
    "checkpoint_every",
    "patience",
)
ANNEAL_SETTINGS = ("total_anneal_steps", "anneal_cap")
# Under --budget, the next epoch's (or search point's) time is forecast as the last one's times
# this: machines are shared and their speed drifts by up to 1.6x between minutes
FORECAST_MARGIN = 1.5
FAMILIES = ("autoencoder", "linear", "baseline", "selection")


# -- declarations ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """A model's declaration; its class (vaecf.models) copies these as class attributes."""

    name: str  # registry name, `--model NAME`
    title: str  # for tables: "Mult-VAE"
    family: str  # one of FAMILIES
    summary: str  # one line on what it is (`vaecf models`)
    Config: type  # the settings dataclass
    home: str  # "module:Class", where the model class lives (vaecf.models.registry imports it)
    closed_form: bool = False
    trainable: bool = True  # False: made by another verb (a blend, by --model auto)
    train_settings: tuple[str, ...] = GRADIENT_SETTINGS  # the TrainConfig settings it reads

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: family must be one of {FAMILIES}")


MULTVAE = Spec(
    "multvae",
    "Mult-VAE",
    "autoencoder",
    "variational autoencoder with a multinomial likelihood (Liang et al., WWW 2018)",
    ModelConfig,
    "vaecf.models.multvae:MultVAE",
    train_settings=(*GRADIENT_SETTINGS, *ANNEAL_SETTINGS),
)
MULTDAE = Spec(
    "multdae",
    "Mult-DAE",
    "autoencoder",
    "denoising autoencoder with a multinomial likelihood (Liang et al., WWW 2018)",
    ModelConfig,
    "vaecf.models.multvae:MultDAE",
)
RECVAE = Spec(
    "recvae",
    "RecVAE",
    "autoencoder",
    "Mult-VAE with a composite prior, a deeper encoder and alternating updates "
    "(Shenbin et al., WSDM 2020)",
    RecVAEConfig,
    "vaecf.models.recvae:RecVAE",
)
RECVAE_EDLAE = Spec(
    "recvae-edlae",
    "RecVAE+EDLAE",
    "autoencoder",
    "RecVAE whose logits add a frozen EDLAE path, alpha (x B), fitted before training",
    HybridConfig,
    "vaecf.models.hybrid:RecVAEEDLAE",
)
INFAE = Spec(
    "infae",
    "inf-AE",
    "autoencoder",
    "the infinitely wide one-hidden-layer autoencoder in closed form: kernel ridge regression "
    "over users with its neural tangent kernel (Sachdeva et al., NeurIPS 2022)",
    InfAEConfig,
    "vaecf.models.infae:InfAE",
    closed_form=True,
    train_settings=(),
)
EASE = Spec(
    "ease",
    "EASE",
    "linear",
    "item-item linear autoencoder with a zero diagonal, closed form (Steck, WWW 2019)",
    EASEConfig,
    "vaecf.models.ease:EASE",
    closed_form=True,
    train_settings=(),
)
EDLAE = Spec(
    "edlae",
    "EDLAE",
    "linear",
    "EASE with emphasized denoising (dropout p), closed form (Steck, NeurIPS 2020)",
    EDLAEConfig,
    "vaecf.models.ease:EDLAE",
    closed_form=True,
    train_settings=(),
)
POPULAR = Spec(
    "popular",
    "popularity",
    "baseline",
    "every user gets the items ranked by their training counts",
    PopularConfig,
    "vaecf.models.popular:Popular",
    closed_form=True,
    train_settings=(),
)
AUTO = Spec(
    "auto",
    "auto",
    "selection",
    "fits the candidates that fit the machine (and --budget), keeps the best on "
    "validation, a blend of the best linear and best autoencoder included",
    AutoConfig,
    "vaecf.models.blend:Auto",
    closed_form=True,
    train_settings=(*GRADIENT_SETTINGS, *ANNEAL_SETTINGS),  # passed on to the candidates
)
BLEND = Spec(
    "blend",
    "blend",
    "selection",
    "validation-weighted mix of two models' standardised scores (made by --model auto "
    "from the best linear and the best autoencoder)",
    BlendConfig,
    "vaecf.models.blend:Blend",
    closed_form=True,
    trainable=False,
    train_settings=(),
)

# Every declared model, in the registry's order (vaecf.models.MODELS: the class each names).
SPECS: dict[str, Spec] = {
    s.name: s
    for s in (MULTVAE, MULTDAE, RECVAE, RECVAE_EDLAE, INFAE, EASE, EDLAE, POPULAR, AUTO, BLEND)
}


def register(spec: Spec) -> Spec:
    """Declare a model that lives outside vaecf (its class's `spec`): from then on it is a
    `--model`, in `vaecf models`, TOML and `vaecf.fit` like the built-in ones."""
    if spec.name in SPECS:
        raise ValueError(f"a model named {spec.name!r} is declared already")
    SPECS[spec.name] = spec
    return spec


def describe() -> list[dict]:
    """Every registered model as declared: name, title, family, one line on what it is, and
    its settings (name, default, help). `vaecf models` prints it; the README's table is
    checked against it."""
    out = []
    for name, spec in SPECS.items():
        settings = []
        for f in fields(spec.Config):
            if f.name == "model":
                continue
            default = f.default if f.default is not MISSING else f.default_factory()
            settings.append(
                {"name": f.name, "default": default, "help": f.metadata.get("help", "")}
            )
        out.append(
            {
                "name": name,
                "title": spec.title or name,
                "family": spec.family,
                "summary": spec.summary,
                "settings": settings,
            }
        )
    return out
