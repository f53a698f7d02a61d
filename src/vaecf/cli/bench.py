"""bench and demo."""

from __future__ import annotations

from pathlib import Path

from vaecf.cli.common import home, print_json
from vaecf.cli.options import _bool


# -- demo ---------------------------------------------------------------------------------------
def cmd_demo(a) -> int:
    from vaecf.demo import run_demo

    run_demo(
        out=Path(a.out) if a.out else home() / "demo",
        epochs=a.epochs,
        n_users=a.users,
        n_items=a.items,
        seed=a.seed,
    )
    return 0


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
                cuda_graphs=a.cuda_graphs,
            )
            for p in a.precision or bench.default_precisions(a.device)
        ]
        if a.json:
            print_json([r.to_dict() for r in res])
        else:
            print(bench.format_train(res))
        return 0
    if a.what == "eval":
        r = bench.bench_eval(a.items, a.users, a.history, a.batch_size, a.precision, a.device)
        if a.json:
            print_json(r)
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
    bt.add_argument(
        "--model",
        choices=[n for n, m in SPECS.items() if not m.closed_form],
        default="multvae",
        help="gradient model to time (default multvae)",
    )
    bt.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    bt.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    bt.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    bt.add_argument(
        "--cuda-graphs",
        type=_bool,
        default=True,
        metavar="true|false",
        help="on a GPU, time the step as training replays it, one CUDA graph per phase (not "
        "fp16; default true); false: the eager step, with its breakdown",
    )
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
        choices=["auto", "fp32", "bf16", "fp16", "int8"],
        default="auto",
        help="auto (default): bf16 where the device has native bf16, else fp32; int8: "
        "item-sized layers in int8 with per-item scales",
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
