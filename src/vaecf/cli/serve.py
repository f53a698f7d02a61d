"""Deployment verbs: serve (HTTP API), score (top-k for every user of a file), export (ONNX)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from vaecf.cli.common import print_json
from vaecf.cli.options import add_columns_options, add_settings, from_args
from vaecf.config.settings import Scoring, setting
from vaecf.errors import ConfigError


def _need(extra: str, *modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not installed; pip install 'vaecf[{extra}]' (or pip install "
            f"{' '.join(missing)})"
        )


# -- serve --------------------------------------------------------------------------------------
def cmd_serve(a) -> int:
    from vaecf.config.serve import ServeSettings, check_auth, read_api_key, read_key_file

    settings = from_args(
        ServeSettings,
        a,
        api_key=read_api_key(a.api_key_file),
        admin_key=read_key_file(a.admin_key_file, "--admin-key-file") if a.admin_key_file else None,
    )
    check_auth(settings)  # before importing or loading anything heavy: refuse early
    _need("serve", "fastapi", "uvicorn", "prometheus_client", "orjson")
    from vaecf.serve.server import serve

    serve(settings, log_level=settings.log_level, access_log=settings.access_log)
    return 0


# -- score --------------------------------------------------------------------------------------
@dataclass
class ScoreSettings(Scoring):
    """`vaecf score`: the history file's columns, k, and how much is read and scored at once."""

    k: int = setting(100, "items per user", flag="-k")
    chunk_rows: int = setting(2_000_000, "interactions read at once")
    batch_users: int = setting(1024, "users per scoring call")


def cmd_score(a) -> int:
    from tqdm.auto import tqdm

    from vaecf import distributed
    from vaecf.score import RowFilter, score_file

    s = from_args(ScoreSettings, a)
    ctx, device = distributed.setup(s.device)  # under torchrun: this process's share, its GPU
    rec = _score_recommender(a, s, ctx, device)
    how = dict(sep=a.sep, header=not a.no_header, columns=a.columns, rating_col=a.rating_col)
    if a.every_row:
        rows = RowFilter(**how)
    elif a.min_rating is not None:
        rows = RowFilter(min_rating=a.min_rating, why="--min-rating", **how)
    else:
        rows = RowFilter.of_run(rec, **how)
    quiet = a.quiet or not ctx.is_main
    with tqdm(unit="user", disable=True if quiet else None, desc="scoring") as bar:

        def progress(n: int) -> None:
            bar.update(n)

        res = score_file(
            rec,
            a.input,
            a.user_col,
            a.item_col,
            a.out,
            k=s.k,
            exclude_seen=not a.include_seen,
            chunk_rows=s.chunk_rows,
            batch_users=s.batch_users,
            progress=progress,
            rows=rows,
            dist=ctx,
        )
    distributed.teardown()
    if not ctx.is_main:
        return 0
    if a.json:
        choice = rec.precision_choice
        print_json(
            {**res, "precision": rec.precision, "precision_choice": choice and choice.to_dict()}
        )
    else:
        cold = (
            f" ({res['cold_users']} with no known item: popular items)" if res["cold_users"] else ""
        )
        parts = ""
        if "parts_kept" in res:
            kept = f", {res['parts_kept']} kept from an earlier run" if res["parts_kept"] else ""
            parts = f" in {res['chunks']} parts{kept}"
        print(f"{res['users']} users{cold}, {res['rows']} rows -> {res['out']}{parts}",
              file=sys.stderr)  # fmt: skip
    return 0


def _score_recommender(a, s, ctx, device):
    """The run served as `score` scores it: `--precision auto` chooses on rank 0 (printed), the
    other ranks take its choice; into a directory an earlier run started, the precision its
    parts were scored in (so that a resumed table is one table)."""
    from vaecf.recommender import Recommender
    from vaecf.score.parts import planned_precision

    precision = s.precision
    if precision == "auto":
        precision = planned_precision(a.out) or precision
    rec = None
    if ctx.is_main:
        rec = Recommender.load(a.run, device, precision=precision, batch_sizes=[s.batch_users])
        for line in rec.precision_choice.lines() if rec.precision_choice else ():
            print(line, file=sys.stderr)
    chosen = ctx.from_main(rec.precision if rec is not None else None)
    return rec if rec is not None else Recommender.load(a.run, device, precision=chosen)


# -- export -------------------------------------------------------------------------------------
@dataclass
class ExportSettings:
    format: Literal["onnx"] = setting("onnx", "file format (the only one)")


