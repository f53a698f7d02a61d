"""Prepare: an interaction frame -> a prepared dataset directory, written atomically.

Directory: train.npz, validation_tr.npz, validation_te.npz, test_tr.npz, test_te.npz (scipy CSR,
user x item, float32 ones), items.parquet (raw item id per column), users.parquet (raw user id
per row: training users, then validation, then test), manifest.json (source checksum, settings,
counts, fingerprint, library version), and item_names.parquet (item_id, name) where the data names
its items: only items of the vocabulary, ids typed like items.parquet's, names cut to
vocab.MAX_NAME_CHARS characters (counted in the manifest: n_names_cut). Its checksum is in the
manifest like every file's; names from a user's file (`prepare_csv(item_names=...)`) are part of
the fingerprint, a registry dataset's (read beside its raw files) are not: they come with the same
download, and a dataset prepared again to gain them keeps matching the runs trained on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import scipy.sparse as sp

from vaecf.data import splits
from vaecf.data.sources import (
    ITEM,
    NAME,
    RATING,
    USER,
    check_columns,
    read_names_table,
    read_table,
    resolve_columns,
)
from vaecf.data.vocab import Vocabulary, cut_names, load_item_names
from vaecf.errors import DataError
from vaecf.safewrite import (
    atomic_dir,
    atomic_file,
    load_csr,
    save_csr,
    sweep_temps,
    write_json,
    writer_lock,
)
from vaecf.settings import flag, setting, spelled, validate_fields
from vaecf.version import __version__

FORMAT_VERSION = 2  # 2: per-file checksums in the manifest; part of the fingerprint
SPLIT_FILES = ("train", "validation_tr", "validation_te", "test_tr", "test_te")
ITEM_NAMES = "item_names.parquet"


# the settings that apply to one protocol only, and their defaults under it
PROTOCOL_FIELDS = {
    "liang": {"heldout_users": 10_000},
    "thesis": {"validation_frac": 0.07, "test_frac": 0.07},
}


@dataclass
class PrepareSettings:
    """Every preprocessing choice; all of it is hashed into the fingerprint.

    Settings of the other protocol stay None (the default for the chosen protocol is filled in);
    `validate` refuses one that is set, since it would do nothing.
    """

    min_rating: float | None = setting(
        None,
        "keep rows with rating >= X as positives (the paper keeps 'rating > 3.5' on MovieLens); "
        "unset: every row",
    )
    min_item_users: int = setting(0, "first drop items with fewer users")
    min_user_items: int = setting(5, "then drop users with fewer positives, as the paper does")
    protocol: Literal["liang", "thesis"] = setting(
        "liang", "liang: N validation + N test users (the paper); thesis: percentages of users"
    )
    heldout_users: int | None = setting(None, "liang: N users in validation, and N in test")
    validation_frac: float | None = setting(None, "thesis: fraction of users for validation")
    test_frac: float | None = setting(None, "thesis: fraction of users for test (0: none)")
    target_frac: float = setting(0.2, "fraction of each held-out user's items to predict")
    seed: int = setting(98765, "seed of the user shuffle and the fold-in split, the paper's")

    def __post_init__(self) -> None:
        for key, default in PROTOCOL_FIELDS.get(self.protocol, {}).items():
            if getattr(self, key) is None:
                setattr(self, key, default)

    def validate(self) -> None:
        validate_fields(self, DataError)  # a bad protocol is bad data settings
        for other, keys in PROTOCOL_FIELDS.items():
            if other == self.protocol:
                continue
            for key in keys:
                if getattr(self, key) is not None:
                    mine = ", ".join(flag(k) for k in PROTOCOL_FIELDS[self.protocol])
                    raise DataError(
                        f"{flag(key)} ({key}={getattr(self, key)}) applies to the {other} "
                        f"protocol only, and this dataset is split with the {self.protocol} "
                        f"protocol, where it would do nothing. Drop it, use {mine} instead, or "
                        f"pass --protocol {other}"
                    )
        if self.min_user_items < 1 or self.min_item_users < 0:
            raise DataError(
                f"{spelled('min_user_items')} must be at least 1 and {spelled('min_item_users')} "
                "at least 0"
            )
        if not 0 < self.target_frac < 1:
            raise DataError(f"the target fraction {spelled('target_frac')} must lie in (0, 1)")
        if self.protocol == "thesis":
            if not 0 < self.validation_frac < 1:
                raise DataError(
                    f"{flag('validation_frac')} must lie strictly between 0 and 1 "
                    "(validation_frac=; vaecf.fit: validation=, a share or a number of users)"
                )
            if not 0 <= self.test_frac < 1:  # 0: no test users (a production fit)
                raise DataError(
                    f"{flag('test_frac')} must lie in [0, 1) (test_frac=; vaecf.fit: test=)"
                )


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(settings: PrepareSettings, source: dict) -> str:
    keys = ("sha256", "columns", "sep")
    src = {k: source.get(k) for k in keys}
    if source.get("header_columns"):  # absent from older fingerprints: they stay valid
        src["header_columns"] = source["header_columns"]
    if source.get("parser"):  # a registry dataset: its parser is part of what was read
        src["parser"] = source["parser"]
    elif source.get("item_names"):  # a user's names file (a registry dataset's is not hashed in)
        src["item_names"] = {k: source["item_names"].get(k) for k in ("sha256", "columns", "sep")}
    blob = json.dumps(
        {"settings": asdict(settings), "source": src, "format_version": FORMAT_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_REPREPARE = "prepare the dataset again (the same `vaecf prepare` command with --overwrite)"
_COUNT_KEYS = ("n_users", "n_items", "n_train_users", "n_validation_users", "n_test_users")


def _manifest_digest(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _check_manifest(m, mpath: Path) -> None:
    """Structure and self-checksum of a manifest; DataError naming the file otherwise."""
    if not isinstance(m, dict):
        raise DataError(f"{mpath} is corrupted (not a JSON object); {_REPREPARE}")
    version = m.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise DataError(
            f"{mpath} was written by a newer vaecf (format {version}, this one reads up to "
            f"{FORMAT_VERSION}); upgrade vaecf or {_REPREPARE}"
        )
    counts = m.get("counts")
    ok = (
        isinstance(version, int)
        and isinstance(m.get("fingerprint"), str)
        and isinstance(m.get("settings"), dict)
        and isinstance(counts, dict)
        and all(isinstance(counts.get(k), int) and counts[k] >= 0 for k in _COUNT_KEYS)
    )
    if not ok:
        raise DataError(f"{mpath} is corrupted (fields missing or mistyped); {_REPREPARE}")
    if version >= 2 and not (isinstance(m.get("files"), dict) and "manifest_sha256" in m):
        raise DataError(f"{mpath} is corrupted (its checksums are missing); {_REPREPARE}")
    digest = m.get("manifest_sha256")
    if digest is not None and digest != _manifest_digest(m):
        raise DataError(
            f"{mpath} is corrupted (its content does not match its own checksum: edited or "
            f"damaged); {_REPREPARE}"
        )


class PreparedDataset:
    """A prepared directory: lazy access to its splits, vocabularies and manifest.

    The manifest is checked when the dataset is opened; every file is checked against the
    SHA-256 the manifest records for it when it is read (format 2 and later).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise DataError(
                f"{self.path} is not a prepared dataset (no manifest.json); "
                "create one with `vaecf prepare ... --out DIR`"
            )
        try:
            manifest = json.loads(mpath.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            msg = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise DataError(f"{mpath} is corrupted ({msg}); {_REPREPARE}") from None
        _check_manifest(manifest, mpath)
        self.manifest = manifest
        self._verified: set[str] = set()

    def _checked(self, name: str) -> Path:
        """`path/name`, after checking it against the manifest's SHA-256 (once per instance)."""
        f = self.path / name
        sums = self.manifest.get("files")
        if sums is None or name in self._verified:
            return f
        if not isinstance(sums, dict) or name not in sums:
            raise DataError(f"{self.path}/manifest.json lists no checksum for {name}; {_REPREPARE}")
        if not f.is_file():
            raise DataError(f"{f} is missing; {_REPREPARE}")
        if sha256_file(f) != sums[name]:
            raise DataError(
                f"{f} is corrupted (its SHA-256 differs from the one in manifest.json: truncated, "
                f"damaged or replaced); {_REPREPARE}"
            )
        self._verified.add(name)
        return f

    def verify(self) -> None:
        """Check every file the manifest lists (raises DataError naming the first bad one)."""
        for name in self.manifest.get("files") or {}:
            self._checked(name)

    def split(self, name: str) -> sp.csr_matrix:
        if name not in SPLIT_FILES:
            raise ValueError(f"split must be one of {SPLIT_FILES}, not {name!r}")
        f = self._checked(f"{name}.npz")
        m = load_csr(f)
        c = self.manifest["counts"]
        rows = {
            "train": c["n_train_users"],
            "validation_tr": c["n_validation_users"],
            "validation_te": c["n_validation_users"],
            "test_tr": c["n_test_users"],
            "test_te": c["n_test_users"],
        }[name]
        if m.shape != (rows, c["n_items"]):
            raise DataError(
                f"{f} holds a {m.shape[0]} x {m.shape[1]} matrix, but manifest.json says "
                f"{rows} x {c['n_items']}; {_REPREPARE}"
            )
        return m

    @cached_property
    def items(self) -> Vocabulary:
        voc = Vocabulary.load(self._checked("items.parquet"), ITEM)
        if len(voc) != self.n_items:
            raise DataError(
                f"{self.path / 'items.parquet'} holds {len(voc)} items, but manifest.json says "
                f"{self.n_items}; {_REPREPARE}"
            )
        return voc

    @cached_property
    def users(self) -> pl.DataFrame:
        """Raw user id and split of every user (training, then validation, then test)."""
        f = self._checked("users.parquet")
        try:
            return pl.read_parquet(f)
        except Exception as e:
            raise DataError(f"{f} is unreadable ({type(e).__name__}); {_REPREPARE}") from None

    def item_names_file(self) -> Path | None:
        """item_names.parquet, checked against the manifest; None when the data has no names."""
        if ITEM_NAMES not in (self.manifest.get("files") or {}):
            return None
        return self._checked(ITEM_NAMES)

    def item_names(self) -> dict | None:
        """{raw item id: name} for the items the data names, or None when it names none."""
        f = self.item_names_file()
        return None if f is None else load_item_names(f)

    @property
    def n_items(self) -> int:
        return int(self.manifest["counts"]["n_items"])

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    def __repr__(self) -> str:
        c = self.manifest["counts"]
        return (
            f"PreparedDataset({str(self.path)!r}, train_users={c['n_train_users']}, "
            f"items={c['n_items']}, validation={c['n_validation_users']}, "
            f"test={c['n_test_users']})"
        )


def _vocab_names(names: pl.DataFrame, item_ids: pl.Series, what: str) -> tuple[pl.DataFrame, int]:
    """(item_id, name) of the vocabulary's items that `names` names: ids cast to the vocabulary's
    type, blank names dropped, the first name of an id kept, in vocabulary order, names longer
    than vocab.MAX_NAME_CHARS cut to that length; and how many were cut."""
    ids = names.get_column(ITEM)
    if item_ids.dtype.is_integer():
        ids = ids.cast(pl.String).str.strip_chars().cast(pl.Int64, strict=False)
    else:
        ids = ids.cast(pl.String).str.strip_chars()
    name = names.get_column(NAME).cast(pl.String).str.strip_chars()
    df = pl.DataFrame({ITEM: ids, NAME: name}).filter(
        pl.col(ITEM).is_not_null() & pl.col(NAME).is_not_null() & (pl.col(NAME) != "")
    )
    df = df.unique(subset=ITEM, keep="first", maintain_order=True)
    vocab = pl.DataFrame({ITEM: item_ids.cast(df.schema[ITEM])}).with_row_index("pos")
    out = vocab.join(df, on=ITEM, how="inner").sort("pos")
    if out.height == 0 and names.height > 0:
        raise DataError(
            f"none of the {names.height} ids in {what} is an item of the dataset; check that its "
            "id column (--name-id-col) holds the same ids as the interactions' --item-col"
        )
    cut, n_cut = cut_names(out.get_column(NAME))
    return out.select(pl.col(ITEM).cast(item_ids.dtype)).with_columns(cut), n_cut


def load_prepared(path: str | os.PathLike) -> PreparedDataset:
    return PreparedDataset(path)


def _csr(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    m = sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)), shape=shape)
    m.sort_indices()
    return m


