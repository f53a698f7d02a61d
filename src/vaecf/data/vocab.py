"""Vocabulary: raw identifiers <-> matrix positions, both directions, saved with every model; and
the item names file (item_names.parquet: item_id, name) that travels with it where the data has
names."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np
import polars as pl

from vaecf.errors import DataError
from vaecf.storage.safewrite import atomic_file

# The one spelling of an integer id as text: Python's str(int), so "10" is item 10 and "010",
# "-0", "+10" are no item; at most 19 digits (an int64), so no long text reaches int().
INT_ID = re.compile(r"0|-?[1-9][0-9]{0,18}", re.ASCII)

# An item name holds at most this many characters: a longer one is cut to its first
# MAX_NAME_CHARS - 1 and "…", by prepare (the manifest counts them: n_names_cut) and on loading
# names prepared before the limit (a warning says how many), so that an answer's size follows
# from its number of items.
MAX_NAME_CHARS = 500
CUT = "\u2026"

log = logging.getLogger("vaecf")


class Vocabulary:
    """Raw ids (int or str) in index order; `index_of` maps raw ids back to positions."""

    def __init__(self, ids: Sequence | np.ndarray, name: str = "item_id"):
        self.ids = pl.Series(name, ids)
        self.name = name
        self.is_int = self.ids.dtype.is_integer()
        self.array = self.ids.to_numpy()  # int64, or object (str); array[indices] -> raw ids
        values = self.ids.to_list()
        self._index = {v: i for i, v in enumerate(values)}
        if len(self._index) != len(values):
            raise DataError(f"vocabulary {name} has duplicate ids")

    def __len__(self) -> int:
        return len(self.ids)

    def _coerce(self, raw):
        if self.is_int and not isinstance(raw, (int, np.integer)) or isinstance(raw, bool):
            # "42" names item 42; nothing else does: not "042", " 42", "4_2", "+42", "٤٢" or True
            if isinstance(raw, str) and INT_ID.fullmatch(raw):
                return int(raw)
            return None
        if not self.is_int and not isinstance(raw, str):
            return str(raw)
        return raw

    def index_of(self, raw_ids: Iterable) -> tuple[list[int], list]:
        """Positions of the known ids (in input order) and the unknown ids: as given, but an
        integer catalogue's "42" as 42, the type its known ids come back in."""
        known, unknown = [], []
        for raw in raw_ids:
            key = self._coerce(raw)
            idx = None if key is None else self._index.get(key)
            if idx is None:
                unknown.append(key if self.is_int and key is not None else raw)
            else:
                known.append(idx)
        return known, unknown

    def id_of(self, indices: Iterable[int]) -> list:
        return self.array[np.asarray(list(indices), dtype=np.int64)].tolist()

    def save(self, path: str | os.PathLike) -> None:
        with atomic_file(path) as f:
            self.ids.to_frame().write_parquet(f)

    @classmethod
    def load(cls, path: str | os.PathLike, name: str = "item_id") -> Vocabulary:
        try:
            s = pl.read_parquet(path).get_column(name)
        except FileNotFoundError:
            raise DataError(f"{path} is missing") from None
        except Exception as e:
            raise DataError(f"{path} is not a readable vocabulary ({e})") from None
        return cls(s.to_numpy() if s.dtype.is_integer() else s.to_list(), name=name)


def cut_names(names: pl.Series) -> tuple[pl.Series, int]:
    """`names` with each longer than MAX_NAME_CHARS cut to that many (ending in "…"), and how
    many were cut."""
    long = names.str.len_chars() > MAX_NAME_CHARS
    n = int(long.sum())
    if n:
        cut = names.str.slice(0, MAX_NAME_CHARS - 1) + CUT
        names = pl.select(pl.when(long).then(cut).otherwise(names)).to_series().alias(names.name)
    return names, n


def load_item_names(path: str | os.PathLike) -> dict:
    """{raw item id: name} from an item_names.parquet (a prepared dataset's or a run's), every
    name at most MAX_NAME_CHARS long (a file written before the limit is cut, with a warning)."""
    try:
        df = pl.read_parquet(path, columns=["item_id", "name"])
    except FileNotFoundError:
        raise DataError(f"{path} is missing") from None
    except Exception as e:
        raise DataError(f"{path} is not a readable item names file ({type(e).__name__})") from None
    names, n = cut_names(df.get_column("name"))
    if n:
        log.warning(
            "%d item names in %s are longer than %d characters (prepared before vaecf limited "
            "them): cut to %d",
            n, path, MAX_NAME_CHARS, MAX_NAME_CHARS,
        )  # fmt: skip
    return dict(zip(df.get_column("item_id").to_list(), names.to_list()))
