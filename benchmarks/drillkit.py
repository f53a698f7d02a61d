"""Drill kit: break vaecf on purpose (SIGKILL at random points, a full disk), count what is lost.

Imported by tests/test_drills.py (a few trials) and benchmarks/drills.py (many). A verb plugs in
as a `Drill` subclass: its inputs and the state found before it runs (`reset`), the command to
break (`command`) and the one that finishes the job afterwards (`finish_command`), and what its
output holds (`state`: a comparable summary, raising `Broken` for anything unreadable).

Commands run the real CLI entry point (`vaecf.cli.main`) in a child process. `ForkRunner` forks
each child from a server process that imported vaecf and torch once, so a trial costs the work
itself and not ~2.5 s of imports; `ExecRunner` starts `python -m vaecf` for every command.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

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


def _read(path: Path) -> str:
    """A child's captured output ('' when it was killed before it opened the file)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def run(runner, argv: Sequence, env: dict | None = None) -> Result:
    p = runner.start(argv, env)
    rc = runner.wait(p)
    return Result([str(a) for a in argv], rc, _read(p.stdout), _read(p.stderr))


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
    return Result([str(a) for a in argv], rc, _read(p.stdout), _read(p.stderr))


class Broken(Exception):
    """The output holds something unreadable or inconsistent: a mixture, a partial file."""


def leftovers(directory: Path, names: Sequence[str]) -> list[str]:
    """Entries of `directory` that are temp or lock files of writes to `names`."""
    if not directory.is_dir():
        return []
    return sorted(
        p.name for p in directory.iterdir() if any(p.name.startswith(f".{n}.") for n in names)
    )


# -- drills --------------------------------------------------------------------------------------
class Drill:
    """One verb under test. Subclasses set `name` and implement the hooks below."""

    name = "?"

    def setup(self, root: Path, runner) -> None:
        """Build inputs and reference outputs (uninterrupted runs) under `root`."""

    def reset(self, trial: int) -> None:
        """Put the output back to the state found before the command (per trial)."""

    def command(self, trial: int) -> list:
        raise NotImplementedError

    def finish_command(self, trial: int) -> list:
        """What the user runs after a crash to finish the job (train: --resume)."""
        return self.command(trial)

    def state(self):
        """A comparable summary of the output; None when there is none; Broken if unreadable."""
        raise NotImplementedError

    def allowed_after_kill(self, trial: int) -> Callable[[object], bool]:
        """Which states may be found right after a kill (the old one, or the complete new)."""
        raise NotImplementedError

    def final(self, trial: int):
        """The state an uninterrupted run reaches."""
        raise NotImplementedError

    def old(self, trial: int):
        """The state before the command ran."""
        raise NotImplementedError

    def output_paths(self) -> list[Path]:
        """Where this drill writes (its directory and siblings), for leftover checks."""
        raise NotImplementedError

    def diagnose(self) -> str:
        """Why the output differs from the uninterrupted result, in words (for reports)."""
        return ""

    def check_final(self, trial: int, st) -> str | None:
        """Why the state after the finishing command is not what an uninterrupted run reaches
        (None: it is). By default the two must be equal."""
        return None if st == self.final(trial) else f"state differs: {self.diagnose()}"

    duration = 1.0  # seconds an uninterrupted command takes (measured in setup)


@dataclass
class Tally:
    """Outcome counts of one drill. A trial fails when any check fails; it lost data when a
    kill left an unreadable file under a final name or a mixture of states, or it ended with
    the output holding neither the state before it nor the uninterrupted result."""

    drill: str
    trials: int = 0
    points: int = 0  # kills (or fills) applied; kill drills: kills that found it running
    failures: int = 0
    lost: int = 0
    refused: int = 0  # lock drill: trials where one writer was refused (the lock at work)
    notes: list[str] = field(default_factory=list)

    def row(self) -> tuple:
        return (self.drill, self.trials, self.points, self.failures, self.lost)


def _safe_state(drill: Drill):
    try:
        return drill.state(), None
    except Broken as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - anything unreadable is a finding
        return None, f"{type(e).__name__}: {e}"


def kill_drill(
    drill: Drill, runner, trials: int, seed: int, max_kills: int = 2, log=print
) -> Tally:
    """`trials` times: reset, then 1..max_kills runs each SIGKILLed at a random moment of its
    life, checking after each that the output is the old state or the complete new one; then the
    finishing command, which must reach exactly the uninterrupted result."""
    rng = random.Random(seed)
    log(f"kill drill {drill.name}: seed {seed} ({trials} trials)")
    t = Tally(f"kill {drill.name}")
    for trial in range(trials):
        drill.reset(trial)
        failed = lost = False
        argv = drill.command(trial)
        for k in range(rng.randint(1, max_kills)):
            delay = rng.uniform(0.0, drill.duration * 1.1)
            r = kill_after(runner, argv, delay)
            t.points += r.rc == -signal.SIGKILL  # not a command that ended before its moment
            if r.rc not in (-signal.SIGKILL, 0):
                failed = True
                t.notes.append(f"trial {trial} kill {k} at {delay:.3f}s: exit {r.rc}\n{r}")
            st, err = _safe_state(drill)
            if err is not None or not drill.allowed_after_kill(trial)(st):
                failed = lost = True
                t.notes.append(f"trial {trial} kill {k} at {delay:.3f}s: {err or st}")
            argv = drill.finish_command(trial)
        r = run(runner, drill.finish_command(trial))
        st, err = _safe_state(drill)
        why = err if err is not None else drill.check_final(trial, st)
        if r.rc != 0 or why is not None:
            failed = True
            lost = lost or err is not None or (why is not None and st != drill.old(trial))
            t.notes.append(f"trial {trial} finish: {why or f'exit {r.rc}'}\n{r}")
        t.trials += 1
        t.failures += failed
        t.lost += lost
    return t