def _heldout(df: pl.DataFrame, lo: int, hi: int, n_items: int, settings: PrepareSettings):
    """Fold-in and target CSR for users with lo <= uidx < hi (rows restricted to known items)."""
    part = df.filter((pl.col("uidx") >= lo) & (pl.col("uidx") < hi) & pl.col("iidx").is_not_null())
    # the paper's groupby('userId') visits users in sorted raw-id order, rows in file order
    part = part.sort([USER, "row"])
    sizes = part.group_by(USER, maintain_order=True).len().get_column("len").to_numpy()
    mask = splits.fold_in_mask(sizes, settings.seed, settings.target_frac, min_items=5)
    rows = part.get_column("uidx").to_numpy() - lo
    cols = part.get_column("iidx").to_numpy()
    shape = (hi - lo, n_items)
    return _csr(rows[~mask], cols[~mask], shape), _csr(rows[mask], cols[mask], shape)


def _first_pairs(df: pl.DataFrame) -> pl.DataFrame:
    """The rows whose (user, item) pair did not occur before (file order kept).

    Same result as `unique(keep="first", maintain_order=True)`; for integer ids it works on one
    int64 key per row (a linear pass when the file is sorted, as MovieLens' is, else a stable
    argsort), several times faster and leaner than hashing pairs.
    """
    n = df.height
    u, i = df.get_column(USER), df.get_column(ITEM)
    if n and u.dtype.is_integer() and i.dtype.is_integer():
        umin, umax, imin, imax = int(u.min()), int(u.max()), int(i.min()), int(i.max())
        span = imax - imin + 1
        if (umax - umin + 1) * span < 2**62:
            key = (u.to_numpy().astype(np.int64) - umin) * span
            key += i.to_numpy().astype(np.int64) - imin
            keep = np.empty(n, dtype=bool)
            keep[0] = True
            if bool(np.all(key[1:] >= key[:-1])):  # sorted: duplicates are neighbours
                np.not_equal(key[1:], key[:-1], out=keep[1:])
            else:
                order = np.argsort(key, kind="stable")  # equal keys keep their file order
                key = key[order]
                first = keep.copy()
                np.not_equal(key[1:], key[:-1], out=first[1:])
                keep[:] = False
                keep[order[first]] = True
            del key
            return df if keep.all() else df.filter(pl.Series(keep))
    return df.filter(pl.struct(USER, ITEM).is_first_distinct())


