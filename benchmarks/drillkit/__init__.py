"""Drill kit: break vaecf on purpose (SIGKILL at random points, a full disk), count what is lost.

    runners.py   ForkRunner, ExecRunner: `vaecf ARGV` in a child process; run, run_ok, kill_after
    trials.py    Drill (the hooks a verb implements), Tally; kill_drill, lock_drill, disk_full_drill
    outputs.py   Broken, whole-file and tree digests, temp and lock leftovers of an output
    tmpfs.py     Tmpfs: a small filesystem to fill (root only), can_mount
    training.py  PrepareDrill, TrainDrill, CompareDrill and their states (prepared_state, run_state)
    tune.py      TuneDrill and study_state (a study's trials and files, checked against each other)
    scoring.py   ScoreDrill, ExportDrill: one file written from a run (Parquet, ONNX);
                 ScoreTableDrill: a directory of parts, resumed
    serving.py   ServeDrill, serve_drill: servers killed while starting, answering and reloading

Imported by tests/test_drills.py (a few trials) and benchmarks/drills.py (many). A verb plugs in
as a `Drill` subclass: its inputs and the state found before it runs (`reset`), the command to
break (`command`) and the one that finishes the job afterwards (`finish_command`), and what its
output holds (`state`: a comparable summary, raising `Broken` for anything unreadable).

Commands run the real CLI entry point (`vaecf.cli.main`) in a child process. `ForkRunner` forks
each child from a server process that imported vaecf and torch once, so a trial costs the work
itself and not ~2.5 s of imports; `ExecRunner` starts `python -m vaecf` for every command.
"""

from __future__ import annotations

from .outputs import Broken
from .runners import ForkRunner, drill_env, run
from .scoring import ExportDrill, ScoreDrill, ScoreTableDrill
from .serving import ServeDrill, serve_drill
from .tmpfs import Tmpfs, can_mount
from .training import CompareDrill, PrepareDrill, TrainDrill, run_state
from .trials import disk_full_drill, format_table, kill_drill, lock_drill
from .tune import TuneDrill, study_state

__all__ = [
    "Broken",
    "CompareDrill",
    "ExportDrill",
    "ForkRunner",
    "PrepareDrill",
    "ScoreDrill",
    "ScoreTableDrill",
    "ServeDrill",
    "Tmpfs",
    "TrainDrill",
    "TuneDrill",
    "can_mount",
    "disk_full_drill",
    "drill_env",
    "format_table",
    "kill_drill",
    "lock_drill",
    "run",
    "run_state",
    "serve_drill",
    "study_state",
]
