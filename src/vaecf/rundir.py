"""The run directory: its file names, its config schema, and loading and saving a model.

    config.json     {"format_version", "model": {"name", "config"}, "train": {...}, "data":
                    {path, fingerprint, n_items, n_train_users}, "vaecf_version"}: every
                    setting, resolved (a
                    search's choice too: EDLAE's lambda, p and beta as the fit chose them),
                    and of the training settings only those the model reads
    config.toml     the same settings as a file for `vaecf train --config` (vaecf.config.toml):
                    the run repeated from its own directory
    items.parquet   the item vocabulary (raw id of every model column)
    item_names.parquet  item_id, name: the items' names, where the dataset has them (optional)
    popularity.npy  each item's training-interaction count (int64, vocabulary order): the
                    ranking a history with no known item falls back to (cold start)
    best.pt         weights of the selected model (the best validation epoch; closed-form: the fit)
    last.pt         everything needed to resume training bit for bit (gradient models)
    metrics.jsonl   one JSON line per epoch (closed-form: one line with the fit's record)
    results.json    best epoch, its validation metrics, the test metrics
    gram_rows.pt    a dense EASE fit's X^T X rows as item sets, for `vaecf update` (optional)

The trainer, the recommender, the CLI and the server all go through this module; it imports no
training code.

The run format is versioned (`RUN_FORMAT`, config.json's "format_version"; runs written before
it existed are format 1): every older format loads and answers as it did
(tests/test_run_formats.py keeps real runs of every model family from earlier commits with
their answers); a newer one is refused with the version that wrote it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from vaecf.config import specs
from vaecf.config import toml as configfile
from vaecf.errors import RunError
from vaecf.storage import checkpoint
from vaecf.storage.safewrite import atomic_file, write_json
from vaecf.version import __version__

CONFIG = "config.json"
CONFIG_TOML = "config.toml"
ITEMS = "items.parquet"
ITEM_NAMES = "item_names.parquet"
POPULARITY = "popularity.npy"
BEST = "best.pt"
# a dense EASE fit's X^T X rows (the item sets it solved on), from which `vaecf update` finds
# the rows a newer dataset changed; optional (runs without it read the run's prepared data)
GRAM_ROWS = "gram_rows.pt"
LAST = "last.pt"
METRICS = "metrics.jsonl"
RESULTS = "results.json"
# what loading a run for serving reads (Recommender.load)
RUN_FILES = (CONFIG, ITEMS, ITEM_NAMES, POPULARITY, BEST, RESULTS)
# the run format this code writes and the newest it reads: 1 = runs from before the field
# (to 2026-11-28), 2 = "format_version" in config.json, 3 = a dense EASE B's best.pt holds
# diag P ("p_diag", for `vaecf update`)
RUN_FORMAT = 3


def is_run(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG).is_file()


def load_config(run_dir: str | os.PathLike) -> dict:
    """config.json of a run, in the current schema (older runs' are converted)."""
    run_dir = Path(run_dir)
    if not is_run(run_dir):
        raise RunError(
            f"{run_dir} is not a vaecf run directory (no {CONFIG}); "
            "pass the --out directory of `vaecf train`"
        )
    try:
        cfg = json.loads((run_dir / CONFIG).read_text())
        model = cfg["model"]
        if "name" not in model:  # vaecf 0.1: the Mult-VAE config itself, with its kind
            model = {"name": model.get("model", "multvae"), "config": model}
            model["config"].pop("model", None)
            cfg["model"] = model
        cfg["train"], cfg["data"]["n_items"]  # noqa: B018 (present)
        version = cfg.get("format_version", 1)
        newer = not isinstance(version, int) or version > RUN_FORMAT
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise RunError(
            f"{run_dir / CONFIG} is corrupted ({type(e).__name__}: {e}); restore it from a "
            "copy or train the run again"
        ) from None
    if newer:
        raise RunError(
            f"{run_dir} was written by vaecf {cfg.get('vaecf_version') or '(unknown)'} in run "
            f"format {version}; this vaecf reads run formats 1 to {RUN_FORMAT}: upgrade vaecf"
        )
    return cfg


def train_settings(model_name: str, train: dict) -> dict:
    """The training settings of `train` that model `model_name` reads: the gradient and
    annealing settings it does not declare (specs) left out (EASE has no epochs or anneal_cap)."""
    spec = specs.SPECS.get(model_name)
    if spec is None:  # a model declared outside vaecf and not registered here: all of them
        return dict(train)
    unread = set(specs.GRADIENT_SETTINGS + specs.ANNEAL_SETTINGS) - set(spec.train_settings)
    return {k: v for k, v in train.items() if k not in unread}


def write_config(
    run_dir: Path, model_name: str, model_config: dict, train: dict, data: dict, version: str
) -> dict:
    train = train_settings(model_name, train)
    cfg = {
        "format_version": RUN_FORMAT,
        "model": {"name": model_name, "config": model_config},
        "train": train,
        "data": data,
        "vaecf_version": version,
    }
    write_json(run_dir / CONFIG, cfg)
    configfile.write(
        run_dir / CONFIG_TOML,
        model_name,
        train,
        model_config,
        data=data.get("path"),
        header=(
            f"vaecf {version or ''} run settings, resolved (the same as {CONFIG}).\n"
            "Repeat the run: vaecf train --config THIS_FILE --out NEW_DIR"
        ),
    )
    return cfg


def start_run(run_dir: Path, model_name: str, model_config: dict, train: dict, ds) -> None:
    """A run's config.json (and .toml) for dataset `ds` (a PreparedDataset), and the dataset's
    vocabulary and item names copied in."""
    c = ds.manifest["counts"]
    data = {
        "path": str(ds.path.resolve()),
        "fingerprint": ds.fingerprint,
        "n_items": ds.n_items,
        "n_train_users": c["n_train_users"],
        "min_rating": ds.manifest["settings"].get("min_rating"),  # what a history keeps
    }
    write_config(run_dir, model_name, model_config, train, data, __version__)  # what wrote the run
    copy_file(ds.path / "items.parquet", run_dir / ITEMS)
    copy_item_names(run_dir, ds.item_names_file())
    save_popularity(run_dir, ds.split("train").getnnz(axis=0))  # training users per item


def prepared_min_rating(cfg: dict) -> float | None:
    """The rating threshold the run's data was prepared with (None: every row a positive),
    from its config (`load_config`); a run from before the config recorded it reads its
    dataset's manifest where that is still there."""
    data = cfg.get("data") or {}
    if "min_rating" in data:
        return data["min_rating"]
    try:
        manifest = json.loads((Path(data["path"]) / "manifest.json").read_text())
        return manifest["settings"].get("min_rating")
    except (KeyError, TypeError, OSError, ValueError):
        return None


def save_popularity(run_dir: Path, counts: np.ndarray) -> None:
    with atomic_file(Path(run_dir) / POPULARITY) as f:
        np.save(f, np.asarray(counts, dtype=np.int64), allow_pickle=False)


def load_popularity(run_dir: str | os.PathLike, n_items: int) -> np.ndarray | None:
    """The run's training counts per item, or None for a run written before they were kept."""
    path = Path(run_dir) / POPULARITY
    if not path.is_file():
        return None
    try:
        counts = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise RunError(f"{path} is corrupted ({e}); restore the run directory") from None
    if counts.shape != (n_items,) or counts.dtype != np.int64 or (counts < 0).any():
        raise RunError(
            f"{path} does not hold {n_items} non-negative counts; restore the run directory"
        )
    return counts


def copy_file(src: Path, dst: Path) -> None:
    """`src` copied over `dst` through a temp file beside it: a full disk raises a WriteError
    naming `dst` (shutil.copyfile's error names the source), and `dst` stays as it was."""
    with open(src, "rb") as fsrc, atomic_file(dst) as fdst:
        shutil.copyfileobj(fsrc, fdst)


def copy_item_names(run_dir: Path, item_names_parquet: Path | None) -> None:
    """The dataset's item names into the run (None: the dataset has none; a stale copy goes)."""
    if item_names_parquet is None:
        (run_dir / ITEM_NAMES).unlink(missing_ok=True)
        return
    copy_file(item_names_parquet, run_dir / ITEM_NAMES)


def load_item_names(run_dir: str | os.PathLike) -> dict | None:
    """{raw item id: name} of the run's items, or None when the run has no names."""
    from vaecf.data.vocab import load_item_names as load
    from vaecf.errors import DataError

    path = Path(run_dir) / ITEM_NAMES
    if not path.is_file():
        return None
    try:
        return load(path)
    except DataError as e:
        raise RunError(f"{e}; restore the run directory or train it again") from None


def save_model(run_dir: Path, model: torch.nn.Module, **extra) -> None:
    """best.pt: the model's weights (state dict) and `extra` (epoch, metrics), atomically; and
    config.json's model settings as the model holds them, where its fit resolved some (EDLAE's
    search writes the lambda, p and beta it chose into its config)."""
    checkpoint.save(run_dir / BEST, {"model": model.state_dict(), **extra})
    record_settings(run_dir, model)


def save_rows(run_dir: Path, rows) -> None:
    """gram_rows.pt: the item sets of `rows` (a CSR matrix), under a checkpoint's SHA-256;
    nothing for weighted rows, which an update does not compare. Item indices as int32: a
    dense B never holds 2^31 items."""
    if not np.all(rows.data == 1):
        return
    checkpoint.save(Path(run_dir) / GRAM_ROWS, {
        "indptr": torch.from_numpy(rows.indptr.astype(np.int64)),
        "indices": torch.from_numpy(rows.indices.astype(np.int32)),
        "shape": list(rows.shape),
    })  # fmt: skip


def load_rows(run_dir: str | os.PathLike):
    """The rows gram_rows.pt holds, as a binary float32 CSR matrix; None where the run has none
    (another model, or written before the file)."""
    import scipy.sparse as sp

    path = Path(run_dir) / GRAM_ROWS
    if not path.is_file():
        return None
    ck = checkpoint.load(path)
    indices, indptr = ck["indices"].numpy(), ck["indptr"].numpy()
    ones = np.ones(len(indices), dtype=np.float32)
    return sp.csr_matrix((ones, indices, indptr), shape=tuple(ck["shape"]))


def record_settings(run_dir: Path, model: torch.nn.Module) -> None:
    """Rewrite the run's config.json (and config.toml) with `model.config` where it differs
    from the saved settings; nothing where the run has no config yet."""
    from vaecf import models

    if not is_run(run_dir) or getattr(model, "config", None) is None:
        return
    cfg = load_config(run_dir)
    settings = models.config_to_dict(model.config)
    if cfg["model"]["config"] != settings:
        name, train, data = cfg["model"]["name"], cfg["train"], cfg["data"]
        write_config(Path(run_dir), name, settings, train, data, cfg.get("vaecf_version"))


def load_model(run_dir: str | os.PathLike, device: str | torch.device = "cpu", name: str = BEST):
    """(model in eval mode on `device`, run config) from a run directory."""
    from vaecf import models

    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    ck = checkpoint.load(run_dir / name, map_location=device)
    try:
        model = models.build(cfg["model"]["name"], cfg["data"]["n_items"], cfg["model"]["config"])
        model.load_state_dict(ck["model"])
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        raise RunError(
            f"{run_dir / name} does not match the run's {CONFIG} ({str(e).splitlines()[0]}); "
            "restore the run directory or train it again"
        ) from None
    return model.to(device).eval(), cfg


def load_results(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / RESULTS
    if not path.is_file():
        raise RunError(f"{path} is missing: the run has not finished; `vaecf train --resume`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{path} is corrupted ({e}); evaluate the run again") from None


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise RunError(
                    f"{path} line {n} is corrupted; delete the line or retrain"
                ) from None
    return rows


def card(cfg: dict, results: dict | None = None) -> dict:
    """What a run is, as `vaecf info RUN`, GET /v1/model and the page show it, from its config
    (`load_config`) and results: the model, its settings as fitted, the training settings it
    reads, the data and its metrics; epochs only for a model trained in epochs (None for a
    closed form, fitted once). Runs written before the settings were filtered show the same."""
    model = cfg.get("model") or {}
    name = model.get("name")
    spec = specs.SPECS.get(name)
    closed = bool(spec and spec.closed_form)
    res = results or {}
    return {
        "model": name,
        "title": spec.title if spec else name,
        "family": spec.family if spec else None,
        "closed_form": closed,
        "settings": model.get("config") or {},
        "train": train_settings(name, cfg.get("train") or {}),
        "data": cfg.get("data") or {},
        "vaecf_version": cfg.get("vaecf_version"),
        "best_epoch": None if closed else res.get("best_epoch"),
        "epochs": None if closed else res.get("epochs"),
        "validation": res.get("validation"),
        "test": res.get("test"),
    }