def prepare_frame(
    df: pl.DataFrame,
    out: str | os.PathLike,
    settings: PrepareSettings | None = None,
    source: dict | None = None,
    item_names: pl.DataFrame | None = None,
) -> PreparedDataset:
    """Binarize, filter, split and write `df` (columns user_id, item_id[, rating]) to `out`;
    `item_names` (columns item_id, name) are kept for the items of the vocabulary."""
    settings = settings or PrepareSettings()
    settings.validate()
    source = source or {}
    counts: dict[str, int] = {"n_rows": df.height}
    if settings.min_rating is not None:
        if RATING not in df.columns:
            raise DataError(
                f"{spelled('min_rating')} needs a rating column: {spelled('rating_col')}"
            )
        df = df.filter(pl.col(RATING) >= settings.min_rating)
    counts["n_positive_rows"] = df.height
    df = _first_pairs(df.select(USER, ITEM))
    counts["n_unique_pairs"] = df.height
    if settings.min_item_users > 0:
        df = df.filter(pl.len().over(ITEM) >= settings.min_item_users)
    if settings.min_user_items > 1:
        df = df.filter(pl.len().over(USER) >= settings.min_user_items)
    counts["n_filtered_pairs"] = df.height
    if df.height == 0:
        raise DataError(
            f"no interactions remain after filtering: lower {spelled('min_rating')} or "
            f"{spelled('min_user_items')}"
        )

    users = df.get_column(USER).unique().sort().to_numpy()
    if settings.protocol == "liang":
        n_tr, n_val, n_te = splits.heldout_counts_liang(users.size, settings.heldout_users)
    else:
        n_tr, n_val, n_te = splits.heldout_counts_percent(
            users.size, settings.validation_frac, settings.test_frac
        )
    order = splits.shuffle_users(users, settings.seed)
    user_frame = pl.DataFrame({USER: order, "uidx": np.arange(order.size, dtype=np.int64)})

    df = df.with_row_index("row").join(user_frame, on=USER, how="inner").sort("row")
    train = df.filter(pl.col("uidx") < n_tr)
    item_ids = train.get_column(ITEM).unique(maintain_order=True)
    n_items = item_ids.len()
    item_frame = pl.DataFrame({ITEM: item_ids, "iidx": np.arange(n_items, dtype=np.int64)})
    df = df.join(item_frame, on=ITEM, how="left").sort("row")

    train = df.filter(pl.col("uidx") < n_tr)
    mats = {
        "train": _csr(
            train.get_column("uidx").to_numpy(),
            train.get_column("iidx").to_numpy(),
            (n_tr, n_items),
        )
    }
    mats["validation_tr"], mats["validation_te"] = _heldout(
        df, n_tr, n_tr + n_val, n_items, settings
    )
    mats["test_tr"], mats["test_te"] = _heldout(
        df, n_tr + n_val, n_tr + n_val + n_te, n_items, settings
    )
    counts.update(
        n_users=int(users.size),
        n_items=int(n_items),
        n_train_users=n_tr,
        n_validation_users=n_val,
        n_test_users=n_te,
        n_heldout_pairs_unknown_item=int(df.get_column("iidx").null_count()),
        **{f"nnz_{k}": int(m.nnz) for k, m in mats.items()},
    )
    named = None
    if item_names is not None:
        where = (source.get("item_names") or {}).get("path", "the item names")
        named, n_cut = _vocab_names(item_names, item_ids, where)
        counts["n_named_items"] = named.height
        counts["n_names_cut"] = n_cut  # longer than MAX_NAME_CHARS: cut to it
    fp = fingerprint(settings, source)
    manifest = {
        "format_version": FORMAT_VERSION,
        "vaecf_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "settings": asdict(settings),
        "fingerprint": fp,
        "counts": counts,
    }
    split_col = np.repeat(np.array(["train", "validation", "test"]), [n_tr, n_val, n_te])
    users_frame = pl.DataFrame({USER: order, "split": split_col})
    with writer_lock(out, "vaecf prepare"):
        sweep_temps(out)  # what killed earlier writes left beside it
        with atomic_dir(out) as tmp:
            for name, m in mats.items():
                save_csr(tmp / f"{name}.npz", m)
            Vocabulary(item_ids, ITEM).save(tmp / "items.parquet")
            with atomic_file(tmp / "users.parquet") as f:
                users_frame.write_parquet(f)
            if named is not None:
                with atomic_file(tmp / ITEM_NAMES) as f:
                    named.write_parquet(f)
            manifest["files"] = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
            manifest["manifest_sha256"] = _manifest_digest(manifest)
            write_json(tmp / "manifest.json", manifest)
    return PreparedDataset(out)


