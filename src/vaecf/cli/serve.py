"""Deployment verbs: serve (HTTP API), score (top-k for every user of a file), export (ONNX)."""

from __future__ import annotations

import sys

from vaecf.cli.common import print_json
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
    from vaecf.serve.settings import ServeSettings, check_auth, read_api_key, read_key_file

    settings = ServeSettings(
        run=a.run,
        host=a.host,
        port=a.port,
        device=a.device,
        precision=a.precision,
        api_key=read_api_key(a.api_key_file),
        no_auth=a.no_auth,
        batch_wait_ms=a.batch_wait_ms,
        max_batch_size=a.max_batch_size,
        max_body_bytes=a.max_body_bytes,
        max_history=a.max_history,
        max_k=a.max_k,
        max_batch=a.max_batch,
        reload_root=a.reload_root,
        max_answer_items=a.max_answer_items,
        max_queue=a.max_queue,
        request_timeout_s=a.request_timeout,
        limit_concurrency=a.limit_concurrency,
        admin_key=read_key_file(a.admin_key_file, "--admin-key-file") if a.admin_key_file else None,
        reload_min_interval_s=a.reload_min_interval,
        allowed_hosts=a.allowed_host or [],
        expose_paths=a.expose_paths,
        shutdown_delay_s=a.shutdown_delay,
        drain_s=a.drain,
        stuck_after_s=a.stuck_after,
    )
    check_auth(settings)  # before importing or loading anything heavy: refuse early
    _need("serve", "fastapi", "uvicorn", "prometheus_client", "orjson")
    from vaecf.serve.server import serve

    serve(settings, log_level=a.log_level, access_log=a.access_log)
    return 0


def _precision_option(parser) -> None:
    from vaecf.settings import SERVING_PRECISIONS

    parser.add_argument(
        "--precision",
        default="fp32",
        choices=SERVING_PRECISIONS,
        help="fp32 (default: the scores the run was evaluated with), tf32, bf16, fp16, or int8: "
        "the item-sized layers in int8 with one scale per item (Mult-VAE, Mult-DAE, RecVAE): "
        "a quarter of their fp32 bytes, held and read per call (the other layers stay in "
        "fp32, or bf16 on a CPU with native bf16)",
    )


# -- score --------------------------------------------------------------------------------------
def cmd_score(a) -> int:
    from tqdm.auto import tqdm

    from vaecf.recommender import Recommender
    from vaecf.score import score_file

    rec = Recommender.load(a.run, device=a.device, precision=a.precision)
    with tqdm(unit="user", disable=True if a.quiet else None, desc="scoring") as bar:

        def progress(n: int) -> None:
            bar.update(n)

        res = score_file(
            rec,
            a.input,
            a.user_col,
            a.item_col,
            a.out,
            k=a.k,
            exclude_seen=not a.include_seen,
            chunk_rows=a.chunk_rows,
            batch_users=a.batch_users,
            progress=progress,
        )
    if a.json:
        print_json(res)
    else:
        cold = (
            f" ({res['cold_users']} with no known item: popular items)" if res["cold_users"] else ""
        )
        print(f"{res['users']} users{cold}, {res['rows']} rows -> {res['out']}", file=sys.stderr)
    return 0


