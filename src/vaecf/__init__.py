"""vaecf: Mult-VAE, Mult-DAE, RecVAE, EASE, EDLAE, inf-AE and `auto` for implicit feedback.

    import vaecf
    rec = vaecf.fit(ratings_df, user_col="userId", item_col="movieId")  # all in memory
    rec.recommend([1, 296, 318], k=10)

    ds = vaecf.prepare("ml-20m")                    # download, verify, prepare (cached)
    run = vaecf.train(ds, vaecf.TrainConfig(epochs=200), out="runs/ml20m")
    vaecf.Recommender.load("runs/ml20m").recommend([1, 296, 318], k=10)

Names are imported on first use, so `import vaecf` (and the CLI's data verbs) do not pay for
importing torch until something needs it.
"""

from __future__ import annotations

import importlib

from vaecf.runtime import calm_openblas
from vaecf.version import __version__

calm_openblas()  # before scipy's OpenBLAS loads (vaecf.runtime)

_EXPORTS = {
    "ModelConfig": "vaecf.config",
    "PrepareSettings": "vaecf.data.prepare",
    "TrainConfig": "vaecf.config",
    "PreparedDataset": "vaecf.data.prepare",
    "load_prepared": "vaecf.data.prepare",
    "prepare_csv": "vaecf.data.prepare",
    "prepare_frame": "vaecf.data.prepare",
    "prepare_dataset": "vaecf.data.prepare",
    "dataset_settings": "vaecf.data.prepare",
    "DataError": "vaecf.errors",
    "RunError": "vaecf.errors",
    "VaecfError": "vaecf.errors",
    "evaluate_model": "vaecf.evaluate",
    "fit": "vaecf.fitting",
    "evaluate_scores": "vaecf.evaluate",
    "popularity_scores": "vaecf.evaluate",
    "Recommendation": "vaecf.recommender",
    "Recommender": "vaecf.recommender",
    "RunResult": "vaecf.training.run",
    "train": "vaecf.training",
    "update": "vaecf.training.update",
}
_ALIASES = {"prepare": "prepare_dataset"}  # vaecf.prepare("ml-20m")
# from vaecf.models (a declared model's class or settings by name: vaecf.EDLAE, vaecf.EDLAEConfig)
_MODELS = ["MODELS", "Model", "MultVAE", "MultDAE", "RecVAE", "EASE", "Popular", "EASEConfig"]
__all__ = ["__version__", *_EXPORTS, *_ALIASES, *_MODELS, "RecVAEConfig"]


def __getattr__(name: str):
    target = _ALIASES.get(name, name)
    if target in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[target]), target)
    elif name[:1].isupper():
        models = importlib.import_module("vaecf.models")
        try:
            value = getattr(models, name)
        except AttributeError:
            raise AttributeError(f"module 'vaecf' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'vaecf' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
