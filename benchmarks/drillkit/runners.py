"""Child processes of drill commands: `vaecf ARGV` started, waited for, killed.

`ForkRunner` forks each child from a server process that imported vaecf and torch once, so a
trial costs the work itself and not ~2.5 s of imports; `ExecRunner` starts `python -m vaecf` for
every command. Both start a command (`start`, a `Proc`) and wait for its exit status (`wait`);
`run`, `run_ok` and `kill_after` build on them, and `timed` measures a command for set-ups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .outputs import clear

SRC = Path(__file__).resolve().parents[2] / "src"


_SERVER = r"""
import json, os, sys, traceback
for name in sys.argv[1:]:
    try:
        __import__(name.lstrip("?"))
    except ImportError:
        if not name.startswith("?"):  # ?name: optional (an extra that may not be installed)
            raise
out = sys.stdout
def reply(obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()
reply({"ready": os.getpid()})
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "wait":
        _, status = os.waitpid(req["pid"], 0)
        reply({"rc": os.waitstatus_to_exitcode(status)})
        continue
    pid = os.fork()
    if pid:
        reply({"pid": pid})
        continue
    rc = 1
    try:
        os.chdir(req["cwd"])
        os.environ.update(req["env"])
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            f = os.open(name, flags, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = ["vaecf", *req["argv"]]
        from vaecf.cli import main
        rc = main(req["argv"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
"""


@dataclass
class Proc:
    pid: int
    stdout: Path
    stderr: Path
    started: float


@dataclass
class Result:
    argv: list[str]
    rc: int  # negative: killed by that signal
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"vaecf {' '.join(self.argv)} -> {self.rc}\n--- stdout\n{self.stdout[-2000:]}\n"
            f"--- stderr\n{self.stderr[-2000:]}"
        )


def drill_env(extra: dict | None = None) -> dict:
    """The environment of drill commands: this tree's vaecf, one thread, no progress bars."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", POLARS_MAX_THREADS="1")
    env.update(PYTHONDONTWRITEBYTECODE="1", **(extra or {}))
    return env


class ForkRunner:
    """Runs `vaecf ARGV` in children forked from one pre-imported server process."""

    preload = (
        "vaecf.cli",
        "vaecf.data.prepare",
        "vaecf.training.single",
        "vaecf.storage.checkpoint",
        "torch._dynamo",
        "?optuna",
        "?matplotlib.pyplot",
        "?vaecf.serve.app",
        "?uvicorn",
    )

    def __init__(self, logdir: Path, env: dict | None = None):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, *self.preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env or drill_env(),
        )
        self._ask(None)  # ready
        self.n = 0

    def _ask(self, req: dict | None) -> dict:
        if req is not None:
            self.server.stdin.write(json.dumps(req) + "\n")
            self.server.stdin.flush()
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError("the drill fork server died")
        return json.loads(line)

    def start(self, argv: Sequence, env: dict | None = None) -> Proc:
        self.n += 1
        out, err = self.logdir / f"{self.n}.out", self.logdir / f"{self.n}.err"
        req = {
            "op": "start",
            "argv": [str(a) for a in argv],
            "cwd": str(self.logdir),
            "env": env or {},
            "stdout": str(out),
            "stderr": str(err),
        }
        return Proc(self._ask(req)["pid"], out, err, time.perf_counter())

    def wait(self, proc: Proc) -> int:
        return self._ask({"op": "wait", "pid": proc.pid})["rc"]

    def close(self) -> None:
        if self.server.poll() is None:
            self.server.stdin.close()
            self.server.wait(10)


class ExecRunner:
    """Runs `python -m vaecf ARGV` as a fresh process (imports included in its life)."""

    def __init__(self, logdir: Path, env: dict | None = None):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.env = env or drill_env()
        self.n = 0
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, argv: Sequence, env: dict | None = None) -> Proc:
        self.n += 1
        out, err = self.logdir / f"{self.n}.out", self.logdir / f"{self.n}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            p = subprocess.Popen(
                [sys.executable, "-m", "vaecf", *map(str, argv)],
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                env={**self.env, **(env or {})},
                cwd=self.logdir,
            )
        self.procs[p.pid] = p
        return Proc(p.pid, out, err, time.perf_counter())

    def wait(self, proc: Proc) -> int:
        return self.procs.pop(proc.pid).wait()

    def close(self) -> None:
        pass


def read_output(path: Path) -> str:
    """A child's captured output ('' when it was killed before it opened the file)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def run(runner, argv: Sequence, env: dict | None = None) -> Result:
    p = runner.start(argv, env)
    rc = runner.wait(p)
    return Result([str(a) for a in argv], rc, read_output(p.stdout), read_output(p.stderr))


def run_ok(runner, argv: Sequence, env: dict | None = None) -> Result:
    """`run`, for a drill's own set-up: a command that fails there is a RuntimeError."""
    r = run(runner, argv, env)
    if r.rc:
        raise RuntimeError(str(r))
    return r


def prepare_synthetic(runner, root: Path, n_users: int, n_items: int, seed: int, heldout: int):
    """A drill's input: synthetic interactions (4 groups) in ROOT/inputs/train.csv, prepared by
    `vaecf prepare csv` into ROOT/data; returns (the data directory, the interactions)."""
    from vaecf.data.synthetic import generate

    (root / "inputs").mkdir(parents=True, exist_ok=True)
    csv, data = root / "inputs" / "train.csv", root / "data"
    df = generate(n_users=n_users, n_items=n_items, n_groups=4, seed=seed)
    df.write_csv(csv)
    run_ok(runner, [
        "prepare", "csv", "--path", csv, "--user-col", "user_id", "--item-col", "item_id",
        "--heldout-users", heldout, "--out", data,
    ])  # fmt: skip
    return data, df


def kill_after(runner, argv: Sequence, delay: float) -> Result:
    """Start `vaecf ARGV`, SIGKILL it `delay` seconds later (unless it finished), wait for it."""
    p = runner.start(argv)
    time.sleep(max(0.0, delay - (time.perf_counter() - p.started)))
    try:
        os.kill(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    rc = runner.wait(p)
    return Result([str(a) for a in argv], rc, read_output(p.stdout), read_output(p.stderr))


class suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is ProcessLookupError


def timed(runner, argv: list, out: Path) -> float:
    """Seconds `vaecf ARGV` takes writing a fresh `out` (removed again): a second timing, since
    one taken while the machine is busy would put most kill moments after the command's end."""
    clear(out)
    t0 = time.perf_counter()
    run_ok(runner, argv)
    took = time.perf_counter() - t0
    clear(out)
    return took
