"""benchmarks/ is a bench: every script there runs here on tiny sizes, so that a refactor cannot
break one silently; each answers `--help` under a one-line purpose (its docstring's first line);
none imports a private name from vaecf; and a file that is neither smoke-run nor exempt, with a
reason, fails the suite.

The scripts run as children forked from one server process that imported torch, vaecf and the
libraries they share once (each child is a separate process: its own `sys.argv`, `__main__`,
working directory and exit status), two at a time, so the suite pays the imports once rather than
once a script. A script's own subprocesses (`vaecf serve`, `vaecf compare`, ...) start as usual.
Speed is never checked here: the figures live in benchmarks/README.md.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> its smoke runs, each (what its output must hold, so that the path it was meant to
# take ran to its end; its arguments: tiny sizes, CPU, "{tmp}" the run's own directory)
SMOKE: dict[str, list[tuple[str, str]]] = {
    "accuracy.py": [
        (
            "per-seed test NDCG@100",
            "--data {tmp}/ml --seeds 1 --precision fp32 --contender pop popular "
            "--contender ease ease",
        )
    ],
    "accuracy_compare.py": [
        (
            "| popular |",
            "--out {tmp}/out --datasets demo --models popular --seeds 1 --demo-users 300 "
            "--demo-items 60",
        )
    ],
    "catalogue_scale.py": [
        (
            "score popular",
            "--out {tmp}/out --users 300 --items 100 --groups 5 --mean-items 8 "
            "--heldout-users 30 --models popular",
        )
    ],
    "dense_solve.py": [("| torch |", "--items 300 --dtype float64")],
    "update.py": [
        (
            "| ease |",
            "--source {tmp}/ml/ratings.csv --models ease --drift-models ease --rounds 2 "
            "--budget 10",
        )
    ],
    "explain_latency.py": [("| multvae | 10 |", "--items 300 --requests 4 --histories 10")],
    "temporal.py": [
        (
            "coverage@10",
            "--data ml-latest-small --source {tmp}/ml --models popular,ease --budget 5",
        )
    ],
    "drills.py": [("| csv | 3 |", "--only fuzz --parsers csv --fuzz 3 --fuzz-cli 1")],
    "early_stopping.py": [
        (
            "| demo (1 splits) | multvae | 2 |",
            "--out {tmp}/out --datasets demo --seeds 1 --epochs 3 --patience 2",
        )
    ],
    "fit_budget.py": [("| demo | 1 |", "--datasets demo --seeds 1 --budget 4")],
    "ease_scale.py": [("total s", "--items 200 --users 300 --nnz 3000 --model edlae")],
    "infae_nystrom.py": [
        (
            "| infae-sample |",
            "--out {tmp}/out --users 300 --items 60 --mean-items 8 --heldout 30 --max-users 50 "
            "--models infae,infae-sample",
        )
    ],
    "infae_scale.py": [("| 200 |", "--users 200 --items 100")],
    "linear_search.py": [
        ("| EDLAE fast |", "--items 300 --users 400 --heldout 40 --coarse-items 50"),
        ("| float64 |", "--solve-only 200"),
        ("| 1 | 20 |", "--items 300 --users 400 --heldout 40 --spin 28,20"),
    ],
    "matmul.py": [("softmax sweep", "--items 300 --batch 20 --reps 1")],
    "prepare.py": [
        (
            "pandas notebook",
            "--rows 40000 --netflix-rows 0 --heldout-users 100 --workdir {tmp}/work",
        )
    ],
    "read_formats.py": [("| jsonl.gz | memory |", "--records 3000 --workdir {tmp}/work")],
    "profile_step.py": [
        (
            "synchronisations",
            "--users 300 --items 200 --nnz 3000 --batch-size 50 --steps 2 --rows 3",
        )
    ],
    "run_time.py": [
        (
            "300x200 size",
            '--datasets "" --synthetic 300,200,3000,30 --epochs 1 --precision fp32 --device cpu',
        )
    ],
    "score_scale.py": [
        ("users/s", "--users 100 --items 200 --precision fp32 --workdir {tmp}/work")
    ],
    "score_memory.py": [
        ("vs first", "--users 300,600 --items 100 --per-user 5 --file --workdir {tmp}/work")
    ],
    "serve_hostile.py": [
        (
            "run directory unchanged: True",
            "--items 200 --duration 0.3 --flood 1 --slow-heads 1 --recommenders 1 --drip 0.1 "
            "--head-timeout 0.2",
        )
    ],
    "probe_b500_parts.py": [
        (
            "eager kernels beside a replay",
            "--device cpu --users 3000 --items 200 --nnz 30000 --replays 2 --precision fp32 "
            "--kernel bag",
        )
    ],
    "first_layer.py": [
        ("bag", "--users 300 --items 200 --nnz 3000 --batch-size 50 --precision fp32 --hidden 8")
    ],
    "softmax_kernels.py": [
        (
            "| 50 | fp32 |",
            "--device cpu --users 300 --items 200 --nnz 3000 --batch-size 50 --precision fp32 "
            "--steps 2 --rounds 1",
        )
    ],
    "output_layer.py": [
        (
            "products ms",
            "--users 300 --items 200 --nnz 3000 --batch-size 50 --precision fp32 --hidden 8",
        )
    ],
    "serve_latency.py": [("own layers", "--items 100 --requests 5 --rounds 1 --warmup 5")],
    "serve_load.py": [
        (
            "| micro-batching | 2 |",
            "--items 100 --duration 0.3 --concurrency 2 --modes batched --max-requests 50",
        )
    ],
    "serving_memory.py": [("| int8 |", "--items 100 --precisions int8")],
    "serving_precision.py": [
        ("untrained 200 items", "--items 200 --rounds 1 --seconds 0.1 --users 10")
    ],
    "sparse_solve_time.py": [("| this tree |", "--users 400 --items 150 --rounds 1")],
    "train_items.py": [
        (
            "recvae",
            "--device cpu --items 200 --users 300 --nnz 3000 --models multvae,recvae "
            "--precisions fp32 --steps 1 --warmup 1",
        )
    ],
    "train_speed.py": [
        (
            "multvae (fp32)",
            "--users 300 --items 200 --nnz 3000 --batch-size 50 --steps 2 --rounds 1 "
            "--precision fp32",
        )
    ],
}
# files not run here, each with the reason
EXEMPT = {
    "README.md": "the results document, not a script",
    "gpu_kit.sh": "downloads wheels from the package registry for a GPU lend; its bash syntax "
    "is checked instead",
    "gpu.sh": "drives the scripts above on a CUDA GPU (nvidia-smi, CUDA tests); its bash syntax is "
    "checked instead",
    "drillkit/": "the kit of drills.py (and tests/test_drills.py), a package run through drills.py",
    "fuzzkit.py": "the kit of drills.py's fuzzing (and tests/data/test_fuzz_parsers.py), run "
    "through drills.py",
    "serve_client.py": "the server and client that serve_load.py and serve_hostile.py import, "
    "run through their smoke runs",
}
PRELOAD = (
    "numpy",
    "scipy.sparse",
    "polars",
    "torch",
    "torch._dynamo",
    "torch.profiler",
    "httpx",
    "hypothesis",
    "vaecf",
    "vaecf.bench.speed",
    "vaecf.cli",
    "vaecf.training.single",
    "vaecf.data.prepare",
    "vaecf.data.synthetic",
    "vaecf.recommender",
    "vaecf.serve.fixtures",
)
TIMEOUT_S = 240  # one run at most; a hung server or client fails its test, not the suite
PARALLEL = 2

# Imports the modules once, then forks a child per request: {"script", "argv", "cwd", "out",
# "timeout"} -> {"pid"}; {"wait": true} -> the next finished child's {"pid", "rc", "seconds"}.
# A child leads its own process group, killed with it when it ends (a server it left behind)
# or runs past its time.
_SERVER = r"""
import json, os, runpy, signal, sys, time, traceback
for name in sys.argv[1:]:
    try:
        __import__(name)
    except ImportError:
        pass
