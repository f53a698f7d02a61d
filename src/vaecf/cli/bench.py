"""bench and demo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vaecf.cli.common import home, print_json
from vaecf.cli.options import add_settings, from_args
from vaecf.config.settings import (
    Compute,
    ModelChoice,
    Scoring,
    ServingPrecision,
    TrainPrecision,
    setting,
)

ML20M_ITEMS = 20_108  # the default catalogue of the synthetic benchmarks: ML-20M's shape


@dataclass
class DemoSettings:
    out: str | None = setting(None, "working directory (unset: $VAECF_HOME/demo)")
    epochs: int = setting(20, "training epochs")
    users: int = setting(12_000, "synthetic users")
    items: int = setting(3_000, "synthetic items")
    seed: int = setting(0, "generator seed")


@dataclass
class BenchTrain(Compute, ModelChoice):
    precision: list[TrainPrecision] | None = setting(
        None,
        "repeat to compare several (unset: fp32, plus bf16 where the device has native bf16; "
        "emulated bf16 is ~10x slower than fp32)",
        action="append",
    )
    batch_size: int = setting(500, "users per step")
    users: int = setting(136_677, "training users (ML-20M's)")
    items: int = setting(ML20M_ITEMS, "items")
    nnz: int = setting(10_000_000, "interactions")
    steps: int = setting(30, "timed steps")
    warmup: int = setting(5, "untimed steps first")
    cuda_graphs: bool = setting(
        True,
        "on a GPU, time the step as training replays it, one CUDA graph per phase (not fp16); "
        "false: the eager step, with its breakdown",
    )


@dataclass
class BenchInfer(Scoring):
    target: str = setting(
        str(ML20M_ITEMS),
        "a run directory, or a number of items for a fresh model",
        flag="target",
        nargs="?",
    )
    batch_size: list[int] = setting(
        help="users per call; repeat for several", factory=lambda: [1, 1024], action="append"
    )
    precision: Literal["auto", ServingPrecision] = setting(
        "auto",
        "auto: bf16 where the device has native bf16, else fp32 (not timed, unlike serve's "
        "auto); the others as serve --precision",
    )
    history: int = setting(50, "items per user history")
    seconds: float = setting(3.0, "time per batch size")


@dataclass
class BenchEval(Compute):
    users: int = setting(10_000, "held-out users")
    items: int = setting(ML20M_ITEMS, "items")
    history: int = setting(50, "items per user")
    batch_size: int = setting(2000, "users per batch")


# -- demo ---------------------------------------------------------------------------------------
def cmd_demo(a) -> int:
    from vaecf.demo import run_demo

    s = from_args(DemoSettings, a)
    run_demo(
        out=Path(s.out) if s.out else home() / "demo",
        epochs=s.epochs,
        n_users=s.users,
        n_items=s.items,
        seed=s.seed,
    )
    return 0


# -- bench --------------------------------------------------------------------------------------
def cmd_bench(a) -> int:
    from vaecf.bench import hardware
    from vaecf.bench import speed as bench

    s = from_args({"train": BenchTrain, "infer": BenchInfer, "eval": BenchEval}[a.what], a)
    if a.what == "train":
        res = [
            bench.bench_train(
                p,
                s.batch_size,
                s.users,
                s.items,
                s.nnz,
                s.steps,
                s.warmup,
                s.device,
                s.model,
                progress=not a.json,
                cuda_graphs=s.cuda_graphs,
            )
            for p in s.precision or bench.default_precisions(s.device)
        ]
        if a.json:
            print_json([r.to_dict() for r in res])
        else:
            print(format_train(res))
            print_rooflines(s, res)
        return 0
    if a.what == "eval":
        r = bench.bench_eval(s.items, s.users, s.history, s.batch_size, s.precision, s.device)
        if a.json:
            print_json(r)
        else:
            print(
                f"full evaluation of {r['users']:,} held-out users x {r['items']:,} items "
                f"({r['precision']}, batch {r['batch_size']}): {r['seconds']:.2f} s, "
                f"{r['users_per_s']:,.0f} users/s"
            )
        return 0
    target = s.target if not s.target.isdigit() else int(s.target)
    rows = bench.bench_infer(
        target, s.batch_size, s.precision, s.device, s.history, s.seconds, progress=not a.json
    )
    if a.json:
        print_json(rows)
    else:
        from vaecf import precision as prec
        from vaecf.bench import roofline

        cpu = prec.resolve_device(s.device).type == "cpu"
        print(format_infer(rows, roofline.read_bandwidth() if cpu else None, roofline.INT8_GOAL))
        if cpu:
            print(hardware.machine())
    return 0


def print_rooflines(s, results) -> None:
    """On a CPU, each Mult-VAE/DAE step (fp32, and bf16 where native) against its dense
    products at this CPU's best rate."""
    from vaecf import models
    from vaecf import precision as prec
    from vaecf.bench import hardware, roofline

    dev = prec.resolve_device(s.device)
    if dev.type != "cpu" or s.model not in ("multvae", "multdae"):
        return
    net = models.build(s.model, s.items)
    for r in results:
        if r.precision != "fp32" and not (r.precision == "bf16" and prec.native_bf16(dev)):
            continue  # no goal where bf16 is emulated (its products alone take minutes)
        rows = roofline.products(net, r.batch_size, r.precision)
        print(roofline.format_step(r.step_ms, r.precision, r.batch_size, rows))
    print(hardware.machine())


