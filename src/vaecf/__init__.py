"""vaecf: fast, sparse Mult-VAE and Mult-DAE for collaborative filtering, in PyTorch.

    import vaecf
    ds = vaecf.prepare_csv("ratings.csv", "prepared/ml", user_col="userId", item_col="movieId",
                           rating_col="rating", settings=vaecf.PrepareSettings(min_rating=4))
    run = vaecf.train(ds, vaecf.TrainConfig(epochs=200), out="runs/ml")
    vaecf.Recommender.load("runs/ml").recommend(["1", "296"], k=10)
"""

__version__ = "0.1.0"

from vaecf.config import ModelConfig, PrepareSettings, TrainConfig  # noqa: E402
from vaecf.data import PreparedDataset, load_prepared, prepare_csv, prepare_frame  # noqa: E402
from vaecf.errors import DataError, RunError, VaecfError  # noqa: E402
from vaecf.evaluate import evaluate_model, evaluate_scores, popularity_scores  # noqa: E402
from vaecf.models import MultDAE, MultVAE  # noqa: E402
from vaecf.recommender import Recommendation, Recommender  # noqa: E402
from vaecf.train import RunResult, train  # noqa: E402

__all__ = [
    "DataError", "ModelConfig", "MultDAE", "MultVAE", "PrepareSettings", "PreparedDataset",
    "Recommendation", "Recommender", "RunError", "RunResult", "TrainConfig", "VaecfError",
    "__version__", "evaluate_model", "evaluate_scores", "load_prepared", "popularity_scores",
    "prepare_csv", "prepare_frame", "train",
]
