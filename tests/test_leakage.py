"""No model trained under a time protocol has seen the future, for every model family.

Two datasets agree up to the test period's start and differ after it: in one, the test period
brings items that exist only then and a shift of popularity to items rare before the cut. Every
model (autoencoders, linear models, popularity, and `auto`'s selection over them) trained on
each must come out bit for bit the same, with the same validation figures, while the test
figures differ: what happened after the cut reached nothing that was fitted or selected.
"""

import json

import numpy as np
import polars as pl
import pytest
import torch

import vaecf
from tests.models.test_models import cfg_for, model_cfg
from vaecf.data import synthetic

MODELS = ["multvae", "multdae", "recvae", "recvae-edlae", "infae", "ease", "edlae", "popular"]
SETTINGS = dict(protocol="temporal", validation_share=0.1, test_share=0.15, min_user_items=3)


def timed(seed: int) -> pl.DataFrame:
    """Planted interactions at random distinct times, in time order."""
    df = synthetic.generate(n_users=400, n_items=90, n_groups=4, mean_items=14, seed=seed)
    t = np.random.default_rng(seed).permutation(df.height).astype(float)
    return df.with_columns(time=pl.Series(t)).sort("time")


def with_another_future(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`df` with its test period's items replaced: a third by items that never occurred before,
    the rest by the items that were rarest before the cut (a popularity shift)."""
    n_test = int(np.ceil(SETTINGS["test_share"] * df.height))
    past, future = df.head(df.height - n_test), df.tail(n_test)
    rarest = past.get_column("item_id").value_counts().sort("count").head(5)
    rng = np.random.default_rng(seed)
    new = [
        int(1000 + rng.integers(20)) if k % 3 == 0 else int(rng.choice(rarest["item_id"]))
        for k in range(n_test)
    ]
    future = future.with_columns(item_id=pl.Series(new, dtype=df.schema["item_id"]))
    return pl.concat([past, future])


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("leak")
    df = timed(7)
    settings = vaecf.PrepareSettings(**SETTINGS)
    a = vaecf.prepare_frame(df, root / "a", settings)
    b = vaecf.prepare_frame(with_another_future(df, 8), root / "b", settings)
    return root, a, b


def test_the_twins_differ_only_in_the_test_period(twins):
    _, a, b = twins
    for split in ("train", "validation_tr", "validation_te"):
        x, y = a.split(split), b.split(split)
        assert x.shape == y.shape and (x != y).nnz == 0, split
    x, y = a.split("test_te"), b.split("test_te")
    assert x.shape != y.shape or (x != y).nnz > 0
    assert a.items.ids.to_list() == b.items.ids.to_list()
    assert not {i for i in a.items.ids.to_list() if i >= 1000}  # the future's items: unknown


def weights(run) -> dict:
    return vaecf.Recommender.load(run, device="cpu").model.state_dict()


@pytest.mark.parametrize("name", [*MODELS, "auto"])
def test_no_model_sees_the_future(twins, name):
    root, a, b = twins
    runs = []
    for tag, ds in (("a", a), ("b", b)):
        if name == "auto":
            cfg = cfg_for("multvae", budget=None)
            vaecf.train(ds, cfg, root / f"{name}-{tag}", model="auto")
        else:
            vaecf.train(ds, cfg_for(name), root / f"{name}-{tag}", model_cfg(name), model=name)
        runs.append(root / f"{name}-{tag}")
    wa, wb = weights(runs[0]), weights(runs[1])
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    ra, rb = (json.loads((r / "results.json").read_text()) for r in runs)
    assert ra["validation"] == rb["validation"]
    assert ra["test"] != rb["test"]  # the test figures did see the two futures