def _reuse(out: Path, fp: str, overwrite: bool) -> PreparedDataset | None:
    """The dataset at `out` if it was prepared with fingerprint `fp` and is intact; None when
    `out` is to be (re)written; DataError when `out` holds something else."""
    if not out.exists():
        return None
    if (out / "manifest.json").is_file():
        if overwrite:  # only ever replaces a prepared dataset, never another directory
            return None
        ds = PreparedDataset(out)
        if ds.fingerprint == fp:
            try:
                ds.verify()
            except DataError:
                return None  # our own output, damaged: prepare it again
            return ds
        version = ds.manifest.get("format_version")
        why = (
            f"by an older vaecf (format {version}, now {FORMAT_VERSION})"
            if version != FORMAT_VERSION
            else "with other settings or source"
        )
        raise DataError(
            f"{out} holds a dataset prepared {why}; pass --overwrite to replace it "
            "or choose another --out"
        )
    if out.is_dir() and not any(out.iterdir()):
        return None
    raise DataError(f"{out} exists and is not a prepared dataset; choose another --out")


def prepare_csv(
    path: str | os.PathLike,
    out: str | os.PathLike,
    user_col: str | None = None,
    item_col: str | None = None,
    rating_col: str | None = None,
    sep: str | None = None,
    settings: PrepareSettings | None = None,
    overwrite: bool = False,
    item_names: str | os.PathLike | None = None,
    name_col: str | None = None,
    name_id_col: str | None = None,
    header: bool = True,
    columns: list[str] | str | None = None,
) -> PreparedDataset:
    """Prepare a CSV/TSV/Parquet file of interactions (cached by fingerprint at `out`).

    A text file's header row names its columns; for a file without one, `header=False` and
    `columns` names them in order (then `user_col`/`item_col`/`rating_col` default to the
    columns named user, item and rating). `sep`: one character, or 'whitespace' for runs of
    spaces and tabs (FilmTrust's `ratings.txt`, MovieLens-100K's `u.data`).

    `item_names`: a CSV/TSV/Parquet file naming items: `name_col` holds the name, `name_id_col`
    (default: `item_col`) the item id; read with `sep` when given, else by its own suffix.
    """
    settings = settings or PrepareSettings()
    settings.validate()
    columns = check_columns(header, columns, Path(path).suffix.lower() in {".parquet", ".pq"})
    user_col, item_col, rating_col = resolve_columns(user_col, item_col, rating_col, columns)
    if settings.min_rating is not None and rating_col is None:
        raise DataError(
            f"{spelled('min_rating')} needs {spelled('rating_col')} to say which column holds "
            "the ratings"
        )
    path, out = Path(path), Path(out)
    if not path.is_file():
        raise DataError(f"{path} does not exist or is not a file; pass --path to a CSV/TSV/Parquet")
    source = {
        "path": str(path.resolve()),
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "format": "parquet" if path.suffix.lower() in {".parquet", ".pq"} else "csv",
        "columns": {"user": user_col, "item": item_col, "rating": rating_col},
        "sep": sep,
    }
    if columns is not None:
        source["header_columns"] = columns  # a file without a header row, named by --columns
    if item_names is not None:
        if not name_col:
            raise DataError("--item-names needs --name-col to say which column holds the names")
        npath = Path(item_names)
        if not npath.is_file():
            raise DataError(f"--item-names {npath} does not exist or is not a file")
        source["item_names"] = {
            "path": str(npath.resolve()),
            "sha256": sha256_file(npath),
            "columns": {"id": name_id_col or item_col, "name": name_col},
            "sep": sep,
        }
    elif name_col or name_id_col:
        raise DataError("--name-col/--name-id-col need --item-names FILE")
    with writer_lock(out, "vaecf prepare"):
        reused = _reuse(out, fingerprint(settings, source), overwrite)
        if reused is not None:
            return reused
        names = None
        if item_names is not None:  # read first: a bad names file fails before the long part
            names = read_names_table(item_names, name_id_col or item_col, name_col, sep)
        df = read_table(path, user_col, item_col, rating_col, sep, header, columns)
        return prepare_frame(df, out, settings, source, names)


