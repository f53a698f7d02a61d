"""Prepare: an interaction frame -> a prepared dataset directory, written atomically.

Directory: train.npz, validation_tr.npz, validation_te.npz, test_tr.npz, test_te.npz (scipy CSR,
user x item, float32 ones), items.parquet (raw item id per column), users.parquet (raw user id
per row: training users, then validation, then test), manifest.json (source checksum, settings,
counts, fingerprint, library version).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp

from vaecf._io import atomic_dir, load_csr, save_csr, write_json
from vaecf.data import splits
from vaecf.data.sources import ITEM, RATING, USER, read_table
from vaecf.data.vocab import Vocabulary
from vaecf.errors import DataError

FORMAT_VERSION = 1
SPLIT_FILES = ("train", "validation_tr", "validation_te", "test_tr", "test_te")


@dataclass
class PrepareSettings:
    """Every preprocessing choice; all of it is hashed into the fingerprint."""

    min_rating: float | None = None  # keep rows with rating >= this; None: every row is a positive
    min_item_users: int = 0  # drop items with fewer users (applied first; MSD uses 200)
    min_user_items: int = 5  # then drop users with fewer items (the paper's min_uc)
    protocol: str = "liang"  # "liang": N + N held-out users; "thesis": percentages of users
    heldout_users: int = 10_000  # liang: validation users = test users = this many
    validation_frac: float = 0.07  # thesis: fraction of users for validation
    test_frac: float = 0.07  # thesis: fraction of users for test
    target_frac: float = 0.2  # fraction of each held-out user's items to predict
    seed: int = 98765  # user shuffle and fold-in split (the paper's seed)

    def validate(self) -> None:
        if self.protocol not in ("liang", "thesis"):
            raise DataError(f"protocol must be 'liang' or 'thesis', not {self.protocol!r}")
        if self.min_user_items < 1 or self.min_item_users < 0:
            raise DataError("--min-user-items must be >= 1 and --min-item-users >= 0")
        if not 0 < self.target_frac < 1:
            raise DataError("target fraction must lie strictly between 0 and 1")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(settings: PrepareSettings, source: dict) -> str:
    keys = ("sha256", "columns", "sep")
    src = {k: source.get(k) for k in keys}
    if source.get("parser"):  # a registry dataset: its parser is part of what was read
        src["parser"] = source["parser"]
    blob = json.dumps({"settings": asdict(settings), "source": src}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class PreparedDataset:
    """A prepared directory: lazy access to its splits, vocabularies and manifest."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise DataError(
                f"{self.path} is not a prepared dataset (no manifest.json); "
                "create one with `vaecf prepare ... --out DIR`"
            )
        try:
            self.manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{mpath} is corrupted ({e}); prepare the dataset again") from None

    def split(self, name: str) -> sp.csr_matrix:
        if name not in SPLIT_FILES:
            raise ValueError(f"split must be one of {SPLIT_FILES}, not {name!r}")
        return load_csr(self.path / f"{name}.npz")

    @cached_property
    def items(self) -> Vocabulary:
        return Vocabulary.load(self.path / "items.parquet", ITEM)

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
) -> PreparedDataset:
    """Binarize, filter, split and write `df` (columns user_id, item_id[, rating]) to `out`."""
    settings = settings or PrepareSettings()
    settings.validate()
    source = source or {}
    counts: dict[str, int] = {"n_rows": df.height}
    if settings.min_rating is not None:
        if RATING not in df.columns:
            raise DataError("--min-rating needs --rating-col")
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
            "no interactions remain after filtering; lower --min-rating / --min-user-items"
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
    fp = fingerprint(settings, source)
    manifest = {
        "format_version": FORMAT_VERSION,
        "vaecf_version": _version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "settings": asdict(settings),
        "fingerprint": fp,
        "counts": counts,
    }
    with atomic_dir(out) as tmp:
        for name, m in mats.items():
            save_csr(tmp / f"{name}.npz", m)
        Vocabulary(item_ids, ITEM).save(tmp / "items.parquet")
        split_col = np.repeat(np.array(["train", "validation", "test"]), [n_tr, n_val, n_te])
        pl.DataFrame({USER: order, "split": split_col}).write_parquet(tmp / "users.parquet")
        write_json(tmp / "manifest.json", manifest)
    return PreparedDataset(out)


