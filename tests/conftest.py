"""The fixtures the test files share: a prepared dataset of planted taste groups (module-scoped in
each file, with that file's own sizes and seed), and $VAECF_HOME in a temporary directory. Quiet
CPU training settings: tests/helpers.py."""

from __future__ import annotations

import os

import pytest

import vaecf
from vaecf.data import synthetic


@pytest.fixture(scope="session", autouse=True)
def vaecf_home(tmp_path_factory):
    """$VAECF_HOME in a temporary directory for the whole session (tests that need their own
    set theirs): what vaecf caches there, e.g. `--precision auto`'s timings, stays out of the
    user's ~/.cache/vaecf, and every session (each xdist worker) starts with none."""
    was = os.environ.get("VAECF_HOME")
    os.environ["VAECF_HOME"] = str(tmp_path_factory.mktemp("vaecf-home"))
    yield os.environ["VAECF_HOME"]
    if was is None:
        os.environ.pop("VAECF_HOME", None)
    else:
        os.environ["VAECF_HOME"] = was


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
