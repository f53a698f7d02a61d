"""Crash, corruption and abuse drills: break vaecf on purpose many times and count what was lost.

The test suite runs a small share of the same drills (tests/test_drills.py,
tests/data/test_fuzz_parsers.py); the drill kit is benchmarks/drillkit/ and benchmarks/fuzzkit.py.

- kill: `vaecf prepare` / `train` / `score` / `tune` / `compare` / `export` SIGKILLed at random
  moments (1-2 per trial), then rerun (`--resume` for train and tune); the output must be the old
  or the complete new state after each kill, and the rerun must reach the uninterrupted result
  (train: best.pt/last.pt weights bit for bit; tune: no finished trial lost or repeated, every
  value what retraining its parameters gives; export: the ONNX file byte for byte, and it loads,
  passes onnx.checker and runs in onnxruntime). `vaecf serve` SIGKILLed during start-up, while
  answering and during a reload: both run directories unchanged, a restart answers the same.
- disk full: the same verbs writing into a tmpfs left with 0..N bytes free (root only).
- one writer: two commands into one directory at once, or the first SIGKILLed: one is refused
  naming the other's pid, or a dead writer's lock is taken over.
- fuzz: generated malformed files through every parser (a DataError naming file and line, or a
  correct parse), and a share of them through `vaecf prepare` (exit 2, one message).

    PYTHONPATH=src .venv/bin/python benchmarks/drills.py                 # the full set (~45 min)
    PYTHONPATH=src .venv/bin/python benchmarks/drills.py --quick         # a few of each
    PYTHONPATH=src .venv/bin/python benchmarks/drills.py --only kill --seed 7
    PYTHONPATH=src .venv/bin/python benchmarks/drills.py --only tune --only serve  # 2 verbs
    PYTHONPATH=src .venv/bin/python benchmarks/drills.py --only fuzz --parsers csv --fuzz 3
"""

from __future__ import annotations

import argparse
import io
import random
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import drillkit as dk  # the kits beside this script (tests/test_drills.py and
import fuzzkit as fk  # tests/data/test_fuzz_parsers.py import them as benchmarks.*)

ROOT = Path(__file__).resolve().parents[1]

KILL_VERBS = ("prepare", "train", "score", "tune", "compare", "serve", "export", "score-table")
CLI_DATASET = {  # parser -> the `vaecf prepare` verb that reads it
    "csv": "csv",
    "tsv": "csv",
    "parquet": "csv",
    "movielens-csv": "ml-20m",
    "movielens-dat": "ml-1m",
    "netflix": "netflix",
    "lastfm": "lastfm-360k",
    "pinterest": "pinterest",
    "msd": "msd",
    **{name: "csv" for name in ("semicolons", "colons", "csv-gz", "csv-zip", "jsonl", "jsonl-gz")},
}


