"""The histories of a prepared dataset's users, found by raw user id: what
`Recommender.recommend_user` folds in. A training user's history is their training row; a
validation or test user's is their fold-in row (`*_tr`), never their held-out target (`*_te`).

A user id is matched as the data spells it, by the rule item ids follow (`Vocabulary`): an
integer-id dataset takes 42 or "42", a text-id one the text.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from vaecf.data.prepared import PreparedDataset
from vaecf.data.sources import USER
from vaecf.data.vocab import Vocabulary
from vaecf.errors import DataError, UnknownUserError

# the rows of each split in users.parquet's order: training, then validation, then test users
HISTORY_SPLITS = ("train", "validation_tr", "test_tr")
INSTEAD = "recommend from a history of item ids instead"


class UserHistories:
    """Every user of a prepared dataset: raw id -> the item indices of their history."""

    def __init__(self, ds: PreparedDataset):
        users = ds.users.with_row_index("row")
        self.path = ds.path
        rows = sp.vstack([ds.split(s) for s in HISTORY_SPLITS], format="csr")
        if rows.shape[0] != users.height:
            raise DataError(
                f"{ds.path}/users.parquet lists {users.height} users, its splits hold "
                f"{rows.shape[0]}; prepare the dataset again"
            )
        # a time protocol lists a user once per split they are in: their latest history is the
        # last (the test period's holds everything before it)
        users = users.unique(USER, keep="last", maintain_order=True)
        ids = users.get_column(USER)
        self.users = Vocabulary(ids.to_numpy() if ids.dtype.is_integer() else ids.to_list(), USER)
        self.rows = rows[users.get_column("row").to_numpy()]

    def __len__(self) -> int:
        return len(self.users)

    def find(self, user) -> tuple:
        """(the user's id as the data spells it, their history's item indices, ascending);
        UnknownUserError when the data has no such user."""
        known, _ = self.users.index_of([user])
        if not known:
            raise UnknownUserError(
                f"user {user!r} is not in the run's data ({len(self):,} users: its training "
                f"users and held-out users); check the id, or {INSTEAD}"
            )
        r = known[0]
        items = self.rows.indices[self.rows.indptr[r] : self.rows.indptr[r + 1]]
        return self.users.id_of([r])[0], np.sort(items)


def run_histories(run_data: dict, data: str | os.PathLike | None = None) -> UserHistories:
    """The user histories of the dataset a run was trained on: `run_data` is its config's
    "data" ({path, fingerprint, ...}); `data` names the dataset's directory where it has moved.
    DataError, in words, when the dataset is gone or is another one."""
    path = data if data is not None else run_data.get("path")
    if path is None:
        raise DataError(
            "this model names no prepared dataset to find its users in (it was not trained from "
            f"one); {INSTEAD}"
        )
    path = Path(path)
    if not (path / "manifest.json").is_file():
        if data is not None:
            what = "is gone" if not path.exists() else "is not a prepared dataset"
            raise DataError(f"{path} {what}: pass the directory of the run's prepared dataset")
        where = "is not a prepared dataset" if path.exists() else "is gone (moved or deleted)"
        raise DataError(
            f"the run's prepared dataset {path} {where}, and its users' histories are kept "
            f"there: pass the directory it is in now (--data DIR; Python: data=DIR), prepare "
            f"it again there, or {INSTEAD}"
        )
    ds = PreparedDataset(path)
    want = run_data.get("fingerprint")
    if want is not None and ds.fingerprint != want:
        raise DataError(
            f"{path} holds another dataset (fingerprint {ds.fingerprint}) than the one the run "
            f"was trained on ({want}); pass the run's own (--data DIR; Python: data=DIR)"
        )
    return UserHistories(ds)