def lock_drill(drill: Drill, runner, trials: int, seed: int, log=print) -> Tally:
    """`trials` times: two copies of the drill's command into the same output, the second
    started a random moment after the first. Either both succeed (one after the other) or one
    exits 2 naming the other's pid; then the output is the complete new state. Every other
    trial the first is SIGKILLed instead, and the second must take over its stale lock."""
    rng = random.Random(seed)
    log(f"lock drill {drill.name}: seed {seed} ({trials} trials)")
    t = Tally(f"one writer {drill.name}")
    for trial in range(trials):
        drill.reset(trial)
        failed = False
        a = runner.start(drill.command(trial))
        time.sleep(rng.uniform(0.0, drill.duration * 0.8))
        killed = trial % 2 == 1
        if killed:
            with _suppress_lookup():
                os.kill(a.pid, signal.SIGKILL)
        b = runner.start(drill.finish_command(trial))
        rc_a, rc_b = runner.wait(a), runner.wait(b)
        t.points += 1
        err_a, err_b = _read(a.stderr), _read(b.stderr)
        ok_a = rc_a == 0 or (killed and rc_a == -signal.SIGKILL)
        if rc_a == 2 and f"pid {b.pid}" in err_a:  # b took the lock first
            ok_a = True
        ok_b = rc_b == 0 or (rc_b == 2 and f"pid {a.pid}" in err_b and "Traceback" not in err_b)
        t.refused += rc_a == 2 or rc_b == 2
        if not (ok_a and ok_b) or (rc_a != 0 and rc_b != 0 and not killed):
            failed = True
            t.notes.append(f"trial {trial}: exits {rc_a}, {rc_b}\n{err_a[-800:]}\n{err_b[-800:]}")
        if rc_b != 0:  # refused (or a was killed after b was refused): finish the job
            r = run(runner, drill.finish_command(trial))
            if r.rc != 0:
                failed = True
                t.notes.append(f"trial {trial} finish:\n{r}")
        st, err = _safe_state(drill)
        lost = err is not None or st != drill.final(trial)
        if lost:
            t.notes.append(f"trial {trial}: {err or 'final state differs'}")
        t.trials += 1
        t.failures += failed or lost
        t.lost += lost
    return t


class _suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is ProcessLookupError


# -- a small filesystem --------------------------------------------------------------------------
def can_mount() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("mount")


class Tmpfs:
    """A tmpfs of `size` bytes mounted on a fresh directory (root only)."""

    def __init__(self, size: int, base: Path | None = None):
        self.path = Path(tempfile.mkdtemp(prefix="vaecf-tmpfs-", dir=base))
        p = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
        )
        if p.returncode:
            os.rmdir(self.path)
            raise OSError(f"cannot mount a tmpfs: {p.stderr.strip()}")

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> Path:
        """Write a filler file so that about `leave` bytes stay free."""
        filler = self.path / "filler"
        with open(filler, "ab") as f:
            chunk = b"\0" * (1 << 16)
            while self.free() > leave + len(chunk):
                f.write(chunk)
                f.flush()
            while self.free() > leave + 4096:
                f.write(b"\0" * 4096)
                f.flush()
        return filler

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], check=False)
        with _suppress():
            os.rmdir(self.path)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


def disk_full_drill(drill: Drill, runner, trials: int, seed: int, need: int, log=print) -> Tally:
    """`trials` times: the drill's output on a tmpfs filled so that a random 0..`need` bytes
    stay free. The command either succeeds with the complete new state, or exits 2 with a
    message naming a path and 'no space', leaving the old state and no temp files. Then space
    is freed and the finishing command must reach the uninterrupted result (`check_final`:
    equal to it, or for tune the invariants a resumed study keeps)."""
    rng = random.Random(seed)
    log(f"disk-full drill {drill.name}: seed {seed} ({trials} trials)")
    t = Tally(f"disk full {drill.name}")
    for trial in range(trials):
        drill.reset(trial)
        before, err = _safe_state(drill)
        failed = lost = False
        leave = rng.randint(0, need)
        filler = drill.fs.fill(leave)
        r = run(runner, drill.command(trial))
        t.points += 1
        st, err = _safe_state(drill)
        if r.rc == 0:
            ok = err is None and drill.check_final(trial, st) is None
        else:
            msg = r.stderr.strip()
            ok = (
                r.rc == 2
                and "Traceback" not in msg
                and "no space" in msg.lower()
                and str(drill.fs.path) in msg
                and err is None
                and drill.allowed_after_kill(trial)(st)
            )
            lost = err is not None or not drill.allowed_after_kill(trial)(st)
        junk = [n for p in drill.output_paths() for n in leftovers(p.parent, [p.name])]
        if junk:
            ok = False
            t.notes.append(f"trial {trial}: temp files left: {junk}")
        if not ok:
            failed = True
            t.notes.append(f"trial {trial} (free {leave} B): {err or ''}\n{r}")
        filler.unlink()
        r = run(runner, drill.finish_command(trial))
        st, err = _safe_state(drill)
        why = err if err is not None else drill.check_final(trial, st)
        if r.rc != 0 or why is not None:
            failed = True
            lost = lost or err is not None or st != drill.old(trial)
            t.notes.append(f"trial {trial} finish: {why or f'exit {r.rc}'}\n{r}")
        t.trials += 1
        t.failures += failed
        t.lost += lost
    return t


# -- prepare -------------------------------------------------------------------------------------
def matrix_digest(h, m) -> None:
    h.update(repr(m.shape).encode())
    for a in (m.indptr, m.indices, m.data):
        h.update(a.tobytes())


def prepared_state(out: Path):
    """(fingerprint, file names, digest of every split, vocabulary and user list) of a prepared
    directory; None when it does not exist; Broken when it does not load and verify."""
    from vaecf.data.prepare import SPLIT_FILES, PreparedDataset
    from vaecf.errors import DataError

    if not out.exists():
        return None
    try:
        ds = PreparedDataset(out)
        ds.verify()
        h = hashlib.sha256()
        for s in SPLIT_FILES:
            matrix_digest(h, ds.split(s))
        h.update(repr(ds.items.ids.to_list()).encode())
        h.update(ds.users.write_csv().encode())
    except DataError as e:
        raise Broken(f"{out}: {e}") from None
    return ds.fingerprint, tuple(sorted(os.listdir(out))), h.hexdigest()


class ReplaceDrill(Drill):
    """A verb whose output is replaced whole: even trials start from an older output
    (`state_old`), odd ones from none; a kill may leave either start or the complete new output
    (`state_new`), which the finishing command must reach."""

    out: Path
    state_old = state_new = None

    def old(self, trial: int):
        return self.state_old if trial % 2 == 0 else None

    def final(self, trial: int):
        return self.state_new

    def allowed_after_kill(self, trial: int):
        return lambda st: st in (self.old(trial), self.state_new)

    def output_paths(self) -> list[Path]:
        return [self.out]


