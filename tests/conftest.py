"""What the test files share: a prepared dataset of planted taste groups (module-scoped in each
file, with that file's own sizes and seed) and quiet, reproducible CPU training settings."""

from __future__ import annotations

import pytest

import vaecf
from vaecf.data import synthetic


def cpu_config(**kw) -> vaecf.TrainConfig:
    """Training settings for a quiet CPU run in fp32; `kw` sets the rest (seed, epochs, ...)."""
    return vaecf.TrainConfig(**{"device": "cpu", "precision": "fp32", "progress": False, **kw})


@pytest.fixture(scope="session")
def planted(tmp_path_factory):
    """planted(name, n_users, n_items, n_groups, mean_items, seed, heldout): synthetic data
    (vaecf.data.synthetic) prepared with `heldout` validation and test users each."""

    def make(name, n_users, n_items, n_groups, mean_items, seed, heldout):
        df = synthetic.generate(
            n_users=n_users, n_items=n_items, n_groups=n_groups, mean_items=mean_items, seed=seed
        )
        settings = vaecf.PrepareSettings(heldout_users=heldout, seed=seed)
        return vaecf.prepare_frame(df, tmp_path_factory.mktemp(name) / "prep", settings)

    return make
