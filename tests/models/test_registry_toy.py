"""Adding a model is its module plus one declaration: a toy model in a temporary module,
declared with `vaecf.config.specs.register`, is found by the registry, `vaecf models`, the CLI's
flags, TOML settings files, the model contract and `vaecf.fit`, with no other edit."""

from __future__ import annotations

import importlib
import json
import sys

import numpy as np
import pandas as pd
import pytest

import vaecf
from vaecf import models
from vaecf.cli import build_parser, main
from vaecf.config import specs
from vaecf.config import toml as configfile

TOY_MODULE = """
from dataclasses import dataclass

import numpy as np
import torch

from vaecf.config import specs
from vaecf.models.base import Model
from vaecf.config.settings import setting


@dataclass
class ToyConfig:
    smoothing: float = setting(1.0, "added to every item's count")


SPEC = specs.Spec(
    "toy", "Toy", "baseline", "item counts plus a constant", ToyConfig, "vaecf_toy:Toy",
    closed_form=True, train_settings=(),
)


class Toy(Model):
    spec = SPEC

    def __init__(self, n_items, config=None):
        super().__init__(n_items, config)
        self.register_buffer("counts", torch.zeros(n_items))

    def scores(self, batch):
        return self.counts.expand(batch.batch_size, -1).clone()

    def dense_scores(self, x):
        return x[:, :1] * 0.0 + self.counts

    def fit(self, train, validate=None, select_metric="ndcg@100", log=None, **_):
        counts = np.asarray(train.getnnz(axis=0), dtype=np.float32) + self.config.smoothing
        self.counts = torch.from_numpy(counts)
        return {"smoothing": self.config.smoothing}
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "vaecf_toy.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("vaecf_toy")
    specs.register(module.SPEC)
    yield module
    del specs.SPECS["toy"]
    sys.modules.pop("vaecf_toy", None)


def test_a_declared_model_is_everywhere_the_built_in_ones_are(toy, tmp_path, capsys):
    assert models.MODELS["toy"] is toy.Toy and models.get("toy") is toy.Toy
    assert models.Toy is toy.Toy and models.ToyConfig is toy.ToyConfig
    assert "toy" in list(models.MODELS)
    # vaecf models
    assert main(["models", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert listed["toy"]["settings"][0]["name"] == "smoothing"
    # the CLI's flags: --model toy and its setting
    argv = ["train", "--data", "d", "--out", "r", "--model", "toy", "--smoothing", "3"]
    args = build_parser().parse_args(argv)
    assert args.model == "toy" and args.smoothing == 3.0
    # TOML
    file = configfile.loads('[model]\nname = "toy"\nsmoothing = 2.5\n')
    assert models.config_from_dict(file.model, file.model_config) == toy.ToyConfig(2.5)
    # the model contract: built, fitted, scored, through vaecf.fit and a saved run
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"user": rng.integers(0, 60, 900), "item": rng.integers(0, 40, 900)})
    df = df.drop_duplicates()
    rec = vaecf.fit(df, model="toy", smoothing=5.0, out=tmp_path / "run", progress=False)
    history = [int(df.item.iloc[0])]
    top = rec.recommend(history, k=3)
    counts = rec.model.counts.clone()  # the training users' counts, plus the smoothing
    assert counts.min() >= 5.0
    counts[rec.items.index_of(history)[0]] = -1  # a history's own items are never recommended
    assert top.scores == pytest.approx(counts.sort(descending=True).values[:3].tolist())
    loaded = vaecf.Recommender.load(tmp_path / "run")
    assert loaded.recommend(history, k=3).item_ids == top.item_ids
    assert loaded.model.config.smoothing == 5.0


def test_a_declaration_names_a_class_that_carries_it(toy):
    stray = specs.Spec("stray", "Stray", "baseline", "", toy.ToyConfig, "vaecf_toy:Toy")
    specs.register(stray)
    try:
        with pytest.raises(ImportError, match="does not declare spec 'stray'"):
            models.get("stray")
    finally:
        del specs.SPECS["stray"]
    with pytest.raises(ValueError, match="declared already"):
        specs.register(toy.SPEC)


def test_the_toy_passes_the_model_contract_tests(toy, planted, tmp_path):
    """The contract tests every built-in model passes (tests/models/test_models.py), on the toy."""
    from tests.models import test_models as contract

    ds = planted("toy", 300, 60, 3, 12, seed=1, heldout=30)
    run = vaecf.train(ds, contract.cfg_for("toy"), tmp_path / "toy", model="toy")
    runs = {"toy": run.run_dir}
    contract.test_scores_shape_and_history_excluded("toy", runs, ds)
    contract.test_evaluate_equals_brute_force_ranking("toy", runs, ds)
    contract.test_seeded_runs_are_identical_and_round_trip("toy", runs, ds, tmp_path)
