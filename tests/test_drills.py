"""Crash drills (a share of benchmarks/drills.py): `vaecf prepare` and `vaecf train` SIGKILLed at
random points, then rerun (`--resume` for train), and the same verbs on a nearly full tmpfs.

Each drill prints its seed; rerun one with VAECF_DRILL_SEED=N. The counts here are small (the
benchmark runs >= 100 kill points per verb); the drill kit lives in drillkit.py.
"""

from __future__ import annotations

import os
import random

import pytest
from drillkit import (
    ForkRunner,
    PrepareDrill,
    ScoreDrill,
    Tmpfs,
    TrainDrill,
    can_mount,
    disk_full_drill,
    kill_drill,
)

SEED = int(os.environ.get("VAECF_DRILL_SEED") or random.SystemRandom().randrange(10**6))
KILL_TRIALS = {"prepare": 14, "train": 10, "score": 8}  # 1-2 kill points each
DISK_TRIALS = 5


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    r = ForkRunner(tmp_path_factory.mktemp("drill-logs"))
    yield r
    r.close()


def _assert_clean(t, seed):
    print(f"{t.drill}: {t.trials} trials, {t.points} points, seed {seed}")
    assert t.failures == 0 and t.lost == 0, f"seed {seed}:\n" + "\n\n".join(t.notes[:3])


def test_killed_prepare_leaves_old_or_new_and_rerun_completes(runner, tmp_path):
    d = PrepareDrill(n_users=2000, n_items=200)
    d.setup(tmp_path, runner)
    t = kill_drill(d, runner, KILL_TRIALS["prepare"], SEED)
    _assert_clean(t, SEED)
    assert t.points >= KILL_TRIALS["prepare"]
    # the reruns swept what the kills left beside the output
    assert [p.name for p in d.out.parent.iterdir()] == ["ds"]


def test_killed_train_resumes_to_the_same_weights_bit_for_bit(runner, tmp_path):
    d = TrainDrill(epochs=3)
    d.setup(tmp_path, runner)
    # item 7: the run directory's files have the modes an ordinary write would (not 0600)
    from vaecf._io import current_umask

    mask = current_umask()
    assert {f.name: f.stat().st_mode & 0o777 for f in d.ref.iterdir()} == {
        f.name: 0o666 & ~mask for f in d.ref.iterdir()
    }
    t = kill_drill(d, runner, KILL_TRIALS["train"], SEED + 1)
    _assert_clean(t, SEED + 1)


def test_killed_score_leaves_old_or_new_and_rerun_completes(runner, tmp_path):
    d = ScoreDrill()
    d.setup(tmp_path, runner)
    t = kill_drill(d, runner, KILL_TRIALS["score"], SEED + 4)
    _assert_clean(t, SEED + 4)


def test_drill_notices_a_non_atomic_writer(runner, tmp_path, monkeypatch):
    """The drill can fail: a prepare that empties its output before writing is caught."""
    d = PrepareDrill(n_users=2000, n_items=200)
    d.setup(tmp_path, runner)
    d.reset(0)
    for f in d.out.iterdir():  # what a kill after a non-atomic delete would leave
        if f.name.startswith("train"):
            f.unlink()
    assert not d.allowed_after_kill(0)(_state_or_broken(d))


def _state_or_broken(d):
    from drillkit import Broken

    try:
        return d.state()
    except Broken as e:
        return ("broken", str(e))


@pytest.fixture
def tmpfs():
    if not can_mount():
        pytest.skip("the disk-full drills mount a tmpfs: root on Linux only")
    try:
        fs = Tmpfs(24 << 20)
    except OSError as e:
        pytest.skip(str(e))
    yield fs
    fs.close()


def test_prepare_on_a_full_disk_fails_cleanly(runner, tmp_path, tmpfs):
    d = PrepareDrill(n_users=2000, n_items=200)
    d.setup(tmp_path, runner, out_parent=tmpfs.path)
    d.fs = tmpfs
    need = int(1.3 * sum(f.stat().st_size for f in d.ref_b.iterdir()))
    t = disk_full_drill(d, runner, DISK_TRIALS, SEED + 2, need)
    _assert_clean(t, SEED + 2)


def test_train_on_a_full_disk_fails_cleanly(runner, tmp_path, tmpfs):
    d = TrainDrill(epochs=2)
    d.setup(tmp_path, runner, out_parent=tmpfs.path)
    d.fs = tmpfs
    need = int(1.3 * sum(f.stat().st_size for f in d.ref.iterdir()))
    t = disk_full_drill(d, runner, DISK_TRIALS, SEED + 3, need)
    _assert_clean(t, SEED + 3)


# -- two trainer issues the drills found (now fixed), reproduced deterministically ---------
@pytest.fixture(scope="module")
def short_run(runner, tmp_path_factory):
    d = TrainDrill(epochs=2)
    d.setup(tmp_path_factory.mktemp("short"), runner)
    return d


def test_trainer_issue_kill_before_config_json(runner, short_run, tmp_path):
    from drillkit import run

    out = tmp_path / "run"
    out.mkdir()
    (out / ".config.json.abc123.tmp").write_text('{"half')  # what the kill leaves
    r = run(runner, short_run._argv(out, 2, resume=True))
    assert r.rc == 0, str(r)


def test_trainer_issue_stale_results_after_extending(runner, short_run, tmp_path):
    import shutil

    from drillkit import run, run_state

    out = tmp_path / "run"
    shutil.copytree(short_run.ref_short, out)  # a finished 1-epoch run
    old_results = (out / "results.json").read_text()
    assert run(runner, short_run._argv(out, 2, resume=True)).rc == 0
    (out / "results.json").write_text(old_results)  # = killed just before results.json
    assert run(runner, short_run._argv(out, 2, resume=True)).rc == 0
    assert run_state(out) == short_run.extended_state