def _version() -> str:
    from vaecf import __version__

    return __version__


def _reuse(out: Path, fp: str, overwrite: bool) -> PreparedDataset | None:
    if not out.exists():
        return None
    if (out / "manifest.json").is_file():
        if overwrite:  # only ever replaces a prepared dataset, never another directory
            return None
        ds = PreparedDataset(out)
        if ds.fingerprint == fp:
            return ds
        raise DataError(
            f"{out} holds a dataset prepared with other settings or source; "
            "pass --overwrite to replace it or choose another --out"
        )
    if out.is_dir() and not any(out.iterdir()):
        return None
    raise DataError(f"{out} exists and is not a prepared dataset; choose another --out")


def prepare_csv(
    path: str | os.PathLike,
    out: str | os.PathLike,
    user_col: str,
    item_col: str,
    rating_col: str | None = None,
    sep: str | None = None,
    settings: PrepareSettings | None = None,
    overwrite: bool = False,
) -> PreparedDataset:
    """Prepare a CSV/TSV/Parquet file of interactions (cached by fingerprint at `out`)."""
    settings = settings or PrepareSettings()
    settings.validate()
    if settings.min_rating is not None and rating_col is None:
        raise DataError("--min-rating needs --rating-col to say which column holds ratings")
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
    reused = _reuse(out, fingerprint(settings, source), overwrite)
    if reused is not None:
        return reused
    df = read_table(path, user_col, item_col, rating_col, sep)
    return prepare_frame(df, out, settings, source)


# -- named datasets ------------------------------------------------------------------------------
def dataset_settings(name: str, **overrides) -> PrepareSettings:
    """The registry's protocol for `name`, with any field overridden (None = keep the default).

    `protocol="liang"|"thesis"` switches the held-out rule; the other defaults stay.
    """
    from vaecf.data.registry import get

    spec = get(name)
    fields = {**spec.defaults}
    for key, value in overrides.items():
        if key not in PrepareSettings.__dataclass_fields__:
            raise DataError(f"unknown preprocessing setting {key!r}")
        if value is not None:
            fields[key] = value
    return PrepareSettings(**fields)


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
    out_given = out
    if sums is not None:  # known files: settle reuse before parsing anything
        record = _source_record(name, spec.parser, files, sums, origin)
        fp = fingerprint(settings, record)
        out = Path(out_given) if out_given is not None else prepared_root(root) / f"{name}-{fp}"
        reused = _reuse(out, fp, overwrite)
        if reused is not None:
            _say(progress, f"{name}: reusing {out}")
            return reused
        df, parse_counts = _parse(spec, files, progress)
    else:  # hash (I/O and hashlib, GIL released) while Polars parses
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
        fp = fingerprint(settings, record)
        out = Path(out_given) if out_given is not None else prepared_root(root) / f"{name}-{fp}"
        reused = _reuse(out, fp, overwrite)
        if reused is not None:
            _say(progress, f"{name}: reusing {out}")
            return reused
    record["parse"] = parse_counts
    _say(progress, f"{name}: {df.height:,} rows; filtering and splitting")
    if settings.min_rating is not None and RATING not in df.columns:
        raise DataError(f"{name} has no ratings; leave --min-rating unset")
    return prepare_frame(df, out, settings, record)


def _parse(spec, files: list[Path], progress: bool):
    from vaecf.data.sources import PARSERS

    _say(progress, f"{spec.name}: parsing {len(files)} file(s)")
    return PARSERS[spec.parser](files)


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        import sys

        print(msg, file=sys.stderr, flush=True)
