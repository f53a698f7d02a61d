"""Data verbs: prepare, download, info."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vaecf.cli.common import print_json
from vaecf.cli.options import add_columns_options, add_settings, from_args, given
from vaecf.config.settings import setting


@dataclass
class DataPlaces:
    """Where datasets are kept and fetched from (prepare NAME, download, info)."""

    root: str | None = setting(None, "data root (unset: $VAECF_HOME, else ~/.cache/vaecf)")
    url: str | None = setting(None, "download from this mirror URL instead of the official one")


# -- prepare ------------------------------------------------------------------------------------
def cmd_prepare(a) -> int:
    from vaecf.data.columns import found_by_name
    from vaecf.data.prepare import PrepareSettings, prepare_csv
    from vaecf.data.preprocess import file_protocol

    ds = prepare_csv(
        a.path,
        a.out,
        a.user_col,
        a.item_col,
        a.rating_col,
        a.sep,
        from_args(PrepareSettings, a, **file_protocol(a.heldout_users, a.protocol)),
        overwrite=a.overwrite,
        item_names=a.item_names,
        name_col=a.name_col,
        name_id_col=a.name_id_col,
        header=not a.no_header,
        columns=a.columns,
        time_col=a.time_col,
    )
    if a.json:
        print_json({"path": str(ds.path), **ds.manifest})
    else:
        given = {"user": a.user_col, "item": a.item_col, "rating": a.rating_col}
        src = ds.manifest["source"]
        kept = ds.manifest["settings"]["min_rating"]
        if found := found_by_name(given, src["columns"], src.get("sep_found"), kept):
            print(found)
        print(_prepared_summary(ds))
    return 0


def _prepared_summary(ds) -> str:
    c = ds.manifest["counts"]
    return (
        f"prepared {ds.path}: {c['n_train_users']} training users, {c['n_items']} items, "
        f"{c['nnz_train']} training interactions; {c['n_validation_users']} validation + "
        f"{c['n_test_users']} test users" + _names_cut(c)
    )


def _names_cut(counts: dict) -> str:
    """What prepare did to long item names, if anything."""
    from vaecf.data.vocab import MAX_NAME_CHARS

    n = counts.get("n_names_cut")
    return f"; {n} item names cut to {MAX_NAME_CHARS} characters" if n else ""


def cmd_prepare_dataset(a) -> int:
    from vaecf.data.prepare import PrepareSettings, dataset_settings, prepare_dataset

    settings = dataset_settings(a.source, **given(a, PrepareSettings.__dataclass_fields__))
    if a.all_rows:
        settings.min_rating = None
    ds = prepare_dataset(
        a.source,
        source=a.source_path,
        out=a.out,
        settings=settings,
        root=a.root,
        url=a.url,
        overwrite=a.overwrite,
        progress=not a.quiet,
    )
    if a.json:
        print_json({"path": str(ds.path), **ds.manifest})
    else:
        print(_prepared_summary(ds))
    return 0


# -- download -----------------------------------------------------------------------------------
def cmd_download(a) -> int:
    from vaecf.data import datasets
    from vaecf.data.download import download

    spec = datasets.get(a.name)
    records = download(spec, a.root, url=a.url, progress=not a.quiet)
    d = datasets.raw_dir(spec.name, a.root)
    if a.json:
        print_json({"dataset": spec.name, "dir": str(d), "files": records})
    else:
        for fname, rec in records.items():
            print(
                f"{d / fname}  {rec['bytes']} bytes  sha256 {rec['sha256']}  "
                f"(verified: {rec['verified']})"
            )
    return 0


# -- info ---------------------------------------------------------------------------------------
def _dataset_info(a) -> int:
    from dataclasses import asdict

    from vaecf.data import datasets
    from vaecf.data.prepare import PreparedDataset

    spec = datasets.get(a.path)
    d = datasets.raw_dir(spec.name, a.root)
    raw = sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []
    prepared = []
    for p in sorted(datasets.prepared_root(a.root).glob(f"{spec.name}-*")):
        if (p / "manifest.json").is_file():
            m = PreparedDataset(p).manifest
            prepared.append({"path": str(p), "counts": m["counts"], "settings": m["settings"]})
    info = {**asdict(spec), "raw_dir": str(d), "raw_files_present": raw, "prepared": prepared}
    if a.json:
        print_json(info)
        return 0
    print(
        f"{spec.name}: {spec.title}\n  {spec.size}\n  home: {spec.homepage}\n"
        f"  licence: {spec.licence}\n  format: {spec.notes}"
    )
    for f in spec.files:
        check = (
            f"md5 {f.md5}"
            if f.md5
            else (f"sha256 {f.sha256}" if f.sha256 else "no published checksum")
        )
        print(f"  download: {f.url} ({check})")
    if spec.manual:
        print(f"  manual: {spec.manual}")
    print("  default protocol: " + ", ".join(f"{k}={v}" for k, v in spec.defaults.items()))
    if spec.known:
        print("  published figures: " + ", ".join(f"{k}={v:,}" for k, v in spec.known.items()))
    print(f"  raw files in {d}: {', '.join(raw) or 'none (run `vaecf download` or pass --source)'}")
    for p in prepared:
        c = p["counts"]
        print(
            f"  prepared {p['path']}: {c['n_train_users']} train / {c['n_validation_users']} "
            f"validation / {c['n_test_users']} test users, {c['n_items']} items, "
            f"{c['nnz_train']} training interactions ({p['settings']['protocol']})"
        )
    return 0


def cmd_info(a) -> int:
    from vaecf.data import datasets
    from vaecf.data.prepare import PreparedDataset

    if a.path in datasets.SPECS and not Path(a.path).is_dir():
        return _dataset_info(a)
    if (Path(a.path) / "config.json").is_file():  # a run directory (vaecf.rundir.CONFIG)
        from vaecf.cli.runcard import print_card

        return print_card(a.path, a.json)
    ds = PreparedDataset(a.path)
    if a.json:
        print_json(ds.manifest)
        return 0
    c, s = ds.manifest["counts"], ds.manifest["settings"]
    density = c["nnz_train"] / max(1, c["n_train_users"] * c["n_items"])
    total = sum(
        c.get(f"nnz_{k}", 0)
        for k in ("train", "validation_tr", "validation_te", "test_tr", "test_te")
    )
    src = ds.manifest.get("source", {})
    print(
        f"{ds.path}\n  users {c['n_users']} (train {c['n_train_users']}, validation "
        f"{c['n_validation_users']}, test {c['n_test_users']})\n  items {c['n_items']}\n"
        f"  training interactions {c['nnz_train']} (density {density:.4%}); all splits {total}"
        f"\n  raw rows {c['n_rows']}, positives {c['n_positive_rows']}, after filters "
        f"{c['n_filtered_pairs']}\n  item names "
        f"{c['n_named_items'] if 'n_named_items' in c else 'none'}{_names_cut(c)}"
        f"\n  source {src.get('dataset') or src.get('path')} "
        f"(sha256 {str(src.get('sha256'))[:16]}...)\n  settings "
        + ", ".join(f"{k}={v}" for k, v in s.items())
    )
    return 0


def _add_dataset_prepare(psub, name: str, spec) -> None:
    d = spec.defaults
    pn = psub.add_parser(
        name,
        help=f"{spec.title} ({'download' if spec.files else 'needs --source'})",
        description=f"Prepare {spec.title}: {'download and verify' if spec.files else 'read'} "
        "the raw files, apply the protocol, write the prepared dataset. Defaults: "
        + ", ".join(f"{k}={v}" for k, v in d.items())
        + ". "
        + spec.manual,
    )
    pn.add_argument(
        "--source",
        dest="source_path",
        metavar="PATH",
        help="a file or directory you already have (the archive, the raw file(s), "
        "or a directory holding them) instead of downloading",
    )
    from vaecf.data.prepare import PROTOCOL_FIELDS, PrepareSettings

    shown = {k: v for p in PROTOCOL_FIELDS.values() for k, v in p.items()} | spec.defaults
    add_settings(pn, PrepareSettings, defaults=shown)
    pn.add_argument(
        "--all-rows",
        action="store_true",
        help="treat every row as a positive (no rating threshold)",
    )
    add_settings(pn, DataPlaces)
    pn.add_argument("--out", help="output directory (unset: <root>/prepared/NAME-FINGERPRINT)")
    pn.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out if it holds a dataset prepared with other settings",
    )
    pn.add_argument("--quiet", action="store_true", help="no progress output")
    pn.add_argument("--json", action="store_true", help="print the manifest as JSON")
    pn.set_defaults(fn=cmd_prepare_dataset)


def register(sub) -> None:
    _register_prepare(sub)
    _register_download(sub)
    _register_info(sub)


def _register_prepare(sub) -> None:
    pp = sub.add_parser("prepare", help="turn raw interactions into a prepared dataset")
    psub = pp.add_subparsers(dest="source", required=True, metavar="SOURCE")
    pc = psub.add_parser(
        "csv",
        help="any delimited text (with or without a header row), JSON or Parquet file",
        description="Prepare a CSV/TSV/whitespace-delimited/JSON/Parquet file of (user, item[, "
        "rating]) rows with the paper's protocol: positives, dedup, min-count filter, "
        "N validation + N test held-out users (unset: 7% + 7%), 80/20 fold-in.",
    )
    pc.add_argument(
        "--path",
        required=True,
        help="the interactions file: delimited text, JSON (Lines) or Parquet; text and JSON "
        "may be gzip/bzip2/xz-compressed",
    )
    add_columns_options(pc)
    from vaecf.data.prepare import PrepareSettings

    names = ("min_rating", "min_user_items", "min_item_users", "heldout_users", "seed")
    names += ("protocol", "validation_share", "test_share", "last_n")
    held = add_settings(pc, PrepareSettings, only=names)["heldout_users"]
    pc.add_argument(
        "--time-col",
        help="the time protocols: the column of when each interaction happened (unset: found by "
        "name: timestamp, time, datetime, date, ts); epoch seconds or ms, or ISO dates",
    )
    held.help = "unset: 7%% + 7%% of the users (the thesis protocol); " + held.help
    pc.add_argument(
        "--item-names",
        metavar="FILE",
        help="a CSV/TSV/JSON/Parquet file naming the items (e.g. MovieLens movies.csv); the names "
        "are kept with the dataset and shown by recommend, similar and serve",
    )
    pc.add_argument("--name-col", help="--item-names: the column holding the name")
    pc.add_argument(
        "--name-id-col",
        help="--item-names: the column holding the item id (unset: the --item-col name)",
    )
    pc.add_argument("--out", required=True, help="directory to write the prepared dataset to")
    pc.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out if it holds a dataset prepared with other settings",
    )
    pc.add_argument("--json", action="store_true", help="print the manifest as JSON")
    pc.set_defaults(fn=cmd_prepare)
    from vaecf.data import datasets

    for name, spec in datasets.SPECS.items():
        _add_dataset_prepare(psub, name, spec)


def _register_download(sub) -> None:
    from vaecf.data import datasets

    pdl = sub.add_parser(
        "download",
        help="fetch and verify a dataset's official files",
        description="Download a registry dataset into <root>/raw/NAME/, "
        "streamed to a temp file, verified against the published checksum "
        "(or recorded by SHA-256 where none is published), resumable.",
    )
    pdl.add_argument(
        "name",
        choices=datasets.names(),
        metavar="NAME",
        help="one of: " + ", ".join(datasets.names()),
    )
    add_settings(pdl, DataPlaces)
    pdl.add_argument("--quiet", action="store_true", help="no progress bar")
    pdl.add_argument("--json", action="store_true", help="print the file records as JSON")
    pdl.set_defaults(fn=cmd_download)


def _register_info(sub) -> None:
    from vaecf.data import datasets

    pi = sub.add_parser(
        "info", help="describe a prepared dataset, a registry dataset or a run (its model card)"
    )
    pi.add_argument(
        "path",
        metavar="NAME|DIR",
        help="prepared dataset directory, run directory (the model, its settings as fitted, "
        "the training settings it reads, its metrics), or a dataset name ("
        + ", ".join(datasets.names())
        + ")",
    )
    add_settings(pi, DataPlaces, only=("root",))
    pi.add_argument(
        "--json",
        action="store_true",
        help="print the manifest (dataset DIR), the card (run DIR) or the registry entry "
        "(NAME) as JSON",
    )
    pi.set_defaults(fn=cmd_info)
