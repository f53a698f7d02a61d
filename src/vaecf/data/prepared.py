"""A prepared dataset directory, read (`PreparedDataset`): its manifest checked when it is opened,
each file against the SHA-256 the manifest records for it when it is read (format 2 and later).
vaecf.data.prepare writes it.

Directory: train.npz, validation_tr.npz, validation_te.npz, test_tr.npz, test_te.npz (scipy CSR,
user x item, float32 ones), items.parquet (raw item id per column), users.parquet (raw user id
per row: training users, then validation, then test), manifest.json (source checksum, settings,
counts, fingerprint, library version), and item_names.parquet (item_id, name) where the data names
its items: only items of the vocabulary, ids typed like items.parquet's, names cut to
vocab.MAX_NAME_CHARS characters (counted in the manifest: n_names_cut). Its checksum is in the
manifest like every file's.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property
from pathlib import Path

import polars as pl
import scipy.sparse as sp

from vaecf.data import files
from vaecf.data.sources import ITEM
from vaecf.data.vocab import Vocabulary, load_item_names
from vaecf.errors import DataError
from vaecf.storage.safewrite import load_csr

FORMAT_VERSION = 2  # 2: per-file checksums in the manifest; part of the fingerprint
SPLIT_FILES = ("train", "validation_tr", "validation_te", "test_tr", "test_te")
ITEM_NAMES = "item_names.parquet"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_REPREPARE = "prepare the dataset again (the same `vaecf prepare` command with --overwrite)"
_COUNT_KEYS = ("n_users", "n_items", "n_train_users", "n_validation_users", "n_test_users")


def manifest_digest(manifest: dict) -> str:
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
    if digest is not None and digest != manifest_digest(m):
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
            how = "create one with `vaecf prepare ... --out DIR`"
            raw = self.path.is_file() or (self.path.is_dir() and files.parts(self.path))
            if raw:  # a raw table of interactions, passed where a dataset goes
                what = "a file" if self.path.is_file() else "a table of Parquet parts"
                how = (
                    f"it is {what}: prepare it first, `vaecf prepare csv --path {self.path} "
                    "--out DIR` (vaecf.prepare_csv), then pass DIR"
                )
            raise DataError(f"{self.path} is not a prepared dataset (no manifest.json); {how}")
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


def load_prepared(path: str | os.PathLike) -> PreparedDataset:
    return PreparedDataset(path)
