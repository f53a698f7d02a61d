"""`vaecf score --out DIR/`: Parquet parts and _SUCCESS equal to one file's rows; a mismatched
re-run refused; a re-run after a kill, lost or damaged parts keeps what verifies and equals an
uninterrupted run; two torchrun processes equal one; a full disk says so and is resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

import vaecf
from tests.helpers import cli_in_process, cpu_config
from vaecf.data import synthetic
from vaecf.errors import DataError
from vaecf.recommender import Recommender
from vaecf.score import score_file
from vaecf.score.onefile import PART_ROW_BYTES
from vaecf.score.parts import PLAN, SUCCESS, names_a_directory

CHUNK = "3000"  # interactions a part: ~10 parts of the 2,000 users below


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A run (EASE), the history file of 2,000 users and its top-10 as one file."""
    root = tmp_path_factory.mktemp("parts")
    df = synthetic.generate(n_users=2000, n_items=150, n_groups=4, mean_items=12, seed=4)
    ds = vaecf.prepare_frame(df, root / "data", vaecf.PrepareSettings(heldout_users=100))
    vaecf.train(ds, cpu_config(), root / "run", model="ease")
    df.rename({"user_id": "customer"}).write_parquet(root / "hist.parquet")
    rc, err = cli_in_process(_argv(root, root / "one.parquet"))
    assert rc == 0, err
    return root, pl.read_parquet(root / "one.parquet")


def _argv(root: Path, out, *more, k: int = 10) -> list:
    """`vaecf score` of the history file at fp32 (tables compared exactly; auto may choose
    another copy), `more` after it."""
    return ["score", root / "run", "--input", root / "hist.parquet", "--out", out, "-k", k,
            "--chunk-rows", CHUNK, "--quiet", "--precision", "fp32", *more]  # fmt: skip


def _table(out: Path) -> pl.DataFrame:
    return pl.read_parquet(sorted(out.glob("part-*.parquet")))


def test_a_directory_holds_parts_equal_to_the_file_and_a_success_listing_them(setup, tmp_path):
    root, one = setup
    out = tmp_path / "recs"
    rc, err = cli_in_process(_argv(root, f"{out}/"))
    assert rc == 0, err
    assert "2000 users, 20000 rows" in err and "parts" in err
    assert _table(out).equals(one)
    done = json.loads((out / SUCCESS).read_text())
    parts = sorted(p.name for p in out.glob("part-*.parquet"))
    assert [p["name"] for p in done["parts"]] == parts and len(parts) >= 5
    assert [p["rows"] for p in done["parts"]] == [pl.read_parquet(out / p).height for p in parts]
    assert done["rows"] == one.height and done["users"] == 2000
    assert sorted(p.name for p in out.iterdir()) == sorted([*parts, PLAN, SUCCESS])


def test_what_names_a_directory(tmp_path):
    (tmp_path / "t.parquet").mkdir()
    assert names_a_directory(tmp_path / "t.parquet") and names_a_directory("recs/")
    assert names_a_directory("recs") and names_a_directory("out/recs.v2")
    assert not names_a_directory("recs.parquet") and not names_a_directory("x/RECS.CSV")