class PrepareDrill(ReplaceDrill):
    """`vaecf prepare csv ... --overwrite` replacing dataset A by B (even trials) or writing B
    where nothing was (odd trials)."""

    name = "prepare"

    def __init__(self, n_users: int = 3000, n_items: int = 300):
        self.n_users, self.n_items = n_users, n_items

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        from vaecf.data.synthetic import generate

        self.root = Path(root)
        (self.root / "inputs").mkdir(parents=True, exist_ok=True)
        self.csv = self.root / "inputs" / "ratings.csv"
        generate(n_users=self.n_users, n_items=self.n_items, n_groups=8, seed=3).write_csv(self.csv)
        self.out = Path(out_parent or self.root / "prepared") / "ds"
        ref = self.root / "reference"
        self.ref_a, self.ref_b = ref / "a", ref / "b"
        run_ok(runner, self._argv(self.ref_a, 60, 1))
        t0 = time.perf_counter()
        run_ok(runner, self._argv(self.ref_b, 80, 2))
        self.duration = time.perf_counter() - t0
        self.state_old, self.state_new = prepared_state(self.ref_a), prepared_state(self.ref_b)

    def _argv(self, out: Path, heldout: int, seed: int) -> list:
        return [
            "prepare", "csv", "--path", self.csv, "--user-col", "user_id", "--item-col",
            "item_id", "--heldout-users", heldout, "--seed", seed, "--out", out, "--overwrite",
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        for p in [self.out, *self.out.parent.glob(f".{self.out.name}.*")]:
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        if trial % 2 == 0:
            shutil.copytree(self.ref_a, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.out, 80, 2)

    def state(self):
        return prepared_state(self.out)


# -- train ---------------------------------------------------------------------------------------
def run_state(run_dir: Path):
    """The run directory's state: None if empty; else a digest of best.pt's and last.pt's model
    weights, results.json and the epoch reached. Broken if a file under its final name does not
    load, or metrics.jsonl does not begin with the checkpoint's history."""
    import torch

    from vaecf.errors import VaecfError
    from vaecf.storage import checkpoint

    if not run_dir.exists() or not any(p for p in run_dir.iterdir() if not p.name.startswith(".")):
        return None
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        h = hashlib.sha256()
        epoch = None
        for name in ("best.pt", "last.pt"):
            if (run_dir / name).exists():
                ck = checkpoint.load(run_dir / name)
                for k, v in sorted(ck["model"].items()):
                    h.update(k.encode())
                    h.update(v.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                if name == "last.pt":
                    epoch = ck["epoch"]
                    hist = [json.dumps(r) for r in ck["history"]]
                    if (run_dir / "metrics.jsonl").exists():
                        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
                        # appended as training goes: it may run ahead of last.pt (a resume
                        # drops those lines), never behind it or differing from it
                        if lines[: len(hist)] != hist:
                            raise Broken(f"{run_dir}/metrics.jsonl disagrees with last.pt")
        results = None
        if (run_dir / "results.json").exists():
            res = json.loads((run_dir / "results.json").read_text())
            results = json.dumps({k: res[k] for k in ("best_epoch", "test", "validation")})
    except (VaecfError, OSError, ValueError, KeyError) as e:
        raise Broken(f"{run_dir}: {type(e).__name__}: {e}") from None
    return cfg["train"].get("epochs"), epoch, h.hexdigest(), results  # closed forms: none


class TrainDrill(Drill):
    """`vaecf train` on a tiny dataset (fp32, CPU), killed at random points and finished with
    `vaecf train --resume`: the final best.pt/last.pt weights must equal an uninterrupted run's,
    bit for bit. Even trials start from nothing; odd ones extend a finished 1-epoch run
    (`--resume --epochs N`), compared with that extension run uninterrupted."""

    name = "train"

    def __init__(self, epochs: int = 4, n_users: int = 500, n_items: int = 120):
        self.epochs, self.n_users, self.n_items = epochs, n_users, n_items

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        self.root = Path(root)
        self.data = prepare_synthetic(runner, self.root, self.n_users, self.n_items, 5, 50)[0]
        self.out = Path(out_parent or self.root / "runs") / "run"
        self.ref, self.ref_short = self.root / "reference" / "run", self.root / "reference" / "r1"
        t0 = time.perf_counter()
        run_ok(runner, self.train_argv(self.ref, self.epochs))
        self.duration = time.perf_counter() - t0
        run_ok(runner, self.train_argv(self.ref_short, 1))
        # odd trials extend the finished 1-epoch run: their reference is that extension run
        # without interruption (not a fresh run: settings resolved at the first run may differ)
        self.ref_ext = self.root / "reference" / "r1-extended"
        shutil.copytree(self.ref_short, self.ref_ext)
        run_ok(runner, self.train_argv(self.ref_ext, self.epochs, resume=True))
        self.final_state = run_state(self.ref)
        self.short_state = run_state(self.ref_short)
        self.extended_state = run_state(self.ref_ext)

    def train_argv(self, out: Path, epochs: int, resume: bool = False) -> list:
        return [
            "train", "--data", self.data, "--out", out, "--epochs", epochs, "--batch-size", 64,
            "--precision", "fp32", "--device", "cpu", "--seed", 7, "--quiet",
            # last.pt after every epoch: kills land between checkpoints of a run under way, so
            # a resume continues from the middle (not, as with the 60 s default, from scratch)
            "--checkpoint-every", 0,
            *(["--resume"] if resume else []),
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        for p in [self.out, *self.out.parent.glob(f".{self.out.name}.*")]:
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        if trial % 2 == 1:
            shutil.copytree(self.ref_short, self.out)

    def command(self, trial: int) -> list:
        return self.train_argv(self.out, self.epochs, resume=trial % 2 == 1)

    def finish_command(self, trial: int) -> list:
        return self.train_argv(self.out, self.epochs, resume=True)

    def state(self):
        return run_state(self.out)

    def old(self, trial: int):
        return self.short_state if trial % 2 == 1 else None

    def final(self, trial: int):
        return self.extended_state if trial % 2 == 1 else self.final_state

    def allowed_after_kill(self, trial: int):
        # any complete, self-consistent intermediate state (run_state raises Broken otherwise)
        return lambda st: True

    def output_paths(self) -> list[Path]:
        return [self.out]

    def diagnose(self) -> str:
        from vaecf.storage import checkpoint

        try:
            last = checkpoint.load(self.out / "last.pt")["epoch"]
            res = json.loads((self.out / "results.json").read_text())
        except Exception as e:  # noqa: BLE001
            return f"unreadable ({e})"
        if res.get("epochs") != last:
            return (
                f"stale results.json (written after epoch {res.get('epochs')}) beside last.pt "
                f"at epoch {last}"
            )
        return "weights or metrics differ from the uninterrupted run"


# Trainer issues these drills found (training/single.py is outside this kit's reach; reproduced in
# tests/test_drills.py): a kill before config.json exists leaves a temp file that makes
# `--resume` refuse the directory; an extended run killed before results.json returns the shorter
# run's stale results.json on the next `--resume`.
def format_table(rows: list[Tally]) -> str:
    head = ("drill", "trials", "points", "failures", "data lost")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in rows:
        lines.append("| " + " | ".join(str(v) for v in t.row()) + " |")
    return "\n".join(lines)


# -- score ---------------------------------------------------------------------------------------
class ScoreDrill(ReplaceDrill):
    """`vaecf score` of a history file into recs.parquet: even trials replace an older output
    (k 5), odd ones write where nothing was; after a kill the file is the old one, the complete
    new one, or absent where there was none, never a torn one; rerunning gives the result."""

    name = "score"

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        import polars as pl

        self.root = Path(root)
        data, df = prepare_synthetic(runner, self.root, 600, 150, 8, 50)
        self.history = self.root / "inputs" / "history.csv"
        df.filter(pl.col("user_id") < 400).write_csv(self.history)
        self.run_dir = self.root / "run"
        run_ok(runner, [
            "train", "--data", data, "--out", self.run_dir, "--epochs", 1, "--precision", "fp32",
            "--device", "cpu", "--quiet",
        ])  # fmt: skip
        self.out = Path(out_parent or self.root / "out") / "recs.parquet"
        self.ref_old, self.ref_new = (
            self.root / "ref" / "old.parquet",
            self.root / "ref" / "new.parquet",
        )
        for ref, k in ((self.ref_old, 5), (self.ref_new, 20)):
            t0 = time.perf_counter()
            run_ok(runner, self._argv(ref, k))
            self.duration = time.perf_counter() - t0
        self.state_old, self.state_new = _table_state(self.ref_old), _table_state(self.ref_new)

    def _argv(self, out: Path, k: int) -> list:
        return [
            "score", self.run_dir, "--input", self.history, "--user-col", "user_id",
            "--item-col", "item_id", "-k", k, "--out", out,
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for p in self.out.parent.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if trial % 2 == 0:
            shutil.copyfile(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.out, 20)

    def state(self):
        return _table_state(self.out)


def _table_state(path: Path):
    """A digest of a Parquet table's rows; None if absent; Broken if it does not read."""
    import polars as pl

    if not path.exists():
        return None
    try:
        df = pl.read_parquet(path)
    except Exception as e:  # a torn file under the final name
        raise Broken(f"{path}: {type(e).__name__}: {e}") from None
    return hashlib.sha256(df.write_csv().encode()).hexdigest()


# -- export --------------------------------------------------------------------------------------
class ExportDrill(ReplaceDrill):
    """`vaecf export RUN --format onnx --out model.onnx` (checked with onnxruntime): even trials
    replace an older export (of another run, so old and new differ), odd ones write where
    nothing was; after a kill the file is the old one, the complete new one, or absent where
    there was none, never a torn one; rerunning gives the result. States compare the file's
    bytes (sha256): export is deterministic for a given run, which setup checks (two exports,
    the same bytes), and a file only counts once it parses, passes onnx.checker and onnxruntime
    runs it (`onnx_state`). A kill leaves its temp file (`.model.onnx.*.tmp`) beside the output,
    as score's leaves its own: the rerun writes under a fresh name and does not sweep them."""

    name = "export"

    def __init__(self, n_items: int = 2000, hidden: int = 200, latent: int = 32):
        self.n_items, self.hidden, self.latent = n_items, hidden, latent

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        from vaecf.serve.fixtures import fresh_run

        self.root = Path(root)
        cfg = {"hidden_dims": [self.hidden], "latent_dim": self.latent}
        # two runs of the same shape (different weights): the old export is the other run's
        self.run_old, self.run_new = (
            fresh_run(self.root / "runs" / name, self.n_items, "multvae", cfg, seed=seed)
            for name, seed in (("old", 1), ("new", 2))
        )
        self.out = Path(out_parent or self.root / "out") / "model.onnx"
        ref = self.root / "ref"
        self.ref_old, self.ref_new = ref / "old.onnx", ref / "new.onnx"
        for run_dir, dest in ((self.run_old, self.ref_old), (self.run_new, self.ref_new)):
            run_ok(runner, self._argv(run_dir, dest))
        self.duration = _timed(runner, self._argv(self.run_new, self.out), self.out)
        again = ref / "again.onnx"  # bytes compare only if exporting is deterministic
        run_ok(runner, self._argv(self.run_new, again))
        if again.read_bytes() != self.ref_new.read_bytes():
            raise RuntimeError("two exports of one run differ: compare outputs, not bytes")
        self.state_old, self.state_new = onnx_state(self.ref_old), onnx_state(self.ref_new)
        if self.state_old == self.state_new:
            raise RuntimeError("the old and new exports are the same file")

    def _argv(self, run_dir: Path, out: Path) -> list:
        return ["export", run_dir, "--format", "onnx", "--out", out]

    def reset(self, trial: int) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for p in self.out.parent.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if trial % 2 == 0:
            shutil.copyfile(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.run_new, self.out)

    def state(self):
        return onnx_state(self.out)

    def diagnose(self) -> str:
        st = _safe_state(self)
        return f"{self.out}: {st[1] or st[0]} (new: {self.state_new}, old: {self.state_old})"


def onnx_state(path: Path):
    """(the run it exports, sha256 of the file) of an ONNX export; None if absent; Broken if it
    does not load, fails onnx.checker, lacks export's metadata (added in a second write), or
    onnxruntime cannot run it on a fixed input (finite scores of shape (2, n_items))."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    if not path.exists():
        return None
    data = path.read_bytes()
    try:
        m = onnx.load_from_string(data)
        onnx.checker.check_model(m)
        meta = {p.key: p.value for p in m.metadata_props}
        if "n_items" not in meta or "vaecf_run" not in meta:
            raise ValueError(f"no vaecf metadata (a graph caught before it was added): {meta}")
        n = int(meta["n_items"])
        x = np.zeros((2, n), np.float32)
        x[0, :3] = 1.0
        x[1, n // 2 :: 7] = 1.0
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        (y,) = sess.run(["scores"], {"history": x})
        if y.shape != (2, n) or not np.isfinite(y).all():
            raise ValueError(f"scores of shape {y.shape}, finite: {np.isfinite(y).all()}")
    except Exception as e:  # noqa: BLE001 - a torn file under the final name
        raise Broken(f"{path}: {type(e).__name__}: {e}") from None
    return meta["vaecf_run"], hashlib.sha256(data).hexdigest()


# -- files that must parse -----------------------------------------------------------------------
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _digest(path: Path) -> str | None:
    """sha256 of a file that must be whole: None if absent; Broken if it does not parse (JSON,
    CSV with every row as long as the header, PNG through its IEND chunk, TOML)."""
    import csv

    import tomllib

    if not path.exists():
        return None
    data = path.read_bytes()
    try:
        if path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".csv":
            rows = list(csv.reader(data.decode().splitlines()))
            if not rows or any(len(r) != len(rows[0]) for r in rows) or not data.endswith(b"\n"):
                raise ValueError("a row cut short")
        elif path.suffix == ".png":
            if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(PNG_END)):
                raise ValueError(f"not a whole PNG ({len(data)} bytes)")
        elif path.suffix == ".toml":
            tomllib.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise Broken(f"{path}: torn: {type(e).__name__}: {e}") from None
    return hashlib.sha256(data).hexdigest()


def _visible(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def _timed(runner, argv: list, out: Path) -> float:
    """Seconds `vaecf ARGV` takes writing a fresh `out` (removed again): a second timing, since
    one taken while the machine is busy would put most kill moments after the command's end."""
    _clear(out)
    t0 = time.perf_counter()
    run_ok(runner, argv)
    took = time.perf_counter() - t0
    _clear(out)
    return took


def _clear(out: Path) -> None:
    for p in [out, *out.parent.glob(f".{out.name}.*")]:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


# -- tune ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRow:
    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    params: str  # JSON, sorted keys
    value: float | None
    retry_of: int | None
    interrupted: str | None
    started: bool  # it had drawn all its parameters

    @property
    def counted(self) -> bool:  # what --trials counts (study.counts)
        return self.state in ("COMPLETE", "PRUNED") or (
            self.state == "FAIL" and self.interrupted is None
        )


@dataclass(frozen=True)
class StudyState:
    trials: tuple[TrialRow, ...]  # () while study.db holds no study yet
    files: tuple  # (name, sha256 or None) of the study's own outputs
    best: tuple | None  # best.json's (trial, validation value, test metrics)


STUDY_FILES = ("trials.csv", "best.json", "best.toml", "history.png", "importance.png")


def _whole_draw(info: dict | None) -> Callable[[dict], bool]:
    """Whether a trial's parameters are a whole draw of the study's search space (the
    space replays on them, its fixed parameters added), from the study's own record."""
    if not info:
        return bool
    from vaecf import models
    from vaecf.data.prepare import PreparedDataset
    from vaecf.experiments.space import drew_all

    space = models.get(info["model"]).search_space
    n_train = PreparedDataset(info["data"]).manifest["counts"]["n_train_users"]
    return lambda params: bool(params) and drew_all(space, params, info.get("fixed", {}), n_train)


def study_state(study_dir: Path) -> StudyState | None:
    """What a `vaecf tune` study directory holds: None if nothing (or only the lock); else its
    trials (read from a copy of study.db and its journal, so that reading writes nothing into
    the study). Broken when a file under its final name is torn, a trial's run directory does
    not load, a complete trial's value is not its run's validation value, or trials.csv and
    best.json disagree with the study."""
    import optuna

    from vaecf.experiments.study import METRIC

    if not study_dir.exists() or not _visible(study_dir):
        return None
    files = tuple((n, _digest(study_dir / n)) for n in STUDY_FILES)
    db = study_dir / "study.db"
    trials: tuple[TrialRow, ...] = ()
    if db.exists():
        with tempfile.TemporaryDirectory(prefix="vaecf-study-") as tmp:
            for p in study_dir.glob("study.db*"):  # the database and its journal, if any
                shutil.copyfile(p, Path(tmp) / p.name)
            storage = None
            try:
                storage = optuna.storages.RDBStorage(f"sqlite:///{Path(tmp) / 'study.db'}")
                study = optuna.load_study(study_name="vaecf", storage=storage)
                got = study.get_trials(deepcopy=False)
                whole = _whole_draw(study.user_attrs.get("vaecf"))
            except KeyError:  # killed before the study was created in it
                got, whole = [], bool
            except Exception as e:  # noqa: BLE001 - an unreadable database is a finding
                raise Broken(f"{db}: {type(e).__name__}: {e}") from None
            finally:
                if storage is not None:
                    storage.engine.dispose()
        trials = tuple(
            TrialRow(
                t.number,
                t.state.name,
                json.dumps(t.params, sort_keys=True),
                t.value,
                t.user_attrs.get("retry_of"),
                t.user_attrs.get("interrupted"),
                whole(t.params),
            )
            for t in got
        )
    by_number = {t.number: t for t in trials}
    for t in trials:
        run = study_dir / "trials" / f"{t.number:04d}"
        if run.exists():
            run_state(run)  # raises Broken
        if t.state == "COMPLETE":
            try:
                res = json.loads((run / "results.json").read_text())
            except (OSError, ValueError) as e:
                raise Broken(f"complete trial {t.number}: {run}/results.json: {e}") from None
            if res["validation"][METRIC] != t.value:
                raise Broken(f"trial {t.number}: study value {t.value} != {run}/results.json")
    if dict(files)["trials.csv"]:
        import csv

        with open(study_dir / "trials.csv", newline="") as f:
            for row in csv.DictReader(f):
                t = by_number.get(int(row["trial"]))
                if t is None or (row["state"] == "complete" and float(row["value"]) != t.value):
                    raise Broken(f"trials.csv row {row['trial']} disagrees with study.db")
    best = None
    if dict(files)["best.json"]:
        b = json.loads((study_dir / "best.json").read_text())
        t = by_number.get(b["trial"])
        if t is None or t.state != "COMPLETE" or t.value != b["validation"][METRIC]:
            raise Broken(f"best.json names trial {b['trial']}, which study.db does not hold")
        best = (b["trial"], b["validation"][METRIC], json.dumps(b["test"], sort_keys=True))
    return StudyState(trials, files, best)


class TuneDrill(Drill):
    """`vaecf tune` of Mult-VAE (a few epochs each, last.pt after every epoch) killed at random
    points and finished with `vaecf tune --resume`. Even trials start a study of `trials` trials;
    odd ones extend a finished study of `trials - 1` with `--resume --trials N`.

    A resumed study cannot reach the same trials as an uninterrupted one: its sampler is seeded
    by the study's seed and length (tune.py), and an interrupted trial is marked failed and
    queued again, which adds a trial. What must hold instead: after each kill, every file is
    whole and consistent with study.db (`study_state`) and no finished trial is lost or changed;
    after the finishing --resume exactly N trials count, none twice (distinct parameters), every
    interrupted trial that had drawn parameters was queued again exactly once with them (one
    killed before that, never), and every complete
    trial's value, and best.json's test metrics, equal those of training its parameters
    uninterrupted (`vaecf train` with tune's own settings: bit for bit on the CPU)."""

    name = "tune"

    def __init__(self, trials: int = 3, epochs: int = 4, n_users: int = 400, n_items: int = 100):
        self.n_trials, self.epochs, self.n_users, self.n_items = trials, epochs, n_users, n_items
        self.seen: dict[int, list] = {}
        self.retrained: dict[str, tuple] = {}  # params JSON -> (validation value, test)

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        self.root, self.runner = Path(root), runner
        self.data = prepare_synthetic(runner, self.root, self.n_users, self.n_items, 5, 40)[0]
        self.base = self.root / "inputs" / "base.toml"
        self.base.write_text('[train]\ncheckpoint_every = 0\nprecision = "fp32"\n')
        self.out = Path(out_parent or self.root / "studies") / "study"
        # the references run where the drill's output lives (best.json names its run by path)
        ref = self.root / "reference"
        ref.mkdir(parents=True, exist_ok=True)
        self.ref_old, self.ref_new = ref / "old", ref / "new"
        _clear(self.out)
        run_ok(self.runner, self._argv(self.n_trials - 1))
        shutil.move(self.out, self.ref_old)
        t0 = time.perf_counter()
        run_ok(self.runner, self._argv(self.n_trials))
        self.duration = time.perf_counter() - t0
        shutil.move(self.out, self.ref_new)
        self.duration = min(self.duration, _timed(runner, self._argv(self.n_trials), self.out))
        self.old_state, self.new_state = study_state(self.ref_old), study_state(self.ref_new)
        # the references are what training their parameters uninterrupted gives (if not, the
        # retraining below could not judge the drill's trials)
        for st in (self.old_state, self.new_state):
            why = self._values_match(st)
            if why:
                raise RuntimeError(f"tune is not reproducible by `vaecf train`: {why}")

    def _argv(self, trials: int, resume: bool = False) -> list:
        return [
            "tune", "--config", self.base, "--data", self.data, "--out", self.out,
            "--model", "multvae", "--trials", trials, "--seed", 0, "--device", "cpu",
            "--fix", f"epochs={self.epochs}", "--fix", "hidden_dim=0", "--fix", "latent_dim=8",
            "--fix", "batch_size=64", *(["--resume"] if resume else []),
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        _clear(self.out)
        self.seen[trial] = []
        if trial % 2 == 1:
            shutil.copytree(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.n_trials, resume=trial % 2 == 1)

    def finish_command(self, trial: int) -> list:
        return self._argv(self.n_trials, resume=True)

    def state(self):
        return study_state(self.out)

    def old(self, trial: int):
        return self.old_state if trial % 2 == 1 else None

    def final(self, trial: int):
        return self.new_state

    def allowed_after_kill(self, trial: int):
        def ok(st) -> bool:
            self.seen[trial].append(st)
            return self._lost(trial, st) is None

        return ok

    def output_paths(self) -> list[Path]:
        return [self.out]

    def _lost(self, trial: int, st) -> str | None:
        """A finished trial of an earlier state (the old study, a state seen after a kill) that
        `st` no longer holds as it was."""
        have = {t.number: t for t in (st.trials if st else ())}
        for before in [self.old(trial), *self.seen.get(trial, ())]:
            for t in before.trials if before else ():
                if t.counted and have.get(t.number) != t:
                    return f"finished trial {t.number} lost or changed: {have.get(t.number)}"
        return None

    def check_final(self, trial: int, st) -> str | None:
        if st is None or not st.trials or st.best is None:
            return f"no finished study: {st}"
        if any(d is None for _, d in st.files):
            return f"missing outputs: {st.files}"
        lost = self._lost(trial, st)
        if lost:
            return lost
        counted = [t for t in st.trials if t.counted]
        if len(counted) != self.n_trials:
            return f"{len(counted)} finished trials, not {self.n_trials}"
        if len({t.params for t in counted}) != len(counted):
            return "a finished trial was run twice (the same parameters)"
        retries = [t.retry_of for t in st.trials if t.retry_of is not None]
        if len(set(retries)) != len(retries):
            return f"an interrupted trial was queued again more than once: {retries}"
        params = {t.number: t.params for t in st.trials}
        for t in st.trials:
            # killed before all its parameters were drawn: nothing to continue, not queued again
            if t.interrupted and not t.started and t.number in retries:
                return f"trial {t.number}, killed before its parameters, was queued again"
            if t.interrupted and t.started and (t.number not in retries or not any(
                r.retry_of == t.number and r.params == t.params for r in st.trials
            )):  # fmt: skip
                return f"interrupted trial {t.number} was not run again with its parameters"
            if t.retry_of is not None and params.get(t.retry_of) != t.params:
                return f"trial {t.number} retries trial {t.retry_of} with other parameters"
        return self._values_match(st)

    def _values_match(self, st: StudyState) -> str | None:
        for t in st.trials:
            if t.state == "COMPLETE":
                value, test = self._retrain(t.params)
                if value != t.value:
                    return f"trial {t.number}: value {t.value}, retrained {value} ({t.params})"
                if st.best[0] == t.number and st.best[2] != test:
                    return f"best trial {t.number}: test {st.best[2]}, retrained {test}"
        return None

    def _retrain(self, params: str) -> tuple:
        """(validation value, test metrics JSON) of `vaecf train` with a trial's settings."""
        if params not in self.retrained:
            from vaecf import models
            from vaecf.config import toml as configfile
            from vaecf.data.prepare import PreparedDataset
            from vaecf.experiments.space import parse_fixed, settings_of
            from vaecf.experiments.study import METRIC

            fixed = parse_fixed(
                [f"epochs={self.epochs}", "hidden_dim=0", "latent_dim=8", "batch_size=64"]
            )
            base = configfile.read(self.base)
            base.train["device"] = "cpu"
            n_train = PreparedDataset(self.data).manifest["counts"]["n_train_users"]
            space = models.get("multvae").search_space
            train_d, model_d = settings_of(space, json.loads(params), n_train, base, 0, fixed)
            n = len(self.retrained)
            toml, out = self.root / "retrain" / f"{n}.toml", self.root / "retrain" / f"{n}"
            configfile.write(toml, "multvae", train_d, model_d, data=str(self.data))
            _clear(out)
            run_ok(self.runner, ["train", "--config", toml, "--out", out, "--quiet"])
            res = json.loads((out / "results.json").read_text())
            test = json.dumps(res["test"], sort_keys=True)
            self.retrained[params] = (res["validation"][METRIC], test)
        return self.retrained[params]


# -- compare -------------------------------------------------------------------------------------
COMPARE_FILES = ("compare.json", "compare_splits.csv", "compare_summary.csv", "compare.png")


def compare_state(out: Path):
    """What a `vaecf compare --data` directory holds: None if nothing (or only the lock); else
    each output file's digest, each prepared split's `prepared_state` and each run's
    `run_state`. Broken when any of them is torn or does not load."""
    if not out.exists() or not _visible(out):
        return None
    files = tuple((n, _digest(out / n)) for n in COMPARE_FILES)
    data = tuple(
        (p.name, prepared_state(p))
        for p in (_visible(out / "data") if (out / "data").is_dir() else [])
    )
    runs = tuple(
        (f"{lab.name}/{p.name}", run_state(p))
        for lab in (_visible(out / "runs") if (out / "runs").is_dir() else [])
        for p in _visible(lab)
    )
    return files, data, runs


class CompareDrill(ReplaceDrill):
    """`vaecf compare --data` of Mult-VAE (a few epochs, last.pt after every epoch), EASE and
    popularity over two split seeds, killed at random points and run again (it resumes
    unfinished runs and reuses finished ones). Even trials start from nothing; odd ones from a
    finished comparison over the first seed. After a kill every output file is absent, the
    old one or the complete new one; every prepared split is the reference's; every finished
    run is the reference's (weights bit for bit); the rerun must reach the reference exactly:
    the same files byte for byte (summary tables, per-split metrics, chart), splits and runs."""

    name = "compare"

    def __init__(self, epochs: int = 4, n_users: int = 400, n_items: int = 100):
        self.epochs, self.n_users, self.n_items = epochs, n_users, n_items

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        from vaecf.data.synthetic import generate

        self.root = Path(root)
        (self.root / "inputs").mkdir(parents=True, exist_ok=True)
        self.csv = self.root / "inputs" / "raw.csv"
        generate(n_users=self.n_users, n_items=self.n_items, n_groups=4, seed=6).write_csv(self.csv)
        self.mv = self.root / "inputs" / "mv.toml"
        self.mv.write_text(
            '[model]\nname = "multvae"\nhidden_dims = []\nlatent_dim = 8\n[train]\n'
            f'checkpoint_every = 0\nprecision = "fp32"\nbatch_size = 64\nepochs = {self.epochs}\n'
        )
        self.out = Path(out_parent or self.root / "compares") / "cmp"
        ref = self.root / "reference"
        ref.mkdir(parents=True, exist_ok=True)
        self.ref_old, self.ref_new = ref / "old", ref / "new"
        _clear(self.out)
        for dest, seeds in ((self.ref_old, "1"), (self.ref_new, "1,2")):
            t0 = time.perf_counter()
            run_ok(runner, self._argv(seeds))
            self.duration = time.perf_counter() - t0
            shutil.move(self.out, dest)  # run where the drill's output lives: paths inside match
        self.duration = min(self.duration, _timed(runner, self._argv("1,2"), self.out))
        self.state_old, self.state_new = compare_state(self.ref_old), compare_state(self.ref_new)

    def _argv(self, seeds: str) -> list:
        return [
            "compare", "--data", self.csv, "--user-col", "user_id", "--item-col", "item_id",
            "--heldout-users", 40, "--models", f"mv={self.mv},ease,popular", "--seeds", seeds,
            "--out", self.out, "--device", "cpu",
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        _clear(self.out)
        if trial % 2 == 0:  # (ReplaceDrill: even trials start from the old output)
            shutil.copytree(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv("1,2")

    def state(self):
        return compare_state(self.out)

    def allowed_after_kill(self, trial: int):
        old, new = self.old(trial), self.state_new
        new_data, new_runs = dict(new[1]), dict(new[2])

        def ok(st) -> bool:
            if st is None or st == old:
                return True
            files, data, runs = st
            old_files = dict(old[0]) if old else {}
            return (
                all(d in (old_files.get(n), dict(new[0])[n]) for n, d in files)
                and all(new_data.get(n) == s for n, s in data)
                # finished runs (results.json) are the reference's; unfinished ones load
                and all(s is None or s[3] is None or new_runs.get(n) == s for n, s in runs)
            )

        return ok

    def diagnose(self) -> str:
        st = _safe_state(self)[0]
        if st is None:
            return "no output"
        diff = [n for n, d in st[0] if d != dict(self.state_new[0])[n]]
        diff += [
            n for n, s in st[1] + st[2] if s != dict(self.state_new[1] + self.state_new[2]).get(n)
        ]
        return f"differs from the uninterrupted run in {diff}"


# -- serve ---------------------------------------------------------------------------------------
def tree_digest(dirs: Sequence[Path]) -> dict:
    """Every entry under `dirs` (hidden ones too): a file's sha256, or 'dir'."""
    out = {}
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            out[str(p)] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, method: str, path: str, body=None, timeout: float = 10.0) -> tuple[int, dict]:
    """(status, JSON body) of one request to 127.0.0.1:`port`; OSError when it cannot connect."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _alive(pid: int) -> bool:
    """The process runs (not gone, not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _stable(body):
    """An answer without the moment its model was loaded (the one field a restart changes)."""
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k != "loaded_at"}
    if isinstance(body, (list, tuple)):
        return type(body)(_stable(v) for v in body)
    return body


class ServeDrill:
    """`vaecf serve RUN` SIGKILLed at random moments: during start-up, while answering a stream
    of requests, and during a `POST /v1/admin/reload` of another run. Serve only reads: after
    every kill both run directories must hold exactly the files they held, byte for byte (no
    new, changed or temp files). A server started again afterwards must answer /readyz and
    /v1/recommend exactly as before the kills (the model's version included: it names the
    checkpoint's path, size and mtime), and a reload of the other run as before too."""

    name = "serve"

    def setup(self, root: Path, runner) -> None:

        self.root, self.runner = Path(root), runner
        data = prepare_synthetic(runner, self.root, 400, 100, 8, 40)[0]
        self.run_a, self.run_b = self.root / "runs" / "a", self.root / "runs" / "b"
        for argv in (
            ["train", "--data", data, "--out", self.run_a, "--epochs", 2, "--batch-size", 64,
             "--precision", "fp32", "--device", "cpu", "--quiet"],
            ["train", "--data", data, "--out", self.run_b, "--model", "ease", "--device", "cpu",
             "--quiet"],
        ):  # fmt: skip
            run_ok(runner, argv)
        from vaecf.data.vocab import Vocabulary

        items = Vocabulary.load(self.run_a / "items.parquet").id_of(range(3))
        self.request = {"items": [str(i) for i in items], "k": 10}
        self.files = tree_digest([self.run_a, self.run_b])
        t0 = time.perf_counter()
        proc, port = self.start()
        self.startup = time.perf_counter() - t0
        try:
            self.answers = self.answer(proc, port)
            t0 = time.perf_counter()
            self.reload_answers = self.reload(port)
            self.reload_s = time.perf_counter() - t0
        finally:
            self.stop(proc)

    def start(self, wait: bool = True):
        port = free_port()
        proc = self.runner.start(["serve", self.run_a, "--port", port, "--log-level", "warning"])
        if wait:
            self.wait_ready(proc, port)
        return proc, port

    def wait_ready(self, proc: Proc, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(proc.pid):
                raise RuntimeError(f"vaecf serve exited: {_read(proc.stderr)[-2000:]}")
            try:
                if http(port, "GET", "/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise RuntimeError("vaecf serve did not become ready")

    def answer(self, proc: Proc, port: int) -> tuple:
        return tuple(
            _stable(x)
            for x in (
                http(port, "GET", "/readyz"),
                http(port, "POST", "/v1/recommend", self.request),
            )
        )

    def reload(self, port: int) -> tuple:
        status, body = http(port, "POST", "/v1/admin/reload", {"run": str(self.run_b)})
        return _stable((status, body)), _stable(http(port, "POST", "/v1/recommend", self.request))

    def stop(self, proc: Proc) -> int:
        with _suppress_lookup():
            os.kill(proc.pid, signal.SIGKILL)
        return self.runner.wait(proc)


def _requests(port: int, body_of: Callable[[int], tuple], stop) -> None:
    """Send requests one after another (a thread) until `stop` is set or the server is gone."""
    i = 0
    while not stop.is_set():
        try:
            http(port, *body_of(i), timeout=5)
        except Exception:  # noqa: BLE001 - killed mid-answer: refused, reset, cut short
            return
        i += 1


def serve_drill(drill: ServeDrill, runner, trials: int, seed: int, max_kills: int = 2, log=print):
    """`trials` times: 1..max_kills servers, each SIGKILLed at a random moment of a random phase
    (start-up; answering requests; reloading the other run while answering), checking after
    each kill that neither run directory changed; then a fresh server must answer as before."""
    import threading

    rng = random.Random(seed)
    log(f"kill drill serve: seed {seed} ({trials} trials)")
    t = Tally("kill serve")
    recommend = ("POST", "/v1/recommend", drill.request)
    reload = ("POST", "/v1/admin/reload", {"run": str(drill.run_b)})
    for trial in range(trials):
        failed = lost = False
        for k in range(rng.randint(1, max_kills)):
            phase = rng.choice(["start-up", "answering", "reload"])
            stop = threading.Event()
            sender = None
            try:
                proc, port = drill.start(wait=phase != "start-up")
            except RuntimeError as e:
                failed = True
                t.notes.append(f"trial {trial} kill {k}: {e}")
                continue
            if phase == "start-up":
                delay = rng.uniform(0.0, drill.startup * 1.1)
            else:
                first = reload if phase == "reload" else recommend
                sender = threading.Thread(
                    target=_requests,
                    args=(port, lambda i, first=first: first if i == 0 else recommend, stop),
                )
                sender.start()
                delay = rng.uniform(0.0, drill.reload_s * 1.5 if phase == "reload" else 0.3)
            time.sleep(max(0.0, delay - (time.perf_counter() - proc.started)) if phase ==
                       "start-up" else delay)  # fmt: skip
            alive = _alive(proc.pid)
            rc = drill.stop(proc)
            stop.set()
            if sender is not None:
                sender.join(30)
            t.points += 1
            if not alive and rc != -signal.SIGKILL:
                failed = True
                t.notes.append(f"trial {trial} kill {k} ({phase}): exited {rc} by itself\n"
                               f"{_read(proc.stderr)[-2000:]}")  # fmt: skip
            now = tree_digest([drill.run_a, drill.run_b])
            if now != drill.files:
                failed = lost = True
                changed = sorted(set(now.items()) ^ set(drill.files.items()))
                t.notes.append(f"trial {trial} kill {k} ({phase} at {delay:.3f}s): {changed}")
                drill.files = now  # report each change once
        try:
            proc, port = drill.start()
            try:
                got, got_reload = drill.answer(proc, port), drill.reload(port)
            finally:
                drill.stop(proc)
            if (got, got_reload) != (drill.answers, drill.reload_answers):
                failed = True
                t.notes.append(f"trial {trial}: restarted server answers {got} {got_reload}")
        except (RuntimeError, OSError) as e:
            failed = True
            t.notes.append(f"trial {trial} restart: {e}")
        t.trials += 1
        t.failures += failed
        t.lost += lost
    return t
