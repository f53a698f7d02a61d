"""Synthetic interactions with planted structure: the built-in demo dataset and test fixtures.

Users belong to latent taste groups; each group prefers its own block of items. Item popularity
follows a power law and user activity is heavy-tailed (log-normal), as in real implicit data. A
user's items are drawn without replacement (Gumbel top-k) from a mixture of their group's taste
and global popularity, so a model that learns the groups beats popularity ranking by far.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from vaecf.data.sources import ITEM, USER


def generate(
    n_users: int = 20_000,  # number of users
    n_items: int = 2_000,  # number of items
    n_groups: int = 20,  # latent taste groups; items are split into as many blocks
    mean_items: float = 40.0,  # median interactions per user (log-normal activity)
    activity_sigma: float = 0.7,  # spread of log activity (heavy tail)
    popularity_exponent: float = 0.8,  # Zipf exponent of global item popularity
    affinity: float = 0.8,  # share of a user's draws from their group's block
    seed: int = 0,  # everything is deterministic given the seed
) -> pl.DataFrame:
    """Return a frame of (user_id, item_id) interactions, users in id order."""
    if n_items < max(n_groups, 10) or n_users < 1:
        raise ValueError("need n_items >= max(n_groups, 10) and n_users >= 1")
    rng = np.random.default_rng(seed)
    rank = rng.permutation(n_items)  # popularity rank of each item id
    pop = (rank + 1.0) ** -popularity_exponent
    pop /= pop.sum()
    item_group = rng.integers(0, n_groups, n_items)
    group_dist = np.zeros((n_groups, n_items))
    for g in range(n_groups):
        in_g = item_group == g
        group_dist[g, in_g] = pop[in_g] / pop[in_g].sum()
    user_group = rng.integers(0, n_groups, n_users)
    activity = np.exp(rng.normal(np.log(mean_items), activity_sigma, n_users))
    activity = np.clip(np.round(activity), 5, max(5, n_items // 4)).astype(np.int64)

    users, items = [], []
    chunk = max(1, 4_000_000 // n_items)
    for lo in range(0, n_users, chunk):
        hi = min(n_users, lo + chunk)
        probs = affinity * group_dist[user_group[lo:hi]] + (1 - affinity) * pop
        keys = np.log(probs + 1e-30) + rng.gumbel(size=probs.shape)
        # each user's `activity` largest keys, largest first (a partial sort: the same as a
        # full argsort's first columns, at O(n_items) a user)
        k = int(activity[lo:hi].max())
        top = np.argpartition(-keys, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, 1), 1), 1)
        for u in range(lo, hi):
            chosen = order[u - lo, : activity[u]]
            users.append(np.full(chosen.size, u, dtype=np.int64))
            items.append(chosen)
    return pl.DataFrame({USER: np.concatenate(users), ITEM: np.concatenate(items)})
