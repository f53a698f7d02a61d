"""bench and demo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vaecf.cli.common import home, print_json
from vaecf.cli.options import add_settings, from_args
from vaecf.settings import Compute, ModelChoice, Scoring, ServingPrecision, TrainPrecision, setting

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
        "auto", "auto: bf16 where the device has native bf16, else fp32; as serve --precision"
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
    from vaecf import bench

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
            print(bench.format_train(res))
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
        print(bench.format_infer(rows))
    return 0


def register(sub) -> None:
    from vaecf.specs import SPECS

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
