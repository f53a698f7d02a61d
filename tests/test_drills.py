"""Crash drills (a share of benchmarks/drills.py): `vaecf prepare`, `train`, `score`, `tune`,
`compare`, `serve` and `export` SIGKILLed at random points, then rerun (`--resume` for train and
tune; serve: started again), and prepare and train on a nearly full tmpfs.

Each drill prints its seed; rerun one with VAECF_DRILL_SEED=N. The counts here are small (the
benchmark runs >= 100 kill points per verb); the drill kit lives in benchmarks/drillkit/.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from benchmarks.drillkit import (
    Broken,
    CompareDrill,
    ExportDrill,
    ForkRunner,
    PrepareDrill,
    ScoreDrill,
    ScoreTableDrill,
    ServeDrill,
    Tmpfs,
    TrainDrill,
    TuneDrill,
    can_mount,
    disk_full_drill,
    kill_drill,
    serve_drill,
)

SEED = int(os.environ.get("VAECF_DRILL_SEED") or random.SystemRandom().randrange(10**6))
# 1-2 kill points each; each run draws its own points (SEED), so the suite's runs add up to more
# than one run's trials (fewer trials a run keep the whole suite within its 10 minutes)
KILL_TRIALS = {
    "prepare": 10, "train": 7, "score": 6, "tune": 2, "compare": 2, "serve": 5, "export": 6,
    "score-table": 5,
}  # fmt: skip
DISK_TRIALS = 3


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
    # the kills that found prepare running (a moment drawn past its end on a busy machine
    # does not count): most of them, so the drill did test something
    assert t.points >= KILL_TRIALS["prepare"] // 2
    # the reruns swept what the kills left beside the output
    assert [p.name for p in d.out.parent.iterdir()] == ["ds"]


def test_killed_train_resumes_to_the_same_weights_bit_for_bit(runner, tmp_path):
    d = TrainDrill(epochs=3)
    d.setup(tmp_path, runner)
    # item 7: the run directory's files have the modes an ordinary write would (not 0600)
    from vaecf.storage.safewrite import current_umask

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


def test_killed_score_into_a_directory_keeps_its_parts_and_the_rerun_completes(runner, tmp_path):
    d = ScoreTableDrill()
    d.setup(tmp_path, runner)
    t = kill_drill(d, runner, KILL_TRIALS["score-table"], SEED + 5)
    _assert_clean(t, SEED + 5)


@pytest.fixture(scope="module")
def export_drill(runner, tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    d = ExportDrill()
    d.setup(tmp_path_factory.mktemp("export"), runner)  # checks that export is deterministic
    return d


def test_killed_export_leaves_old_or_new_and_rerun_completes(runner, export_drill):
    d = export_drill
    t = kill_drill(d, runner, KILL_TRIALS["export"], SEED + 8)
    _assert_clean(t, SEED + 8)
    # what the kills may leave beside it: temp files of the export only (a rerun writes under a
    # fresh temp name and leaves them, as score does its own)
    names = [p.name for p in d.out.parent.iterdir()]
    assert "model.onnx" in names
    assert all(n == "model.onnx" or (n.startswith(".model.onnx.") and n.endswith(".tmp"))
               for n in names), names  # fmt: skip


def test_export_drill_notices_a_torn_file_and_reruns_past_torn_temps(runner, export_drill):
    """A torn ONNX file under the final name is a failure (onnx_state raises Broken); a torn
    temp file beside the output (a kill's remains) neither counts nor stops the rerun."""
    from benchmarks.drillkit import run

    d = export_drill
    d.reset(1)
    data = d.ref_new.read_bytes()
    d.out.write_bytes(data[: len(data) // 2])  # what a kill inside a plain write would leave
    assert not d.allowed_after_kill(0)(_state_or_broken(d))
    assert not d.allowed_after_kill(1)(_state_or_broken(d))
    d.reset(0)
    torn = d.out.parent / ".model.onnx.abcd1234.tmp"
    torn.write_bytes(data[:1000])
    assert d.state() == d.state_old
    r = run(runner, d.command(0))
    assert r.rc == 0, str(r)
    assert d.state() == d.state_new
    assert torn.read_bytes() == data[:1000]  # not swept: another export's file, perhaps live


@pytest.fixture(scope="module")
def tune_drill(runner, tmp_path_factory):
    pytest.importorskip("optuna")
    d = TuneDrill()
    d.setup(tmp_path_factory.mktemp("tune"), runner)  # checks that retraining matches
    return d


def test_killed_tune_resumes_without_losing_or_repeating_a_trial(runner, tune_drill):
    t = kill_drill(tune_drill, runner, KILL_TRIALS["tune"], SEED + 5)
    _assert_clean(t, SEED + 5)


def test_killed_compare_reaches_the_same_tables_byte_for_byte(runner, tmp_path):
    d = CompareDrill()
    d.setup(tmp_path, runner)
    t = kill_drill(d, runner, KILL_TRIALS["compare"], SEED + 6)
    _assert_clean(t, SEED + 6)


def test_killed_serve_writes_nothing_and_answers_the_same_after_a_restart(runner, tmp_path):
    pytest.importorskip("uvicorn")
    d = ServeDrill()
    d.setup(tmp_path, runner)
    t = serve_drill(d, runner, KILL_TRIALS["serve"], SEED + 7)
    _assert_clean(t, SEED + 7)
    assert t.points >= KILL_TRIALS["serve"]


def test_tune_drill_notices_lost_torn_and_wrong_trials(tune_drill, tmp_path):
    """The tune drill can fail: a study short of trials, a finished trial gone, a value that
    retraining does not give, a torn best.json and a trials.csv that disagrees are all caught."""
    import dataclasses
    import shutil

    d, new = tune_drill, tune_drill.new_state
    d.seen.clear()  # (what the kill drill saw)
    assert d.check_final(0, new) is None
    assert "finished trials" in d.check_final(0, d.old_state)
    assert "lost" in d.check_final(1, dataclasses.replace(new, trials=new.trials[1:]))
    wrong = dataclasses.replace(new.trials[0], value=new.trials[0].value + 1e-9)
    assert "retrained" in d.check_final(
        0, dataclasses.replace(new, trials=(wrong, *new.trials[1:]))
    )
    study = tmp_path / "study"
    shutil.copytree(d.ref_new, study)
    text = (study / "best.json").read_text()
    (study / "best.json").write_text(text[: len(text) // 2])  # a kill inside a plain write
    with pytest.raises(Broken, match="best.json"):
        _study(study)
    (study / "best.json").write_text(text)
    csv = (study / "trials.csv").read_text().splitlines()
    (study / "trials.csv").write_text("\n".join(csv[:-1]) + "\n")
    _study(study)  # an older table (a trial short) is consistent
    changed = csv[-1].replace(",0.", ",0.9", 1)  # the last trial's value
    (study / "trials.csv").write_text("\n".join([*csv[:-1], changed]) + "\n")
    with pytest.raises(Broken, match="trials.csv row .* disagrees"):
        _study(study)


def _study(path):
    from benchmarks.drillkit import study_state

    return study_state(path)


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
    from benchmarks.drillkit import Broken

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


def test_a_run_copying_its_vocabulary_onto_a_full_disk_names_the_run(tmp_path, tmpfs):
    """A train's copy of the dataset's items.parquet into its run: on a full disk the error
    names the run's disk, not the dataset's file (shutil.copyfile's did), and the run's old
    copy stays whole with no temp file beside it."""
    from vaecf.errors import WriteError
    from vaecf.rundir import copy_file

    src = tmp_path / "items.parquet"
    src.write_bytes(os.urandom(256 << 10))
    dst = tmpfs.path / "run" / "items.parquet"
    dst.parent.mkdir()
    dst.write_bytes(b"old")
    filler = tmpfs.fill(16 << 10)
    with pytest.raises(WriteError, match="no space") as e:
        copy_file(src, dst)
    assert str(dst) in str(e.value) and str(src) not in str(e.value)
    assert dst.read_bytes() == b"old" and sorted(dst.parent.iterdir()) == [dst]
    filler.unlink()
    copy_file(src, dst)
    assert dst.read_bytes() == src.read_bytes()


def test_train_on_a_full_disk_fails_cleanly(runner, tmp_path, tmpfs):
    d = TrainDrill(epochs=2)
    d.setup(tmp_path, runner, out_parent=tmpfs.path)
    d.fs = tmpfs
    need = int(1.3 * sum(f.stat().st_size for f in d.ref.iterdir()))
    t = disk_full_drill(d, runner, DISK_TRIALS, SEED + 3, need)
    _assert_clean(t, SEED + 3)


def _bytes(path: Path) -> int:
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(_bytes(p) for p in path.iterdir())


@pytest.mark.parametrize("verb", ["score", "export", "compare"])
def test_score_export_compare_on_a_full_disk_fail_cleanly(runner, tmp_path, tmpfs, verb):
    """Each writer on a disk with 0..3x its output free: it succeeds with the complete output,
    or exits 2 naming the path and 'no space' with the old output intact and no temp files;
    once space is freed the rerun completes (score keeps parts beside its output, hence 3x)."""
    d = {"score": ScoreDrill, "export": ExportDrill, "compare": CompareDrill}[verb]()
    d.setup(tmp_path, runner, out_parent=tmpfs.path)
    d.fs = tmpfs
    ref_new = d.ref_new
    need = int(3 * _bytes(ref_new))
    seed = SEED + {"score": 30, "export": 31, "compare": 32}[verb]
    t = disk_full_drill(d, runner, DISK_TRIALS, seed, need)
    _assert_clean(t, seed)


def test_tune_on_a_full_disk_fails_cleanly_and_resumes(runner, tmp_path, tmpfs):
    """tune on a disk with 0..1.5x its study's bytes free: it finishes, or exits 2 naming the
    path and 'no space' with every finished trial intact; `tune --resume` then completes the
    study with the kill drill's invariants (no trial lost, none twice, values as retrained)."""
    pytest.importorskip("optuna")
    d = TuneDrill()
    d.setup(tmp_path, runner, out_parent=tmpfs.path)
    d.fs = tmpfs
    need = int(1.5 * _bytes(d.ref_new))
    t = disk_full_drill(d, runner, 2, SEED + 33, need)
    _assert_clean(t, SEED + 33)


# -- two trainer issues the drills found (now fixed), reproduced deterministically ---------
@pytest.fixture(scope="module")
def short_run(runner, tmp_path_factory):
    d = TrainDrill(epochs=2)
    d.setup(tmp_path_factory.mktemp("short"), runner)
    return d


def test_trainer_issue_kill_before_config_json(runner, short_run, tmp_path):
    from benchmarks.drillkit import run

    out = tmp_path / "run"
    out.mkdir()
    (out / ".config.json.abc123.tmp").write_text('{"half')  # what the kill leaves
    r = run(runner, short_run.train_argv(out, 2, resume=True))
    assert r.rc == 0, str(r)


def test_trainer_issue_stale_results_after_extending(runner, short_run, tmp_path):
    import shutil

    from benchmarks.drillkit import run, run_state

    out = tmp_path / "run"
    shutil.copytree(short_run.ref_short, out)  # a finished 1-epoch run
    old_results = (out / "results.json").read_text()
    assert run(runner, short_run.train_argv(out, 2, resume=True)).rc == 0
    (out / "results.json").write_text(old_results)  # = killed just before results.json
    assert run(runner, short_run.train_argv(out, 2, resume=True)).rc == 0
    assert run_state(out) == short_run.extended_state


# -- a compare issue the drill's invariants exposed (now fixed), reproduced deterministically --
class _Killed(Exception):
    """Stands for a SIGKILL landing inside a write."""


def test_compare_killed_while_writing_keeps_the_old_tables_and_chart(tmp_path, monkeypatch):
    """compare_splits.csv, compare_summary.csv and compare.png (and tune's history.png and
    importance.png) were written in place: a process killed inside the write left the old table
    or chart truncated under its final name. Now each goes through a temp file and a rename."""
    import csv

    import matplotlib.figure

    from vaecf.experiments import compare

    def summary(shift):
        def test(lab, s):
            return {m: 0.1 * s + shift + (lab == "b") * 0.01 * s**2 for m in compare.METRICS}

        recs = [
            compare.Record(lab, f"seed {s}", f"fp{s}", tmp_path / lab / str(s), test(lab, s))
            for lab in ("a", "b")
            for s in (1, 2, 3)
        ]
        return compare.summarize(recs)

    out = tmp_path / "cmp"
    compare.write_outputs(summary(0.0), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_writer = csv.writer

    def dying_writer(f, *args, **kwargs):
        w, rows = real_writer(f, *args, **kwargs), []

        class Writer:
            def writerow(self, row):
                rows.append(row)
                if len(rows) == 3:
                    raise _Killed
                return w.writerow(row)

        return Writer()

    monkeypatch.setattr(csv, "writer", dying_writer)
    with pytest.raises(_Killed):
        compare.write_outputs(summary(0.01), out)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # whole; no temp files

    def torn_savefig(fig, fname, **kwargs):
        data = b"\x89PNG\r\n\x1a\n half a chart"
        fname.write(data) if hasattr(fname, "write") else open(fname, "wb").write(data)
        raise _Killed

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", torn_savefig)
    with pytest.raises(_Killed):
        compare.write_outputs(summary(0.01), out)
    # the tables are the new ones now; the chart is the old one, whole; no temp files beside
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    assert (out / "compare.png").read_bytes() == before["compare.png"]
