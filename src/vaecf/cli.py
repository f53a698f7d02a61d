"""Command line: one verb per user task. Thin: parse, call the library, print.

Exit codes: 0 ok, 2 bad input (a message says what to do), 1 failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _home() -> Path:
    return Path(os.environ.get("VAECF_HOME") or Path.home() / ".cache" / "vaecf")


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _metrics_table(rows: dict[str, dict]) -> str:
    keys = ["recall@20", "recall@50", "ndcg@100"]
    lines = [f"{'':14s}" + "".join(f"{k:>12s}" for k in keys)]
    for name, m in rows.items():
        lines.append(f"{name:14s}" + "".join(f"{m[k]:12.4f}" for k in keys))
    return "\n".join(lines)


# -- prepare ------------------------------------------------------------------------------------
def cmd_prepare(a) -> int:
    from vaecf.data.prepare import PrepareSettings, prepare_csv

    settings = PrepareSettings(
        min_rating=a.min_rating,
        min_user_items=a.min_user_items,
        min_item_users=a.min_item_users,
        heldout_users=a.heldout_users,
        seed=a.seed,
    )
    ds = prepare_csv(
        a.path, a.out, a.user_col, a.item_col, a.rating_col, a.sep, settings, overwrite=a.overwrite
    )
    if a.json:
        _print_json({"path": str(ds.path), **ds.manifest})
    else:
        c = ds.manifest["counts"]
        print(
            f"prepared {ds.path}: {c['n_train_users']} training users, {c['n_items']} items, "
            f"{c['nnz_train']} training interactions; {c['n_validation_users']} validation + "
            f"{c['n_test_users']} test users"
        )
    return 0


def _prepared_summary(ds) -> str:
    c = ds.manifest["counts"]
    return (
        f"prepared {ds.path}: {c['n_train_users']} training users, {c['n_items']} items, "
        f"{c['nnz_train']} training interactions; {c['n_validation_users']} validation + "
        f"{c['n_test_users']} test users"
    )


def cmd_prepare_dataset(a) -> int:
    from vaecf.data.prepare import dataset_settings, prepare_dataset

    settings = dataset_settings(
        a.source,
        protocol=a.protocol,
        seed=a.seed,
        min_rating=a.min_rating,
        min_user_items=a.min_user_items,
        min_item_users=a.min_item_users,
        heldout_users=a.heldout_users,
        validation_frac=a.validation_frac,
        test_frac=a.test_frac,
        target_frac=a.target_frac,
    )
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
        _print_json({"path": str(ds.path), **ds.manifest})
    else:
        print(_prepared_summary(ds))
    return 0


# -- download -----------------------------------------------------------------------------------
def cmd_download(a) -> int:
    from vaecf.data import registry
    from vaecf.data.download import download

    spec = registry.get(a.name)
    records = download(spec, a.root, url=a.url, progress=not a.quiet)
    d = registry.raw_dir(spec.name, a.root)
    if a.json:
        _print_json({"dataset": spec.name, "dir": str(d), "files": records})
    else:
        for fname, rec in records.items():
            print(
                f"{d / fname}  {rec['bytes']} bytes  sha256 {rec['sha256']}  "
                f"(verified: {rec['verified']})"
            )
    return 0


# -- train --------------------------------------------------------------------------------------
def cmd_train(a) -> int:
    from vaecf.config import ModelConfig, TrainConfig
    from vaecf.trainer import train

    explicit = {k for k, v in vars(a).items() if v is not None}
    cfg = TrainConfig()
    for name in (
        "epochs",
        "batch_size",
        "lr",
        "total_anneal_steps",
        "anneal_cap",
        "seed",
        "device",
        "precision",
        "eval_every",
        "data_on",
    ):
        if name in explicit:
            setattr(cfg, name, getattr(a, name))
    cfg.progress = not a.quiet
    mcfg = ModelConfig(
        model=a.model or "multvae",
        **({"dropout": a.dropout} if a.dropout is not None else {}),
        **({"weight_decay": a.weight_decay} if a.weight_decay is not None else {}),
    )
    if a.resume and "epochs" not in explicit and (Path(a.out) / "config.json").is_file():
        cfg = None  # resume an existing run with its stored settings
    res = train(a.data, cfg, a.out, mcfg, resume=a.resume)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun, rank 0 alone reports
    if a.json:
        _print_json(
            {
                "run_dir": str(res.run_dir),
                "best_epoch": res.best_epoch,
                "validation": res.validation_metrics,
                "test": res.test_metrics,
            }
        )
    else:
        print(f"\nbest epoch {res.best_epoch}; run directory {res.run_dir}")
        print(_metrics_table({"validation": res.validation_metrics, "test": res.test_metrics}))
    return 0


# -- evaluate -----------------------------------------------------------------------------------
def cmd_evaluate(a) -> int:
    from vaecf.data.matrix import CSR
    from vaecf.data.prepare import PreparedDataset
    from vaecf.evaluate import evaluate_model
    from vaecf.recommender import Recommender
    from vaecf.trainer import load_run_config

    cfg = load_run_config(a.run)
    ds = PreparedDataset(a.data or cfg["data"]["path"])
    if ds.fingerprint != cfg["data"]["fingerprint"]:
        from vaecf.errors import RunError

        raise RunError(f"{ds.path} is not the dataset {a.run} was trained on; pass its --data")
    rec = Recommender.load(a.run, device=a.device)
    fold_in, target = (CSR.from_scipy(ds.split(f"{a.split}_{p}"), rec.device) for p in ("tr", "te"))
    # in the run's precision, so that the test split reproduces results.json
    m = evaluate_model(rec.model, fold_in, target, precision=cfg["train"]["precision"])
    if a.json:
        _print_json({"split": a.split, **m})
    else:
        print(_metrics_table({a.split: m}))
        print(f"{m['n_users']} users evaluated, {m['n_skipped']} skipped (empty target)")
    return 0


# -- recommend ----------------------------------------------------------------------------------
def cmd_recommend(a) -> int:
    from vaecf.recommender import Recommender

    history = [s.strip() for s in a.items.split(",") if s.strip()]
    r = Recommender.load(a.run, device=a.device).recommend(history, k=a.k)
    if a.json:
        _print_json(r.to_dict())
        return 0
    if r.unknown:
        print(f"unknown item ids (ignored): {', '.join(map(str, r.unknown))}", file=sys.stderr)
    print(f"{'rank':>4s}  {'item_id':>12s}  score")
    for i, (item, s) in enumerate(zip(r.item_ids, r.scores), 1):
        print(f"{i:4d}  {item!s:>12s}  {s:.5f}")
    return 0


# -- info ---------------------------------------------------------------------------------------
def _dataset_info(a) -> int:
    from dataclasses import asdict

    from vaecf.data import registry
    from vaecf.data.prepare import PreparedDataset

    spec = registry.get(a.path)
    d = registry.raw_dir(spec.name, a.root)
    raw = sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []
    prepared = []
    for p in sorted(registry.prepared_root(a.root).glob(f"{spec.name}-*")):
        if (p / "manifest.json").is_file():
            m = PreparedDataset(p).manifest
            prepared.append({"path": str(p), "counts": m["counts"], "settings": m["settings"]})
    info = {**asdict(spec), "raw_dir": str(d), "raw_files_present": raw, "prepared": prepared}
    if a.json:
        _print_json(info)
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
    from vaecf.data import registry
    from vaecf.data.prepare import PreparedDataset

    if a.path in registry.SPECS and not Path(a.path).is_dir():
        return _dataset_info(a)
    ds = PreparedDataset(a.path)
    if a.json:
        _print_json(ds.manifest)
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
        f"{c['n_filtered_pairs']}\n  source {src.get('dataset') or src.get('path')} "
        f"(sha256 {str(src.get('sha256'))[:16]}...)\n  settings "
        + ", ".join(f"{k}={v}" for k, v in s.items())
    )
    return 0


# -- demo ---------------------------------------------------------------------------------------
def cmd_demo(a) -> int:
    from vaecf.demo import run_demo

    run_demo(
        out=Path(a.out) if a.out else _home() / "demo",
        epochs=a.epochs,
        n_users=a.users,
        n_items=a.items,
        seed=a.seed,
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
    pn.add_argument(
        "--protocol",
        choices=["liang", "thesis"],
        help=f"liang: N validation + N test users (the paper); thesis: 86/7/7 "
        f"percent of users (default {d.get('protocol', 'liang')})",
    )
    pn.add_argument("--seed", type=int, help="shuffle/split seed (default 98765, the paper's)")
    pn.add_argument(
        "--min-rating",
        type=float,
        help=f"keep rows with rating >= X (default {d.get('min_rating')})",
    )
    pn.add_argument(
        "--all-rows",
        action="store_true",
        help="treat every row as a positive (no rating threshold)",
    )
    pn.add_argument(
        "--min-user-items",
        type=int,
        help=f"drop users with fewer positives (default {d.get('min_user_items', 5)})",
    )
    pn.add_argument(
        "--min-item-users",
        type=int,
        help=f"first drop items with fewer users (default {d.get('min_item_users', 0)})",
    )
    pn.add_argument(
        "--heldout-users",
        type=int,
        help=f"liang: N validation and N test users (default {d.get('heldout_users', 10_000)})",
    )
    pn.add_argument(
        "--validation-frac",
        type=float,
        help="thesis: fraction of users for validation (default 0.07)",
    )
    pn.add_argument(
        "--test-frac", type=float, help="thesis: fraction of users for test (default 0.07)"
    )
    pn.add_argument(
        "--target-frac",
        type=float,
        help="fraction of each held-out user's items to predict (default 0.2)",
    )
    pn.add_argument("--root", help="data root (default $VAECF_HOME or ~/.cache/vaecf)")
    pn.add_argument("--url", help="download from this mirror URL instead of the official one")
    pn.add_argument("--out", help="output directory (default <root>/prepared/NAME-FINGERPRINT)")
    pn.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out if it holds a dataset prepared with other settings",
    )
    pn.add_argument("--quiet", action="store_true", help="no progress output")
    pn.add_argument("--json", action="store_true", help="print the manifest as JSON")
    pn.set_defaults(fn=cmd_prepare_dataset)


# -- bench --------------------------------------------------------------------------------------
def cmd_bench(a) -> int:
    from vaecf import bench

    if a.what == "train":
        res = [
            bench.bench_train(
                p,
                a.batch_size,
                a.users,
                a.items,
                a.nnz,
                a.steps,
                a.warmup,
                a.device,
                a.model,
                progress=not a.json,
            )
            for p in a.precision or bench.default_precisions(a.device)
        ]
        if a.json:
            _print_json([r.to_dict() for r in res])
        else:
            print(bench.format_train(res))
        return 0
    if a.what == "eval":
        r = bench.bench_eval(a.items, a.users, a.history, a.batch_size, a.precision, a.device)
        if a.json:
            _print_json(r)
        else:
            print(
                f"full evaluation of {r['users']:,} held-out users x {r['items']:,} items "
                f"({r['precision']}, batch {r['batch_size']}): {r['seconds']:.2f} s, "
                f"{r['users_per_s']:,.0f} users/s"
            )
        return 0
    target = a.target if not a.target.isdigit() else int(a.target)
    rows = bench.bench_infer(
        target,
        a.batch_size or [1, 1024],
        a.precision,
        a.device,
        a.history,
        a.seconds,
        progress=not a.json,
    )
    if a.json:
        _print_json(rows)
    else:
        print(bench.format_infer(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vaecf",
        description=(
            "Mult-VAE / Mult-DAE for collaborative filtering: prepare interaction data, train, "
            "evaluate and recommend."
        ),
    )
    from vaecf import __version__

    p.add_argument("--version", action="version", version=f"vaecf {__version__}")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    pp = sub.add_parser("prepare", help="turn raw interactions into a prepared dataset")
    psub = pp.add_subparsers(dest="source", required=True, metavar="SOURCE")
    pc = psub.add_parser(
        "csv",
        help="any CSV/TSV/Parquet file with a header row",
        description="Prepare a CSV/TSV/Parquet file of (user, item[, rating]) "
        "rows with the paper's protocol: positives, dedup, min-count filter, "
        "N validation + N test held-out users, 80/20 fold-in.",
    )
    pc.add_argument("--path", required=True, help="the interactions file (.csv, .tsv, .parquet)")
    pc.add_argument("--user-col", required=True, help="name of the user id column")
    pc.add_argument("--item-col", required=True, help="name of the item id column")
    pc.add_argument("--rating-col", help="name of the rating column (needed by --min-rating)")
    pc.add_argument(
        "--min-rating",
        type=float,
        help="keep rows with rating >= X as positives "
        "(the paper's 'rating > 3.5' on MovieLens is 4); default: every row",
    )
    pc.add_argument("--sep", help="field separator (default: ',' or tab for .tsv); '\\t' = tab")
    pc.add_argument(
        "--min-user-items",
        type=int,
        default=5,
        help="drop users with fewer positives (default 5, as the paper)",
    )
    pc.add_argument(
        "--min-item-users",
        type=int,
        default=0,
        help="first drop items with fewer users (default 0: none)",
    )
    pc.add_argument(
        "--heldout-users",
        type=int,
        required=True,
        help="N: users in the validation split, and again in the test split",
    )
    pc.add_argument("--seed", type=int, default=98765, help="shuffle/split seed (paper: 98765)")
    pc.add_argument("--out", required=True, help="directory to write the prepared dataset to")
    pc.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out if it holds a dataset prepared with other settings",
    )
    pc.add_argument("--json", action="store_true", help="print the manifest as JSON")
    pc.set_defaults(fn=cmd_prepare)
    from vaecf.data import registry

    for name, spec in registry.SPECS.items():
        _add_dataset_prepare(psub, name, spec)

    pdl = sub.add_parser(
        "download",
        help="fetch and verify a dataset's official files",
        description="Download a registry dataset into <root>/raw/NAME/, "
        "streamed to a temp file, verified against the published checksum "
        "(or recorded by SHA-256 where none is published), resumable.",
    )
    pdl.add_argument(
        "name",
        choices=registry.names(),
        metavar="NAME",
        help="one of: " + ", ".join(registry.names()),
    )
    pdl.add_argument("--root", help="data root (default $VAECF_HOME or ~/.cache/vaecf)")
    pdl.add_argument("--url", help="download from this mirror URL instead of the official one")
    pdl.add_argument("--quiet", action="store_true", help="no progress bar")
    pdl.add_argument("--json", action="store_true", help="print the file records as JSON")
    pdl.set_defaults(fn=cmd_download)

    pt = sub.add_parser(
        "train",
        help="train Mult-VAE or Mult-DAE on a prepared dataset",
        description="Train on a prepared dataset; validates every epoch, keeps "
        "the best model by validation NDCG@100, and scores the test split once "
        "with it. Defaults are the paper's hyperparameters.",
    )
    pt.add_argument("--data", required=True, help="prepared dataset directory")
    pt.add_argument("--out", required=True, help="run directory to create (or resume)")
    pt.add_argument("--model", choices=["multvae", "multdae"], help="default multvae")
    pt.add_argument("--epochs", type=int, help="passes over the training users (default 200)")
    pt.add_argument("--batch-size", type=int, help="users per update (default 500)")
    pt.add_argument("--lr", type=float, help="Adam learning rate (default 1e-3)")
    pt.add_argument(
        "--total-anneal-steps",
        type=int,
        help="updates for beta to reach 1: beta = step / this (default 200000)",
    )
    pt.add_argument("--anneal-cap", type=float, help="largest KL weight beta (default 0.2)")
    pt.add_argument("--dropout", type=float, help="input dropout rate (default 0.5)")
    pt.add_argument(
        "--weight-decay",
        type=float,
        help="lam in lam * sum(W^2) (default 0 for multvae, 0.01 for multdae)",
    )
    pt.add_argument("--seed", type=int, help="seed of init, shuffling, dropout (default 98765)")
    pt.add_argument("--device", help="auto (default: cuda if present), cpu, cuda, cuda:N")
    pt.add_argument(
        "--precision",
        choices=["auto", "fp32", "tf32", "bf16", "fp16"],
        help="numeric precision; auto = bf16 where the CPU/GPU has native bf16, "
        "else fp32 (the default); fp16 uses dynamic loss scaling",
    )
    pt.add_argument("--eval-every", type=int, help="validate every N epochs (default 1)")
    pt.add_argument(
        "--data-on",
        choices=["device", "host"],
        help="keep the training matrix on the device (default) or on the host, "
        "with batches prefetched by a background thread (for data that does not fit)",
    )
    pt.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (same settings; "
        "--epochs may extend it)",
    )
    pt.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")
    pt.add_argument("--json", action="store_true", help="print the final result as JSON")
    pt.set_defaults(fn=cmd_train)

    pe = sub.add_parser("evaluate", help="score a run's best model on a held-out split")
    pe.add_argument("run", help="run directory written by `vaecf train`")
    pe.add_argument(
        "--split",
        choices=["validation", "test"],
        default="test",
        help="which held-out users (default test)",
    )
    pe.add_argument("--data", help="prepared dataset (default: the one the run was trained on)")
    pe.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    pe.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: recall@20, recall@50, ndcg@100, n_users, ...",
    )
    pe.set_defaults(fn=cmd_evaluate)

    pr = sub.add_parser("recommend", help="top-k items for a history of item ids")
    pr.add_argument("run", help="run directory written by `vaecf train`")
    pr.add_argument("--items", required=True, help="comma-separated raw item ids (the history)")
    pr.add_argument("-k", type=int, default=10, help="how many items (default 10)")
    pr.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    pr.add_argument("--json", action="store_true", help="print JSON: items with scores, unknown")
    pr.set_defaults(fn=cmd_recommend)

    pi = sub.add_parser("info", help="describe a prepared dataset or a registry dataset")
    pi.add_argument(
        "path",
        metavar="NAME|DIR",
        help="prepared dataset directory, or a dataset name (" + ", ".join(registry.names()) + ")",
    )
    pi.add_argument("--root", help="data root for NAME (default $VAECF_HOME or ~/.cache/vaecf)")
    pi.add_argument(
        "--json",
        action="store_true",
        help="print the manifest (DIR) or the registry entry (NAME) as JSON",
    )
    pi.set_defaults(fn=cmd_info)

    pd = sub.add_parser(
        "demo",
        help="generate the built-in dataset, train, show results",
        description="Generate a synthetic dataset with planted taste groups, "
        "prepare it, train Mult-VAE, compare with popularity and recommend.",
    )
    pd.add_argument("--out", help="working directory (default $VAECF_HOME/demo)")
    pd.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    pd.add_argument("--users", type=int, default=12_000, help="synthetic users (default 12000)")
    pd.add_argument("--items", type=int, default=3_000, help="synthetic items (default 3000)")
    pd.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    pd.set_defaults(fn=cmd_demo)

    pb = sub.add_parser("bench", help="training throughput and inference latency benchmarks")
    bsub = pb.add_subparsers(dest="what", required=True, metavar="WHAT")
    bt = bsub.add_parser(
        "train",
        help="users/s, GFLOP/s and step breakdown on a synthetic dataset (default: ML-20M's shape)",
    )
    bt.add_argument(
        "--precision",
        action="append",
        choices=["fp32", "tf32", "bf16", "fp16"],
        help="repeat to compare several (default: fp32, plus bf16 where the device has native "
        "bf16; emulated bf16 is ~10x slower than fp32)",
    )
    bt.add_argument("--batch-size", type=int, default=500, help="users per step (default 500)")
    bt.add_argument("--users", type=int, default=136_677, help="training users (ML-20M: 136677)")
    bt.add_argument("--items", type=int, default=20_108, help="items (ML-20M: 20108)")
    bt.add_argument("--nnz", type=int, default=10_000_000, help="interactions (default 10M)")
    bt.add_argument("--model", choices=["multvae", "multdae"], default="multvae")
    bt.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    bt.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    bt.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    bt.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bt.set_defaults(fn=cmd_bench)
    bi = bsub.add_parser("infer", help="latency percentiles and throughput of recommending")
    bi.add_argument(
        "target",
        nargs="?",
        default="20108",
        help="a run directory, or a number of items for a fresh model (default 20108)",
    )
    bi.add_argument(
        "--batch-size", type=int, action="append", help="repeat for several (default: 1 and 1024)"
    )
    bi.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        default="auto",
        help="auto (default): bf16 where the device has native bf16, else fp32",
    )
    bi.add_argument("--history", type=int, default=50, help="items per user history (default 50)")
    bi.add_argument("--seconds", type=float, default=3.0, help="time per batch size (default 3)")
    bi.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    bi.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bi.set_defaults(fn=cmd_bench)
    be = bsub.add_parser(
        "eval", help="seconds for one full validation pass (fold-in, mask, top-100, metrics)"
    )
    be.add_argument("--users", type=int, default=10_000, help="held-out users (default 10000)")
    be.add_argument("--items", type=int, default=20_108, help="items (ML-20M: 20108)")
    be.add_argument("--history", type=int, default=50, help="items per user (default 50)")
    be.add_argument("--batch-size", type=int, default=2000, help="users per batch (default 2000)")
    be.add_argument(
        "--precision",
        choices=["auto", "fp32", "tf32", "bf16", "fp16"],
        default="auto",
        help="auto (default): bf16 where the device has native bf16, else fp32",
    )
    be.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    be.add_argument("--json", action="store_true", help="print JSON instead of a line")
    be.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from vaecf.errors import VaecfError

    try:
        return args.fn(args)
    except (VaecfError, ValueError) as e:
        print(f"vaecf {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vaecf {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
