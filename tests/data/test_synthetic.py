"""synthetic.generate: determinism, validity and the heavy tails of real implicit data."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from vaecf.data.sources import ITEM, USER
from vaecf.data.synthetic import generate

SMALL = dict(n_users=2_000, n_items=2_000)


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    return generate(**SMALL, seed=0)


def test_same_seed_same_frame(frame):
    again = generate(**SMALL, seed=0)
    assert again.equals(frame)
    assert again.schema == frame.schema == {USER: pl.Int64, ITEM: pl.Int64}


def test_different_seed_differs(frame):
    other = generate(**SMALL, seed=1)
    assert not other.equals(frame)
    a = set(frame.iter_rows())
    b = set(other.iter_rows())
    assert len(a & b) < 0.5 * min(len(a), len(b))


def test_no_duplicate_pairs(frame):
    assert frame.select(USER, ITEM).is_duplicated().sum() == 0


def test_ids_in_range_and_users_in_id_order(frame):
    users = frame.get_column(USER).to_numpy()
    items = frame.get_column(ITEM).to_numpy()
    assert np.all(np.diff(users) >= 0)
    np.testing.assert_array_equal(np.unique(users), np.arange(SMALL["n_users"]))
    assert items.min() >= 0 and items.max() < SMALL["n_items"]


def test_every_user_has_at_least_five_items(frame):
    per_user = frame.group_by(USER).len().get_column("len")
    assert per_user.len() == SMALL["n_users"]
    assert per_user.min() >= 5
    assert per_user.max() <= SMALL["n_items"] // 4


def test_light_users_are_raised_to_five_items():
    # median 6 with a wide spread: a third of the log-normal draws fall under 5
    df = generate(n_users=3_000, n_items=500, mean_items=6, activity_sigma=1.0, seed=0)
    per_user = df.group_by(USER).len().get_column("len")
    assert per_user.len() == 3_000
    assert per_user.min() == 5
    assert (per_user == 5).sum() > 600


def test_small_catalogue_still_gives_five_items_or_raises():
    try:
        df = generate(n_users=50, n_items=12, n_groups=2, seed=0)
    except ValueError:
        return
    assert df.group_by(USER).len().get_column("len").min() >= 5


def test_item_popularity_is_heavy_tailed(frame):
    counts = np.sort(frame.group_by(ITEM).len().get_column("len").to_numpy())[::-1]
    n = SMALL["n_items"]
    share_top10 = counts[: n // 10].sum() / counts.sum()
    share_bottom50 = counts[n // 2 :].sum() / counts.sum()
    assert share_top10 > 0.25  # a uniform catalogue gives ~0.10
    assert share_bottom50 < 0.35  # ... and ~0.50
    assert counts[0] > 10 * np.median(counts)


def test_user_activity_is_heavy_tailed(frame):
    per_user = frame.group_by(USER).len().get_column("len").to_numpy()
    median = np.median(per_user)
    assert 30 <= median <= 50  # mean_items=40 is the median of the log-normal
    assert per_user.max() > 5 * median
    assert per_user.mean() > median  # right-skewed


def _neighbour_contrast(df: pl.DataFrame, n: int) -> float:
    """Mean cosine similarity of each user's 20 nearest users over the mean of all pairs."""
    m = np.zeros((n, n))
    m[df.get_column(USER).to_numpy(), df.get_column(ITEM).to_numpy()] = 1
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    sim = m @ m.T
    np.fill_diagonal(sim, 0)
    return float(np.sort(sim, axis=1)[:, -20:].mean() / sim.mean())


def test_planted_groups_make_neighbours_closer():
    """With taste groups, a user's nearest neighbours stand out far more than without them."""
    kw = dict(n_users=400, n_items=400, n_groups=4, seed=3)
    grouped = _neighbour_contrast(generate(**kw), 400)
    flat = _neighbour_contrast(generate(**kw, affinity=0.0), 400)
    assert grouped > 2.0
    assert grouped > 1.4 * flat


def test_bad_arguments():
    with pytest.raises(ValueError):
        generate(n_users=10, n_items=5, n_groups=10)
    with pytest.raises(ValueError):
        generate(n_users=0, n_items=100)
