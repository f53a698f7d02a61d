"""Probe: `vaecf score`'s resident memory after its planning pass and after each chunk.

    python benchmarks/probe_score_planning.py --users 3200000 [--items 5000] [--model multvae]
    POLARS_MAX_THREADS=16 PYTHONPATH=POLARS133:src python benchmarks/probe_score_planning.py ...

Writes score_memory.py's interactions file (Parquet, ~10 interactions a user) and an untrained
run, then runs `vaecf score RUN --input FILE --out DIR/` in a child process whose planning pass
(`score.parts.scoring_plan`) and chunk reads (`score.reading.Scoring.chunk`) print the process's
resident set and its peak so far (GiB) as they finish; the peak at exit last.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import resource, runpy, sys
import vaecf.score.parts as parts
import vaecf.score.reading as reading

def mem():
    rss = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**30
    return f"rss {rss:.3f} peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.3f}"

plan, chunk = parts.scoring_plan, reading.Scoring.chunk
def planned(*a, **k):
    out = plan(*a, **k)
    print("after planning:", mem(), flush=True)
    return out
def chunked(self, lo, hi):
    out = chunk(self, lo, hi)
    print(f"chunk of {out[1]:,} users, {out[0].height:,} rows:", mem(), flush=True)
    return out
parts.scoring_plan, reading.Scoring.chunk = planned, chunked
sys.argv = ["vaecf", *sys.argv[1:]]
try:
    runpy.run_module("vaecf", run_name="__main__")
finally:
    print("peak at exit:", mem(), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=3_200_000)
    ap.add_argument("--items", type=int, default=5000)
    ap.add_argument("--model", default="multvae")
    ap.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from score_memory import interactions

    from vaecf.serve.fixtures import fresh_run

    work = Path(a.workdir or tempfile.mkdtemp(prefix="vaecf-score-planning-"))
    work.mkdir(parents=True, exist_ok=True)
    run = work / f"run-{a.model}-{a.items}"
    if not (run / "best.pt").exists():
        fresh_run(run, a.items, a.model)
    src = work / f"interactions-{a.users}-{a.items}-10.parquet"
    interactions(src, a.users, a.items, 10)
    out = work / "recs"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cmd = [sys.executable, "-c", CHILD, "score", str(run), "--input", str(src), "--out",
           f"{out}/", "-k", "10", "--quiet", "--precision", "fp32", "--device", "cpu"]  # fmt: skip
    subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
