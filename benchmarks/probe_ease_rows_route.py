"""Probe: an EASE update by the rows that changed against X^T X and the solve, on ML-1M by time,
80% -> all (1,277 rows added, 298 removed, 3,468 items): is the flops rule (the update's
2 n^2 r + n r^2 against the solve's n^3) too strict? Interleaved rounds of the update with the
rule lifted, the update as it is (the solve) and a retrain; the fit's own seconds and the whole
call's.

    python benchmarks/probe_ease_rows_route.py
"""

from __future__ import annotations

import inspect
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import update as update_bench  # noqa: E402

import vaecf  # noqa: E402
import vaecf.models.linear_update as lu  # noqa: E402
from vaecf.bench import hardware  # noqa: E402
from vaecf.training.update import update  # noqa: E402


def main() -> int:
    print(hardware.machine())
    rule = "2 * n * n * r + n * r * r > n**3 or "
    code = textwrap.dedent(inspect.getsource(lu.Inverse.updated))
    assert rule in code, "the rule is not where this probe looks for it"
    ns = dict(vars(lu))
    exec(code.replace(rule, ""), ns)  # noqa: S102 (the method without its rule)
    routes = {"rows": ns["updated"], "solve": lu.Inverse.updated}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        df = update_bench.read(update_bench.ML1M)
        old = update_bench.prepared(df, 0.8, tmp / "old")
        new = update_bench.prepared(df, 1.0, tmp / "new")
        cfg = vaecf.TrainConfig(progress=False)
        vaecf.train(old, cfg, tmp / "run", model="ease")
        wall = {k: [] for k in (*routes, "retrain")}
        fit = {k: [] for k in routes}
        for i in range(3):
            for name in wall:
                t0 = time.perf_counter()
                if name == "retrain":
                    vaecf.train(new, cfg, tmp / f"retrain{i}", model="ease")
                else:
                    lu.Inverse.updated = routes[name]
                    res = update(tmp / "run", new, tmp / f"{name}{i}", progress=False)
                    fit[name].append(res.history[0]["seconds"])
                wall[name].append(time.perf_counter() - t0)
        lu.Inverse.updated = routes["solve"]
    print("| route | fit s | whole call s (median) |")
    print("|---|---|---:|")
    for name, ts in wall.items():
        fits = " / ".join(f"{s:.2f}" for s in fit.get(name, []))
        print(f"| {name} | {fits or '-'} | {statistics.median(ts):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