def test_a_rerun_with_other_settings_or_into_another_directory_is_refused(setup, tmp_path):
    root, _ = setup
    out = tmp_path / "recs"
    assert cli_in_process(_argv(root, out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, err = cli_in_process(_argv(root, out, k=20))
    assert rc == 2 and "another scoring (k 10 there, 20 now)" in err
    assert len(err.strip().splitlines()) == 1
    rc, err = cli_in_process([*_argv(root, out), "--precision", "bf16"])
    assert rc == 2 and "precision 'fp32' there, 'bf16' now" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    rc, err = cli_in_process(_argv(root, other))
    assert rc == 2 and "holds no vaecf score output" in err
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_auto_precision_resumes_a_directory_in_the_precision_its_parts_were_scored_in(
    setup, tmp_path
):
    root, _ = setup
    out = tmp_path / "recs"
    assert cli_in_process([*_argv(root, out), "--precision", "bf16"])[0] == 0
    (out / "part-00001.parquet").unlink()
    rc, err = cli_in_process([*_argv(root, out), "--precision", "auto"])
    assert rc == 0, err
    assert json.loads((out / PLAN).read_text())["precision"] == "bf16"
    assert "1 kept" not in err and "kept from an earlier run" in err


def test_lost_damaged_and_foreign_parts_are_scored_again(setup, tmp_path):
    root, one = setup
    out = tmp_path / "recs"
    rec = Recommender.load(root / "run")
    first = score_file(rec, root / "hist.parquet", None, None, out, k=10, chunk_rows=int(CHUNK))
    n = first["chunks"]
    (out / "part-00001.parquet").unlink()  # lost
    damaged = out / "part-00002.parquet"
    damaged.write_bytes(damaged.read_bytes()[:-40])  # torn at its end
    shutil.copyfile(out / "part-00000.parquet", out / "part-00003.parquet")  # another chunk's
    (out / SUCCESS).unlink()
    res = score_file(rec, root / "hist.parquet", None, None, out, k=10, chunk_rows=int(CHUNK))
    assert (res["parts_scored"], res["parts_kept"]) == (3, n - 3)
    assert _table(out).equals(one) and (out / SUCCESS).is_file()
    with pytest.raises(DataError, match="under torchrun"):
        from vaecf.distributed import DistContext

        score_file(rec, root / "hist.parquet", None, None, tmp_path / "x.parquet",
                   dist=DistContext(rank=0, world=2))  # fmt: skip


def test_a_killed_scoring_is_completed_by_the_same_command(setup, tmp_path):
    root, one = setup
    out = tmp_path / "recs"
    cmd = [sys.executable, "-m", "vaecf", *map(str, _argv(root, out, "--batch-users", "8"))]
    cmd[cmd.index("--chunk-rows") + 1] = "600"  # ~50 parts: the kill lands among them
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(out.glob("part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert not (out / SUCCESS).exists() or proc.returncode == 0
    rc, err = cli_in_process([*cmd[3:]])
    assert rc == 0, err
    assert _table(out).equals(one)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_two_torchrun_processes_write_what_one_process_writes(setup, tmp_path):
    root, one = setup
    out = tmp_path / "recs"
    args = [str(a) for a in _argv(root, out, "--device", "cpu")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "vaecf", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.count("2000 users, 20000 rows") == 1  # rank 0 reports the whole table
    assert _table(out).equals(one)
    done = json.loads((out / SUCCESS).read_text())
    assert done["rows"] == one.height and len(done["parts"]) == len(list(out.glob("part-*")))


@pytest.mark.parametrize("share", [0.2, 1.02])
def test_a_full_disk_says_so_and_the_same_command_completes_after(setup, share):
    """With a fifth of the parts' estimated bytes free, refused before scoring; with a little
    more than the estimate, it finishes or runs out while writing: one line either way, no
    _SUCCESS, and the same command completes once space is freed."""
    from benchmarks.drillkit import Tmpfs, can_mount

    if not can_mount():
        pytest.skip("mounts a tmpfs: root on Linux only")
    root, one = setup
    fs = Tmpfs(4 << 20)
    try:
        out = fs.path / "recs"
        filler = fs.fill(int(share * 2000 * 10 * PART_ROW_BYTES))
        rc, err = cli_in_process(_argv(root, out))
        if rc != 0:
            assert rc == 2 and "no space" in err and len(err.strip().splitlines()) == 1, err
            assert not (out / SUCCESS).exists()
            assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
            filler.unlink()
            rc, err = cli_in_process(_argv(root, out))
        assert rc == 0, err
        assert _table(out).equals(one)
    finally:
        fs.close()