def cmd_export(a) -> int:
    import random
    from pathlib import Path

    from vaecf.export import check_onnx, export_onnx

    _need("export", "onnx")
    out = Path(a.out or Path(a.run) / "model.onnx")
    res = {"out": str(out)}

    def check(path, model) -> None:  # before the file takes its name: a bad export never does
        rng = random.Random(0)
        n = model.n_items
        histories = [rng.sample(range(n), rng.randint(1, min(n, 50))) for _ in range(8)]
        res.update(check_onnx(path, model, histories))
        if not res["top100_equal"]:
            raise ConfigError(
                f"onnxruntime's top 100 differs from PyTorch's ({res}); {out} is not written"
            )

    if not a.no_check:
        _need("export", "onnxruntime")
    export_onnx(a.run, out, check=None if a.no_check else check)
    if a.json:
        print_json(res)
    else:
        extra = (
            f" (onnxruntime vs PyTorch: max |diff| {res['max_abs_diff']:.2g}, same top 100)"
            if "max_abs_diff" in res
            else ""
        )
        print(f"wrote {out}{extra}")
    return 0


def register(sub) -> None:
    ps = sub.add_parser(
        "serve",
        help="serve a run's model over HTTP (FastAPI: /v1/recommend, /docs)",
        description="HTTP API over the run's best model: /v1/recommend, /v1/recommend/batch, "
        "/v1/items/{id}/similar, /v1/admin/reload (also SIGHUP), /healthz, /readyz, /metrics; "
        "OpenAPI at /docs. Listens on 127.0.0.1 unless told otherwise; another address needs "
        "an API key (--api-key-file or $VAECF_API_KEY) or --no-auth.",
    )
    from vaecf.config.serve import ServeSettings

    ps.add_argument("run", help="run directory written by `vaecf train`")
    ps.add_argument("--api-key-file", help="file whose first line is the API key (16+ characters)")
    ps.add_argument(
        "--admin-key-file",
        help="file whose first line is the key for /v1/admin/* (required for them unless the "
        "server listens on loopback only; on loopback, it makes them require it)",
    )
    add_settings(ps, ServeSettings, skip=("run", "api_key", "admin_key"))
    ps.set_defaults(fn=cmd_serve)

    register_score(sub)

    px = sub.add_parser(
        "export",
        help="export a run's model (ONNX)",
        description="Write the run's best model as ONNX: input `history` (batch, n_items) "
        "float32 multi-hot in the column order of the run's items.parquet, output `scores` "
        "(batch, n_items) raw scores (logits for Mult-VAE/DAE, RecVAE); dynamic batch axis. "
        "The history is not masked in the graph. Checked against PyTorch with onnxruntime.",
    )
    px.add_argument("run", help="run directory written by `vaecf train`")
    add_settings(px, ExportSettings)
    px.add_argument("--out", help="output file (unset: RUN/model.onnx)")
    px.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    px.add_argument("--json", action="store_true", help="print the result as JSON")
    px.set_defaults(fn=cmd_export)


def register_score(sub) -> None:
    pc = sub.add_parser(
        "score",
        help="top-k for every user of an interaction file, to Parquet/CSV",
        description="Recommend k items for every user of a history file (text, JSON or "
        "Parquet), in chunks of users (bounded memory), written atomically. Output columns: "
        "the user column, rank, item_id, score (and title, where the run names its items); "
        "sorted by user then rank. A history keeps what the run's own preparation kept.",
    )
    pc.add_argument("run", help="run directory written by `vaecf train`")
    pc.add_argument("--input", required=True, help="interactions: CSV, TSV, JSON or Parquet")
    pc.add_argument(
        "--out",
        required=True,
        help="output .parquet or .csv file, or a directory (recs/: Parquet parts and _SUCCESS; "
        "resumable, and shared among the processes of `torchrun ... vaecf score`)",
    )
    pc.add_argument(
        "--include-seen", action="store_true", help="may recommend the user's own items"
    )
    add_columns_options(pc)
    keep = pc.add_mutually_exclusive_group()
    keep.add_argument(
        "--min-rating",
        type=float,
        help="keep as history only the rows rated at least this (unset: the run's own "
        "prepare --min-rating, so that a user's history is the one `recommend` uses)",
    )
    keep.add_argument(
        "--every-row",
        action="store_true",
        help="take every row as history, whatever the run was prepared with",
    )
    add_settings(pc, ScoreSettings)
    pc.add_argument("--quiet", action="store_true", help="no progress bar")
    pc.add_argument(
        "--json",
        action="store_true",
        help="print {users, rows, chunks, cold_users, out, precision, precision_choice}",
    )
    pc.set_defaults(fn=cmd_score)