# -- named datasets ------------------------------------------------------------------------------
def dataset_settings(name: str, **overrides) -> PrepareSettings:
    """The registry's protocol for `name`, with any field overridden (None = keep the default).

    `protocol="liang"|"thesis"` switches the held-out rule; the other defaults stay. Overriding a
    setting that the resulting protocol does not use (e.g. heldout_users under "thesis") raises a
    DataError that says which settings apply.
    """
    from vaecf.data.registry import get

    spec = get(name)
    fields = {**spec.defaults}
    given = {}
    for key, value in overrides.items():
        if key not in PrepareSettings.__dataclass_fields__:
            raise DataError(f"unknown preprocessing setting {key!r}")
        if value is not None:
            given[key] = value
    fields.update(given)
    protocol = fields.get("protocol", "liang")
    for other, keys in PROTOCOL_FIELDS.items():
        if other == protocol:
            continue
        for key in keys:
            if key in given:
                mine = ", ".join(flag(k) for k in PROTOCOL_FIELDS.get(protocol, {}))
                how = "its default" if "protocol" not in given else "--protocol"
                raise DataError(
                    f"{flag(key)} applies to the {other} protocol only, but {name} is split "
                    f"with the {protocol} protocol ({how}), where it would do nothing. Use "
                    f"{mine} instead, or pass --protocol {other} {flag(key)} "
                    f"{given[key]}"
                )
            fields.pop(key, None)  # a registry default of the protocol not chosen
    settings = PrepareSettings(**fields)
    settings.validate()
    return settings


