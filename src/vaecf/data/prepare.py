"""Prepare: an interaction frame -> a prepared dataset directory (read by vaecf.data.prepared),
written atomically; a user's file (`prepare_csv`) or a registry dataset (`prepare_dataset`),
cached at its directory by fingerprint. Preprocessing itself: vaecf.data.preprocess.

Item names from a user's file (`prepare_csv(item_names=...)`) are part of the fingerprint, a
registry dataset's (read beside its raw files) are not: they come with the same download, and a
dataset prepared again to gain them keeps matching the runs trained on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from vaecf.config.settings import spelled
from vaecf.data import files
from vaecf.data.columns import find_time_column, resolve_columns
from vaecf.data.prepared import (
    FORMAT_VERSION,
    ITEM_NAMES,
    SPLIT_FILES,
    PreparedDataset,
    load_prepared,
    manifest_digest,
    sha256_file,
)
from vaecf.data.preprocess import (
    PROTOCOL_FIELDS,
    PrepareSettings,
    dataset_settings,
    preprocess,
    vocab_names,
)
from vaecf.data.separators import found_sep
from vaecf.data.sources import ITEM, NAME, RATING, USER, check_columns, read_table
from vaecf.data.vocab import Vocabulary
from vaecf.errors import DataError
from vaecf.storage.safewrite import atomic_dir, atomic_file, save_csr, sweep_temps, write_json
from vaecf.storage.writelock import writer_lock
from vaecf.version import __version__

__all__ = [
    "FORMAT_VERSION",
    "ITEM_NAMES",
    "PROTOCOL_FIELDS",
    "SPLIT_FILES",
    "PrepareSettings",
    "PreparedDataset",
    "dataset_settings",
    "fingerprint",
    "load_prepared",
    "prepare_csv",
    "prepare_dataset",
    "prepare_frame",
    "sha256_file",
]


# settings added after datasets were prepared: left out of the fingerprint while unset, so that
# those datasets (and the runs trained on them) keep theirs
_LATER = ("validation_share", "test_share", "last_n")


def fingerprint(settings: PrepareSettings, source: dict) -> str:
    keys = ("sha256", "columns", "sep")
    src = {k: source.get(k) for k in keys}
    if source.get("header_columns"):  # absent from older fingerprints: they stay valid
        src["header_columns"] = source["header_columns"]
    if source.get("parser"):  # a registry dataset: its parser is part of what was read
        src["parser"] = source["parser"]
    elif source.get("item_names"):  # a user's names file (a registry dataset's is not hashed in)
        src["item_names"] = {k: source["item_names"].get(k) for k in ("sha256", "columns", "sep")}
    chosen = {k: v for k, v in asdict(settings).items() if v is not None or k not in _LATER}
    blob = json.dumps(
        {"settings": chosen, "source": src, "format_version": FORMAT_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


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
    pre = preprocess(df, settings)
    mats, counts, order, item_ids = pre.mats, pre.counts, pre.users, pre.item_ids
    n_tr, n_val, n_te = pre.sizes
    named = None
    if item_names is not None:
        where = (source.get("item_names") or {}).get("path", "the item names")
        named, n_cut = vocab_names(item_names, item_ids, where)
        counts["n_named_items"] = named.height
        counts["n_names_cut"] = n_cut  # longer than MAX_NAME_CHARS: cut to it
    fp = fingerprint(settings, source)
    manifest = {
        "format_version": FORMAT_VERSION,
        "vaecf_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
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
            manifest["manifest_sha256"] = manifest_digest(manifest)
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
    time_col: str | None = None,
) -> PreparedDataset:
    """Prepare a text, JSON or Parquet file of interactions (`files.kind`; cached by
    fingerprint at `out`).

    A text file's header row names its columns; for a file without one, `header=False` and
    `columns` names them in order. `user_col`/`item_col` not given are found by name
    (`columns.resolve_columns`: userId, customer_id, asin, ...), and so is `rating_col` where
    `settings.min_rating` is set (rating, score, stars, ...). `sep`: one character, '::', or
    'whitespace' for runs of spaces and tabs (FilmTrust's `ratings.txt`); found in the file
    where not given (`separators.found_sep`).

    `time_col`: when each interaction happened, for the time protocols (`settings.protocol`
    temporal or last); found by name where not given (timestamp, time, date, ...).

    `item_names`: a CSV/TSV/JSON/Parquet file naming items: `name_col` holds the name, `name_id_col`
    (default: `item_col`) the item id; read with `sep` when given, else by its own suffix.
    """
    settings = settings or PrepareSettings()
    settings.validate()
    columns = check_columns(header, columns, files.kind(Path(path)) != files.TEXT)
    path, out = Path(path), Path(out)
    files.check_file(path)
    found = found_sep(path) if sep is None else None  # looked for once, read with below
    user_col, item_col, rating_col = resolve_columns(
        path, sep or found, user_col, item_col, rating_col, columns, settings.min_rating is not None
    )
    time_col = find_time_column(path, sep or found, time_col, columns, settings.protocol)
    source = _file_source(path, (user_col, item_col, rating_col, time_col), sep, found, columns)
    if item_names is not None or name_col or name_id_col:
        source["item_names"] = _names_source(item_names, name_col, name_id_col or item_col, sep)
    with writer_lock(out, "vaecf prepare"):
        reused = _reuse(out, fingerprint(settings, source), overwrite)
        if reused is not None:
            return reused
        names = None
        if item_names is not None:  # read first: a bad names file fails before the long part
            from vaecf.data.parsers import read_names_table

            names = read_names_table(item_names, name_id_col or item_col, name_col, sep)
        df = read_table(
            path, user_col, item_col, rating_col, sep or found, header, columns, time_col
        )
        return prepare_frame(df, out, settings, source, names)


def _file_source(path: Path, cols: tuple, sep: str | None, found: str | None, columns) -> dict:
    """What the prepared data was made from, for its fingerprint: the file (digest, format),
    the columns read (a time column under a time protocol), the separator given or found,
    the names a header-less file was given."""
    user_col, item_col, rating_col, time_col = cols
    source = {
        "path": str(path.resolve()),
        **_digest(path),
        "format": "csv" if files.kind(path) == files.TEXT else files.kind(path),
        "columns": {"user": user_col, "item": item_col, "rating": rating_col},
        "sep": sep,
    }
    if found:
        source["sep_found"] = found  # the separator found in the file (a new key: old caches hold)
    if columns is not None:
        source["header_columns"] = columns  # a file without a header row, named by --columns
    if time_col is not None:  # only here: other fingerprints stay as they were
        source["columns"]["time"] = time_col
    return source


def _digest(path: Path) -> dict:
    """{"sha256", "bytes"} of an interactions file, or of a directory's Parquet parts (each
    part's name and SHA-256, in order)."""
    if path.is_file():
        return {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    h, size = hashlib.sha256(), 0
    for f in files.parts(path):
        h.update(f"{f.relative_to(path).as_posix()}\0{sha256_file(f)}\n".encode())
        size += f.stat().st_size
    return {"sha256": h.hexdigest(), "bytes": size}


def _names_source(path, name_col: str | None, id_col: str, sep: str | None) -> dict:
    """What identifies an item names file in a dataset's fingerprint (checked first)."""
    if path is None:
        raise DataError("--name-col/--name-id-col need --item-names FILE")
    path = Path(path)
    if not name_col:
        raise DataError("--item-names needs --name-col to say which column holds the names")
    if not path.is_file():
        raise DataError(f"--item-names {path} does not exist or is not a file")
    return {
        "path": str(path.resolve()),
        "sha256": sha256_file(path),
        "columns": {"id": id_col, "name": name_col},
        "sep": sep,
    }


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
    from vaecf.data.datasets import get, prepared_root, raw_dir
    from vaecf.data.download import cached_sha256, locate, store_sha256

    spec = get(name)
    settings = settings or dataset_settings(name)
    settings.validate()
    files, origin = locate(spec, source, root=root, url=url, progress=progress)
    cache_dir = raw_dir(name, root)
    sums = cached_sha256(files, cache_dir)
    df = parse_counts = None
    if sums is None:
        df, parse_counts, sums = _hash_while_parsing(spec, files, progress)
        store_sha256(sums, cache_dir)
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
        df, names = _split_names(spec, df, names_file)
        record["parse"] = parse_counts
        _say(progress, f"{name}: {df.height:,} rows; filtering and splitting")
        if settings.min_rating is not None and RATING not in df.columns:
            raise DataError(f"{name} has no ratings; leave {spelled('min_rating')} unset")
        return prepare_frame(df, out, settings, record, names)


def _hash_while_parsing(spec, files: list[Path], progress: bool):
    """Parse the raw files while another thread hashes them (I/O and hashlib release the GIL):
    the frame, the parse counts and the files' SHA-256 sums."""
    from concurrent.futures import ThreadPoolExecutor

    from vaecf.data.download import hash_files

    _say(progress, f"{spec.name}: hashing and parsing {len(files)} file(s)")
    with ThreadPoolExecutor(1) as pool:
        hashing = pool.submit(hash_files, files)
        try:
            df, parse_counts = _parse(spec, files, False)
        finally:
            sums = hashing.result()
    return df, parse_counts, sums


def _split_names(spec, df, names_file: Path | None):
    """The interactions and the item names: from the raw rows where they name their items (each
    item's first spelling), else from the names file, else none."""
    if spec.names == "inline":
        return df.drop(NAME), df.select(ITEM, NAME)
    if names_file is not None:
        from vaecf.data.parsers import NAMES_READERS

        return df, NAMES_READERS[spec.names](names_file)
    return df, None


def _names_file(spec, files: list[Path]) -> Path | None:
    """The dataset's names file beside its (first) raw file, when the registry names one and it
    is there."""
    if not spec.names or spec.names == "inline" or not files:
        return None
    f = files[0].parent / spec.names
    return f if f.is_file() else None


def _parse(spec, files: list[Path], progress: bool):
    from vaecf.data.parsers import PARSERS

    _say(progress, f"{spec.name}: parsing {len(files)} file(s)")
    if spec.names == "inline":
        return PARSERS[spec.parser](files, names=True)
    return PARSERS[spec.parser](files)


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        import sys

        print(msg, file=sys.stderr, flush=True)
