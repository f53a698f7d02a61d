"""Splits, exactly as the paper's preprocessing code (Liang et al. 2018, ML-20M notebook).

- Held-out users: the sorted unique user ids are permuted with `RandomState(seed)`; the last
  2 x N go to validation then test, the rest train.
- Fold-in: each held-out user's rows (users in sorted id order, rows in file order) are split
  80/20 with one `RandomState(seed)` per split: `choice(n, int(0.2 * n), replace=False)` picks the
  targets of users with n >= 5; users with fewer keep all rows as fold-in.
- Thesis protocol: the same shuffle, cut at percentages of users instead of counts.
"""

from __future__ import annotations

import numpy as np

from vaecf.config.settings import spelled
from vaecf.errors import DataError


def heldout_counts_liang(n_users: int, n_heldout: int) -> tuple[int, int, int]:
    """(train, validation, test) user counts for N validation and N test users."""
    if n_heldout < 1:
        raise DataError(f"{spelled('heldout_users')} must be at least 1")
    if n_users <= 2 * n_heldout:
        raise DataError(
            f"only {n_users} users remain after filtering, but {n_heldout} validation + "
            f"{n_heldout} test held-out users leave none to train on; lower "
            f"{spelled('heldout_users')} to at most {max((n_users - 1) // 2, 0)}, or "
            f"{spelled('min_user_items')} to keep more users"
        )
    return n_users - 2 * n_heldout, n_heldout, n_heldout


def heldout_counts_percent(n_users: int, val_frac: float, test_frac: float) -> tuple[int, int, int]:
    """Thesis protocol: e.g. 7% validation and 7% test users, the rest train (test_frac 0: no
    test users, as a production fit has)."""
    counts = _percent_counts(n_users, val_frac, test_frac)
    if counts is None:
        raise DataError(_too_few(n_users, val_frac, test_frac))
    return counts


def _percent_counts(n_users: int, val_frac: float, test_frac: float):
    """(train, validation, test) counts, or None when one that must not be empty is."""
    n_val, n_test = int(round(n_users * val_frac)), int(round(n_users * test_frac))
    if n_val < 1 or (test_frac > 0 and n_test < 1) or n_users - n_val - n_test < 1:
        return None
    return n_users - n_val - n_test, n_val, n_test


def _too_few(n_users: int, val_frac: float, test_frac: float) -> str:
    """Why `n_users` cannot be split at these shares, and what to change."""
    held = f"{val_frac:.0%} of them for validation" + (
        f" and {test_frac:.0%} for test" if test_frac > 0 else ""
    )
    users = f"{n_users} user{'s' * (n_users != 1)} remain{'s' * (n_users == 1)}"
    lo = max(1, int(0.5 / min(val_frac, test_frac or 1.0)) - 1)  # below, a share rounds to 0
    fewest = next((n for n in range(lo, lo + 1000) if _percent_counts(n, val_frac, test_frac)), 0)
    need = f" (at least {fewest} users)" if fewest else ""
    more = f"keep more users: lower {spelled('min_user_items')} or {spelled('min_rating')}"
    if val_frac + test_frac >= 1:  # no number of users leaves any to train on
        more = (
            f"hold out less: {spelled('validation_frac')} and "
            f"{spelled('test_frac')} must add up to less than 1"
        )
    elif n_users >= 2 + (test_frac > 0):  # larger shares could make room for the held out
        more += (
            f"; or hold out a larger share: {spelled('validation_frac')} "
            "(vaecf.fit: validation=, a share or a number of users such as 1)"
        )
        if test_frac > 0:
            more += f" and {spelled('test_frac')} (vaecf.fit: test=)"
    return (
        f"{users} after filtering, too few to hold out {held} and train on the rest{need}: {more}"
    )


def shuffle_users(sorted_user_ids: np.ndarray, seed: int) -> np.ndarray:
    """The paper's `np.random.seed(seed); unique_uid[np.random.permutation(n)]`."""
    return sorted_user_ids[np.random.RandomState(seed).permutation(sorted_user_ids.size)]


def fold_in_mask(
    group_sizes: np.ndarray, seed: int, test_prop: float = 0.2, min_items: int = 5
) -> np.ndarray:
    """Boolean mask over rows grouped by user (consecutive groups): True = target (held out).

    Reproduces `split_train_test_proportion` of the paper's code draw for draw.
    """
    rs = np.random.RandomState(seed)
    mask = np.zeros(int(group_sizes.sum()), dtype=bool)
    start = 0
    for n in group_sizes.tolist():
        if n >= min_items:
            pick = rs.choice(n, size=int(test_prop * n), replace=False).astype("int64")
            mask[start + pick] = True
        start += n
    return mask