def register(sub) -> None:
    from vaecf.config.specs import SPECS

    pd = sub.add_parser(
        "demo",
        help="generate the built-in dataset, train, show results",
        description="Generate a synthetic dataset with planted taste groups, "
        "prepare it, train Mult-VAE, compare with popularity and recommend.",
    )
    add_settings(pd, DemoSettings)
    pd.set_defaults(fn=cmd_demo)

    pb = sub.add_parser("bench", help="training throughput and inference latency benchmarks")
    bsub = pb.add_subparsers(dest="what", required=True, metavar="WHAT")
    bt = bsub.add_parser(
        "train",
        help="users/s, GFLOP/s and step breakdown on a synthetic dataset (default: ML-20M's shape)",
    )
    add_settings(bt, BenchTrain)["model"].choices = [
        n for n, m in SPECS.items() if not m.closed_form
    ]
    bi = bsub.add_parser("infer", help="latency percentiles and throughput of recommending")
    add_settings(bi, BenchInfer)
    be = bsub.add_parser(
        "eval", help="seconds for one full validation pass (fold-in, mask, top-100, metrics)"
    )
    add_settings(be, BenchEval)
    for p in (bt, bi, be):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(fn=cmd_bench)


def format_train(results) -> str:
    head = (
        f"{'precision':>9s} {'batch':>6s} {'users/s':>9s} {'step ms':>8s} {'GFLOP/s':>8s}  "
        "first layer  breakdown ms (batch / forward / backward / optimizer)"
    )
    lines = [head]
    for r in results:
        b = r.breakdown_ms
        parts = (
            f"CUDA graphs (gather, forward, backward, optimizer) {b['graph']:.1f}"
            if "graph" in b
            else f"{b['batch']:.1f} / {b['forward']:.1f} / {b['backward']:.1f} / "
            f"{b['optimizer']:.1f}"
        )
        lines.append(
            f"{r.precision:>9s} {r.batch_size:6d} {r.users_per_s:9.0f} {r.step_ms:8.1f} "
            f"{r.gflops:8.1f}  {r.first_layer:>11s}  {parts}"
        )
    return "\n".join(lines)


def format_infer(
    rows: list[dict], bandwidth: float | None = None, goal: float | None = None
) -> str:
    """The latency table; with `bandwidth` (bytes/s read from memory) also each p99 over the
    time to read the output layer once at that rate (int8's goal: <= `goal`)."""
    lines = [
        f"{'batch':>6s} {'precision':>9s} {'users/s':>10s} {'mean ms':>8s} {'p50':>7s} "
        f"{'p90':>7s} {'p95':>7s} {'p99':>7s}" + ("  p99 / read output layer" if bandwidth else "")
    ]
    for r in rows:
        line = (
            f"{r['batch_size']:6d} {r['precision']:>9s} {r['users_per_s']:10.0f} "
            f"{r['mean_ms']:8.3f} {r['p50_ms']:7.3f} {r['p90_ms']:7.3f} "
            f"{r['p95_ms']:7.3f} {r['p99_ms']:7.3f}"
        )
        if bandwidth and r.get("output_layer_bytes") and r["batch_size"] == 1:
            mib = r["output_layer_bytes"] / 2**20
            read_ms = r["output_layer_bytes"] / bandwidth * 1e3
            line += f"  {r['p99_ms'] / read_ms:.2f} ({mib:.1f} MiB in {read_ms:.3f} ms)"
        lines.append(line)
    if bandwidth:
        aim = "" if goal is None else f"; int8 goal at batch 1: p99 <= {goal:g} x that read"
        lines.append(f"memory read at {bandwidth / 1e9:.1f} GB/s{aim}")
    return "\n".join(lines)