print(json.dumps({"ready": True}), flush=True)
running = {}

def child(req):
    os.setsid()
    fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(req["cwd"])
    sys.argv = [req["script"], *req["argv"]]
    sys.path[0] = os.path.dirname(req["script"])
    code = 0
    try:
        runpy.run_path(req["script"], run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

def reap():
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            start, _, timed_out = running.pop(pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            rc = os.waitstatus_to_exitcode(status)
            return {"pid": pid, "rc": rc, "seconds": time.monotonic() - start,
                    "timed_out": timed_out}
        now = time.monotonic()
        for p, (start, limit, timed_out) in list(running.items()):
            if not timed_out and now - start > limit:
                running[p] = (start, limit, True)
                try:
                    os.killpg(p, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.05)

for line in sys.stdin:
    req = json.loads(line)
    if req.get("wait"):
        print(json.dumps(reap()), flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        child(req)
    running[pid] = (time.monotonic(), req["timeout"], False)
    print(json.dumps({"pid": pid}), flush=True)
"""


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in EXEMPT)


def jobs() -> list[tuple[str, str, list[str], str]]:
    """(id, script, argv, expected output) of every run: each script's --help (its one-line
    purpose expected), then its smoke runs."""
    out = []
    for name in scripts():
        doc = ast.get_docstring(ast.parse((BENCH / name).read_text())) or ""
        out.append((f"help:{name}", name, ["--help"], doc.partition("\n")[0]))
    for name, runs in SMOKE.items():
        for i, (expect, args) in enumerate(runs):
            job = f"smoke:{name}" + (f":{i}" if i else "")
            out.append((job, name, shlex.split(args), expect))
    return out


def tiny_ratings(path: Path) -> None:
    """A MovieLens `ratings.csv` of 200 users x 40 movies, 12 ratings each (accuracy.py's)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = ["userId,movieId,rating,timestamp"]
    for u in range(1, 201):
        for j in range(12):
            lines.append(f"{u},{(u * 7 + j * 3) % 40 + 1},{4 + (u + j) % 2}.0,{10**9 + j}")
    (path / "ratings.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, dict]:
    """Runs every job this session selected, PARALLEL at a time, in children of one fork
    server; {id: {"rc", "seconds", "timed_out", "output"}}."""
    wanted = {
        item.callspec.params["job"]
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and "job" in item.callspec.params
    }
    todo = [j for j in jobs() if j[0] in wanted]
    # the longest first, so that two at a time finish together
    slow = ("serve_", "accuracy_compare", "catalogue", "run_time", "prepare", "score_")
    slow += ("serving_memory", "sparse_solve_time", "infae_scale")  # each starts a process
    todo.sort(key=lambda j: (j[0].startswith("help"), not j[1].startswith(slow)))
    base = tmp_path_factory.mktemp("bench")
    env = {
        **os.environ,
        "COLUMNS": "200",  # argparse wraps --help at this width
        "VAECF_HOME": str(base / "home"),
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(base),  # what a script leaves in a temporary directory goes with the test's
        # one thread each: tiny sizes gain nothing from more, and two scripts share the cores
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, *PRELOAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=base,
    )

    def ask(req: dict) -> dict:
        server.stdin.write(json.dumps(req) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark fork server died")
        return json.loads(line)

    results: dict[str, dict] = {}
    t0 = time.monotonic()
    try:
        assert json.loads(server.stdout.readline())["ready"]
        pids: dict[int, tuple[str, Path]] = {}
        queue = list(todo)
        while queue or pids:
            while queue and len(pids) < PARALLEL:
                job, name, argv, _ = queue.pop(0)
                tmp = base / job.replace(":", "-")
                tmp.mkdir()
                if name in ("accuracy.py", "temporal.py", "update.py") and job.startswith("smoke"):
                    tiny_ratings(tmp / "ml")
                out = tmp / "output.txt"
                req = {
                    "script": str(BENCH / name),
                    "argv": [a.replace("{tmp}", str(tmp)) for a in argv],
                    "cwd": str(tmp),
                    "out": str(out),
                    "timeout": TIMEOUT_S,
                }
                pids[ask(req)["pid"]] = (job, out)
            done = ask({"wait": True})
            job, out = pids.pop(done["pid"])
            results[job] = {**done, "output": out.read_text(errors="replace")}
    finally:
        server.stdin.close()
        server.wait(30)
    total = time.monotonic() - t0
    print(f"\nbenchmarks: {len(results)} runs in {total:.1f} s")
    for job, r in sorted(results.items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"  {r['seconds']:6.1f} s  {job}")
    return results


@pytest.mark.parametrize("job", [j[0] for j in jobs()])
def test_benchmark_runs(job, runs):
    r = runs[job]
    expect = next(j[3] for j in jobs() if j[0] == job)
    tail = r["output"][-4000:]
    assert not r["timed_out"], f"{job} ran past {TIMEOUT_S} s:\n{tail}"
    assert r["rc"] == 0, f"{job} exited {r['rc']}:\n{tail}"
    assert expect and expect in r["output"], f"{job}: no {expect!r} in its output:\n{tail}"
    if job.startswith("help"):
        assert "usage:" in r["output"], tail


def test_every_benchmark_is_smoke_run_or_exempt():
    # a folder is a package (a kit of modules, named "name/"), never a script
    folders = [p for p in BENCH.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert all((p / "__init__.py").is_file() for p in folders), "a folder that is no package"
    files = {p.name for p in BENCH.iterdir() if p.is_file()} | {f"{p.name}/" for p in folders}
    assert not files - set(SMOKE) - set(EXEMPT), "neither smoke-run nor exempt (with a reason)"
    assert not (set(SMOKE) | set(EXEMPT)) - files, "listed here but not in benchmarks/"
    assert not set(SMOKE) & set(EXEMPT)
    assert all(reason.strip() for reason in EXEMPT.values())


@pytest.mark.parametrize("name", scripts())
def test_benchmark_states_its_purpose_in_one_line(name):
    doc = ast.get_docstring(ast.parse((BENCH / name).read_text()), clean=False)
    assert doc, f"{name} has no module docstring"
    lines = doc.splitlines()
    assert lines[0].strip() and len(lines[0]) <= 100, f"{name}: a one-line purpose first"
    assert len(lines) == 1 or not lines[1].strip(), f"{name}: its first line is one sentence"
    assert "argparse" in (BENCH / name).read_text(), f"{name}: options through argparse"


def private_vaecf_imports(source: str) -> list[str]:
    """`from vaecf... import _x`, `import vaecf._x` and `from vaecf._x import y` in a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vaecf":
            parts = node.module.split(".")
            found += [node.module for p in parts if p.startswith("_")][:1]
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "vaecf" and any(p.startswith("_") for p in parts):
                    found.append(a.name)
    return found


def test_no_benchmark_imports_a_private_name_from_vaecf():
    modules = sorted([*BENCH.glob("*.py"), *BENCH.glob("*/*.py")])  # packages' modules too
    bad = {str(p.relative_to(BENCH)): private_vaecf_imports(p.read_text()) for p in modules}
    assert not {k: v for k, v in bad.items() if v}
    # the check itself finds each form
    assert private_vaecf_imports("from vaecf.models.ease import _x, y") == ["vaecf.models.ease._x"]
    assert private_vaecf_imports("import vaecf._io") == ["vaecf._io"]
    assert private_vaecf_imports("from vaecf._io import atomic") == ["vaecf._io"]
    assert private_vaecf_imports("from vaecf.models import linear") == []


def test_gpu_scripts_are_valid_bash():
    for name in ("gpu.sh", "gpu_kit.sh"):
        subprocess.run(["bash", "-n", str(BENCH / name)], check=True)