def fuzz_cli(name: str, n: int, seed: int) -> tuple[int, int, int, list[str]]:
    """`n` generated files through `vaecf prepare` (in-process `vaecf.cli.main`): (inputs,
    exit 2 with one message, failures, examples). Exit 0 (the file parsed and prepared) is fine;
    anything else, a traceback or a message of more than one line, is a failure."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from vaecf.cli import main

    case = fk.PARQUET if name == "parquet" else fk.CASES[name]
    tmp = Path(tempfile.mkdtemp(prefix="vaecf-fuzz-cli-"))
    path = tmp / case.filename
    counts = {"inputs": 0, "exit2": 0, "failures": 0}
    examples: list[str] = []
    verb = CLI_DATASET[name]

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(fk.parquet_frames() if name == "parquet" else fk.file_bytes(case))
    def one(x):
        counts["inputs"] += 1
        if hasattr(x, "write_parquet"):
            x.write_parquet(path)
        else:
            path.write_bytes(x)
        if verb == "csv":
            sep = ["--sep", "\t"] if name == "tsv" else []
            args = ["prepare", "csv", "--path", path, "--user-col", "u", "--item-col", "i",
                    "--heldout-users", 1, "--out", tmp / "out", "--overwrite", *sep]  # fmt: skip
        else:
            args = ["prepare", verb, "--source", path, "--root", tmp / "home", "--quiet",
                    "--out", tmp / "out", "--overwrite"]  # fmt: skip
        err = io.StringIO()
        try:
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                rc = main([str(a) for a in args])
        except BaseException as e:  # noqa: BLE001 - would be a traceback
            rc, msg = None, f"{type(e).__name__}: {e}"
        else:
            msg = err.getvalue()
        lines = msg.strip().splitlines()
        if rc == 2 and len(lines) == 1 and lines[0].startswith("vaecf prepare: error:"):
            counts["exit2"] += 1
        elif rc != 0:
            counts["failures"] += 1
            if len(examples) < 3:
                examples.append(f"exit {rc}: {msg[-400:]}\ninput: {x!r}"[:700])

    hseed(seed)(one)()
    return counts["inputs"], counts["exit2"], counts["failures"], examples


def _bytes(path) -> int:
    """Bytes of a file, or of every file under a directory."""
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(_bytes(p) for p in path.iterdir())


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, help="base seed (default: random, printed)")
    ap.add_argument("--quick", action="store_true", help="a few trials of each drill")
    ap.add_argument(
        "--only",
        choices=["kill", "disk", "lock", "fuzz", *KILL_VERBS],
        action="append",
        help="a kind of drill (kill: every verb's), or one verb's kill drill",
    )
    ap.add_argument(
        "--kill-trials",
        type=int,
        default=120,
        help="per verb (1-2 kills each; 120 gave 104-141 landed kills per verb here)",
    )
    ap.add_argument("--disk-trials", type=int, default=30, help="per verb")
    ap.add_argument("--lock-trials", type=int, default=40)
    ap.add_argument("--fuzz", type=int, default=10_000, help="generated inputs per parser")
    ap.add_argument("--fuzz-cli", type=int, default=500, help="of those, also via the CLI")
    ap.add_argument(
        "--parsers", help="the fuzz drill's parsers, comma-separated (default: every one)"
    )
    a = ap.parse_args()
    if a.quick:
        a.kill_trials, a.disk_trials, a.lock_trials, a.fuzz, a.fuzz_cli = 6, 3, 4, 200, 20
    return a


def _kill_and_lock_drills(only: set, work: Path, runner, a, seed: int) -> list:
    drills = {
        "prepare": dk.PrepareDrill(),
        "train": dk.TrainDrill(epochs=3),
        "score": dk.ScoreDrill(),
        "tune": dk.TuneDrill(),
        "compare": dk.CompareDrill(),
        "serve": dk.ServeDrill(),
        "export": dk.ExportDrill(),  # last: the other verbs keep their seeds
        "score-table": dk.ScoreTableDrill(),
    }
    for name, d in drills.items():
        if name in only or (name == "prepare" and "lock" in only):
            d.setup(work / name, runner)
    tallies = []
    for i, (name, d) in enumerate(drills.items()):
        if name not in only:
            continue
        if name == "serve":
            tallies.append(dk.serve_drill(d, runner, a.kill_trials, seed + i))
        else:
            tallies.append(dk.kill_drill(d, runner, a.kill_trials, seed + i))
        print(dk.format_table(tallies[-1:]).splitlines()[-1], flush=True)
        for n in tallies[-1].notes[:3]:
            print(f"\n[{tallies[-1].drill}] {n[:3000]}", flush=True)
    if "lock" in only:
        tallies.append(dk.lock_drill(drills["prepare"], runner, a.lock_trials, seed + 10))
    return tallies


def _disk_drills(work: Path, runner, trials: int, seed: int) -> list:
    if not dk.can_mount():
        print("disk-full drills skipped: they mount a tmpfs (root on Linux only)")
        return []
    # each verb with the bytes it may need: its reference output times what it keeps beside it
    # while writing (score: its parts too; tune: a study grows as it goes)
    verbs = [
        (dk.PrepareDrill(), lambda d: 1.3 * _bytes(d.ref_b)),
        (dk.TrainDrill(epochs=2), lambda d: 1.3 * _bytes(d.ref)),
        (dk.ScoreDrill(), lambda d: 3 * _bytes(d.ref_new)),
        (dk.ExportDrill(), lambda d: 3 * _bytes(d.ref_new)),
        (dk.CompareDrill(), lambda d: 3 * _bytes(d.ref_new)),
        (dk.TuneDrill(), lambda d: 1.5 * _bytes(d.ref_new)),
    ]
    tallies = []
    for i, (d, need_of) in enumerate(verbs):
        fs = dk.Tmpfs(48 << 20)
        try:
            d.setup(work / f"disk-{d.name}", runner, out_parent=fs.path)
            d.fs = fs
            tallies.append(dk.disk_full_drill(d, runner, trials, seed + 20 + i, int(need_of(d))))
            print(dk.format_table(tallies[-1:]).splitlines()[-1], flush=True)
        finally:
            fs.close()
    return tallies


def _fuzz_drills(a, seed: int) -> None:
    print(
        "\n| parser | inputs | parsed | DataError | failures | via CLI | CLI exit 2 "
        "| CLI failures |\n|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    notes = []
    for i, name in enumerate([*fk.CASES, "parquet"]):
        if a.parsers and name not in a.parsers.split(","):
            continue
        t = fk.fuzz(name, a.fuzz, seed + 100 + i)
        ci, c2, cf, ex = fuzz_cli(name, a.fuzz_cli, seed + 200 + i)
        print(
            f"| {name} | {t.inputs} | {t.parsed} | {t.rejected} | {t.failures} | {ci} "
            f"| {c2} | {cf} |",
            flush=True,
        )
        notes += [f"[{name}] {e}" for e in t.examples + ex]
    for n in notes[:10]:
        print("\n" + n)


def main() -> int:
    a = _args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**6)
    only = set(a.only or ["kill", "disk", "lock", "fuzz"])
    if "kill" in only:
        only |= set(KILL_VERBS)
    print(f"drills: seed {seed} (rerun with --seed {seed})", flush=True)
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="vaecf-drills-"))
    # the fork server the kill, lock and disk drills run their commands from (the fuzz drill
    # calls the parsers in this process)
    runner = dk.ForkRunner(work / "logs") if only - {"fuzz"} else None
    try:
        tallies = _kill_and_lock_drills(only, work, runner, a, seed)
        if "disk" in only:
            tallies += _disk_drills(work, runner, a.disk_trials, seed)
    finally:
        if runner is not None:
            runner.close()
    if tallies:
        print()
        print(dk.format_table(tallies))
        for t in tallies:
            if t.refused:
                print(f"\n{t.drill}: one writer refused with the other's pid in {t.refused} trials")
        for t in tallies:
            for n in t.notes[:3]:
                print(f"\n[{t.drill}] {n[:1500]}")
    if "fuzz" in only:
        _fuzz_drills(a, seed)
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