# -- export -------------------------------------------------------------------------------------
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
    ps.add_argument("run", help="run directory written by `vaecf train`")
    ps.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    ps.add_argument("--port", type=int, default=8000, help="port (8000)")
    ps.add_argument("--api-key-file", help="file whose first line is the API key (16+ characters)")
    ps.add_argument(
        "--no-auth",
        action="store_true",
        help="allow a non-loopback --host without an API key (a proxy authenticates)",
    )
    ps.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    _precision_option(ps)
    ps.add_argument(
        "--batch-wait-ms",
        type=float,
        default=2.0,
        help="micro-batching: gather concurrent requests this long (2; 0: off)",
    )
    ps.add_argument(
        "--max-batch-size", type=int, default=256, help="histories per scoring call (256)"
    )
    ps.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body (1 MiB)")
    ps.add_argument("--max-history", type=int, default=5000, help="items per history (5000)")
    ps.add_argument("--max-k", type=int, default=1000, help="largest k (1000)")
    ps.add_argument(
        "--max-batch",
        type=int,
        default=256,
        help="histories per batch request (256; at most --max-batch-size)",
    )
    ps.add_argument(
        "--max-answer-items",
        type=int,
        default=25_000,
        help="histories x k in one answer (25000; 422 beyond)",
    )
    ps.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="histories waiting to be scored; beyond, 503 with Retry-After at once (1024)",
    )
    ps.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        help="seconds a request may wait for its answer before a 503 (10)",
    )
    ps.add_argument(
        "--limit-concurrency",
        type=int,
        default=512,
        help="connections and requests at once; uvicorn answers 503 beyond (512)",
    )
    ps.add_argument(
        "--reload-root",
        help='POST /v1/admin/reload {"run": DIR} loads run directories under this one only '
        "(default: the directory holding RUN)",
    )
    ps.add_argument(
        "--admin-key-file",
        help="file whose first line is the key for /v1/admin/* (required for them unless the "
        "server listens on loopback only; on loopback, it makes them require it)",
    )
    ps.add_argument(
        "--reload-min-interval",
        type=float,
        default=1.0,
        help="seconds between reloads; closer ones get 429 (1)",
    )
    ps.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host header name to answer besides localhost, 127.0.0.1, ::1 and --host "
        "(repeatable; '*': any, e.g. behind a proxy that checks it)",
    )
    ps.add_argument(
        "--expose-paths",
        action="store_true",
        help="name the run directory's absolute path in answers (default: its name only)",
    )
    ps.add_argument(
        "--shutdown-delay",
        type=float,
        default=2.0,
        help="after SIGTERM, seconds /readyz answers 503 before the drain starts (2)",
    )
    ps.add_argument(
        "--drain",
        type=float,
        default=30.0,
        help="then, seconds requests in flight get to finish (30)",
    )
    ps.add_argument(
        "--stuck-after",
        type=float,
        default=30.0,
        help="/healthz answers 503 when one scoring call runs longer (30 s)",
    )
    ps.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    ps.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request to stderr (off by default: it costs ~40 us a request; "
        "/metrics counts requests by route and status)",
    )
    ps.set_defaults(fn=cmd_serve)

    pc = sub.add_parser(
        "score",
        help="top-k for every user of an interaction file, to Parquet/CSV",
        description="Recommend k items for every user of a history file (CSV or Parquet), in "
        "chunks of users (bounded memory), written atomically. Output columns: the user "
        "column, rank, item_id, score; sorted by user then rank.",
    )
    pc.add_argument("run", help="run directory written by `vaecf train`")
    pc.add_argument("--input", required=True, help="interactions: .csv, .tsv or .parquet")
    pc.add_argument("--user-col", default="user_id", help="user column (user_id)")
    pc.add_argument("--item-col", default="item_id", help="item column (item_id)")
    pc.add_argument("-k", type=int, default=100, help="items per user (100)")
    pc.add_argument("--out", required=True, help="output .parquet or .csv")
    pc.add_argument(
        "--include-seen", action="store_true", help="may recommend the user's own items"
    )
    pc.add_argument(
        "--chunk-rows", type=int, default=2_000_000, help="interactions read at once (2,000,000)"
    )
    pc.add_argument("--batch-users", type=int, default=1024, help="users per scoring call")
    pc.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    _precision_option(pc)
    pc.add_argument("--quiet", action="store_true", help="no progress bar")
    pc.add_argument("--json", action="store_true", help="print {users, rows, chunks, out}")
    pc.set_defaults(fn=cmd_score)

    px = sub.add_parser(
        "export",
        help="export a run's model (ONNX)",
        description="Write the run's best model as ONNX: input `history` (batch, n_items) "
        "float32 multi-hot in the column order of the run's items.parquet, output `scores` "
        "(batch, n_items) raw scores (logits for Mult-VAE/DAE, RecVAE); dynamic batch axis. "
        "The history is not masked in the graph. Checked against PyTorch with onnxruntime.",
    )
    px.add_argument("run", help="run directory written by `vaecf train`")
    px.add_argument("--format", choices=["onnx"], default="onnx", help="onnx (the only one)")
    px.add_argument("--out", help="output file (default RUN/model.onnx)")
    px.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    px.add_argument("--json", action="store_true", help="print the result as JSON")
    px.set_defaults(fn=cmd_export)
