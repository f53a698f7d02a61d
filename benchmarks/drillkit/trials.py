"""The drill and its trials: the `Drill` hooks a verb implements, the trial loops that break it
(SIGKILL at random moments, two writers at once, a nearly full disk) and the counts (`Tally`).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .outputs import Broken, leftovers
from .runners import kill_after, read_output, run, suppress_lookup


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


def safe_state(drill: Drill):
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
            st, err = safe_state(drill)
            if err is not None or not drill.allowed_after_kill(trial)(st):
                failed = lost = True
                t.notes.append(f"trial {trial} kill {k} at {delay:.3f}s: {err or st}")
            argv = drill.finish_command(trial)
        r = run(runner, drill.finish_command(trial))
        st, err = safe_state(drill)
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
            with suppress_lookup():
                os.kill(a.pid, signal.SIGKILL)
        b = runner.start(drill.finish_command(trial))
        rc_a, rc_b = runner.wait(a), runner.wait(b)
        t.points += 1
        err_a, err_b = read_output(a.stderr), read_output(b.stderr)
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
        st, err = safe_state(drill)
        lost = err is not None or st != drill.final(trial)
        if lost:
            t.notes.append(f"trial {trial}: {err or 'final state differs'}")
        t.trials += 1
        t.failures += failed or lost
        t.lost += lost
    return t


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
        before, err = safe_state(drill)
        failed = lost = False
        leave = rng.randint(0, need)
        filler = drill.fs.fill(leave)
        r = run(runner, drill.command(trial))
        t.points += 1
        st, err = safe_state(drill)
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
        st, err = safe_state(drill)
        why = err if err is not None else drill.check_final(trial, st)
        if r.rc != 0 or why is not None:
            failed = True
            lost = lost or err is not None or st != drill.old(trial)
            t.notes.append(f"trial {trial} finish: {why or f'exit {r.rc}'}\n{r}")
        t.trials += 1
        t.failures += failed
        t.lost += lost
    return t


def format_table(rows: list[Tally]) -> str:
    head = ("drill", "trials", "points", "failures", "data lost")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in rows:
        lines.append("| " + " | ".join(str(v) for v in t.row()) + " |")
    return "\n".join(lines)