_DIGESTS = "digests.json"  # sha256 cache of raw files: {abs path: [size, mtime_ns, sha256]}


def _cached_sha256(files: list[Path], cache_dir: Path) -> dict[str, str] | None:
    try:
        cache = json.loads((cache_dir / _DIGESTS).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    out = {}
    for f in files:
        st = f.stat()
        hit = cache.get(str(f.resolve()))
        if not hit or hit[:2] != [st.st_size, st.st_mtime_ns]:
            return None
        out[str(f)] = hit[2]
    return out


def _store_sha256(sums: dict[str, str], cache_dir: Path) -> None:
    try:
        cache = json.loads((cache_dir / _DIGESTS).read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    for name, digest in sums.items():
        st = Path(name).stat()
        cache[str(Path(name).resolve())] = [st.st_size, st.st_mtime_ns, digest]
    write_json(cache_dir / _DIGESTS, cache)


def _hash_files(files: list[Path]) -> dict[str, str]:
    return {str(f): sha256_file(f) for f in files}


def _source_record(
    name: str, parser: str, files: list[Path], sums: dict[str, str], origin: dict
) -> dict:
    if len(files) == 1:
        combined = sums[str(files[0])]
    else:
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}:{sums[str(f)]}\n".encode())
        combined = h.hexdigest()
    if len(files) > 20:  # Netflix: 17,770 movie files; keep the manifest readable
        files_rec: dict = {"n_files": len(files), "bytes": sum(f.stat().st_size for f in files)}
    else:
        files_rec = {str(f): {"bytes": f.stat().st_size, "sha256": sums[str(f)]} for f in files}
    return {"dataset": name, "parser": parser, "sha256": combined, "files": files_rec, **origin}


def prepare_dataset(
    name: str,
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    settings: PrepareSettings | None = None,
    root: str | os.PathLike | None = None,
    url: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> PreparedDataset:
    """Download (or take from `source`), verify, parse and prepare a registry dataset.

    `out` defaults to <root>/prepared/<name>-<fingerprint>/; an existing directory with the same
    fingerprint is reused.
    """
    from vaecf.data.download import locate
    from vaecf.data.registry import get, prepared_root, raw_dir

    spec = get(name)
    settings = settings or dataset_settings(name)
    settings.validate()
    files, origin = locate(spec, source, root=root, url=url, progress=progress)
    cache_dir = raw_dir(name, root)
    sums = _cached_sha256(files, cache_dir)
    df = parse_counts = None
    if sums is None:  # hash (I/O and hashlib, GIL released) while Polars parses
        from concurrent.futures import ThreadPoolExecutor

        _say(progress, f"{name}: hashing and parsing {len(files)} file(s)")
        with ThreadPoolExecutor(1) as pool:
            hashing = pool.submit(_hash_files, files)
            try:
                df, parse_counts = _parse(spec, files, False)
            finally:
                sums = hashing.result()
        _store_sha256(sums, cache_dir)
    record = _source_record(name, spec.parser, files, sums, origin)
    names_file = _names_file(spec, files)
    if names_file is not None:  # recorded; not part of the fingerprint (see the module's doc)
        record["item_names"] = {"path": str(names_file), "sha256": sha256_file(names_file)}
    fp = fingerprint(settings, record)
    out = Path(out) if out is not None else prepared_root(root) / f"{name}-{fp}"
    with writer_lock(out, f"vaecf prepare {name}"):
        reused = _reuse(out, fp, overwrite)  # known files: settled before parsing anything
        if reused is not None:
            _say(progress, f"{name}: reusing {out}")
            return reused
        if df is None:
            df, parse_counts = _parse(spec, files, progress)
        names = None
        if spec.names == "inline":  # the raw rows name their items: each one's first spelling
            names = df.select(ITEM, NAME)
            df = df.drop(NAME)
        elif names_file is not None:
            from vaecf.data.sources import NAMES_READERS

            names = NAMES_READERS[spec.names](names_file)
        record["parse"] = parse_counts
        _say(progress, f"{name}: {df.height:,} rows; filtering and splitting")
        if settings.min_rating is not None and RATING not in df.columns:
            raise DataError(f"{name} has no ratings; leave {spelled('min_rating')} unset")
        return prepare_frame(df, out, settings, record, names)


def _names_file(spec, files: list[Path]) -> Path | None:
    """The dataset's names file beside its (first) raw file, when the registry names one and it
    is there."""
    if not spec.names or spec.names == "inline" or not files:
        return None
    f = files[0].parent / spec.names
    return f if f.is_file() else None


def _parse(spec, files: list[Path], progress: bool):
    from vaecf.data.sources import PARSERS

    _say(progress, f"{spec.name}: parsing {len(files)} file(s)")
    if spec.names == "inline":
        return PARSERS[spec.parser](files, names=True)
    return PARSERS[spec.parser](files)


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        import sys

        print(msg, file=sys.stderr, flush=True)
