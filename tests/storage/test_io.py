"""safewrite: atomic files and directories (content, permissions, cleanup, a full disk) and the
one-writer lock (pid in the message, stale locks of dead processes taken over)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks.drillkit import Tmpfs, can_mount, drill_env
from vaecf.errors import BusyError, DataError, WriteError
from vaecf.storage import safewrite, writelock


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# -- permissions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_atomic_writes_get_the_modes_an_ordinary_write_would(tmp_path, umask, mask):
    umask(mask)
    plain = tmp_path / "plain"
    plain.write_text("x")
    (tmp_path / "plaindir").mkdir()
    with safewrite.atomic_file(tmp_path / "a.bin") as f:
        f.write(b"x")
    safewrite.write_json(tmp_path / "b.json", {"a": 1})
    safewrite.save_csr(tmp_path / "m.npz", sp.eye(3, format="csr"))
    with safewrite.atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("y")
    assert mode(plain) == 0o666 & ~mask
    for name in ("a.bin", "b.json", "m.npz"):
        assert mode(tmp_path / name) == mode(plain), name
    assert mode(tmp_path / "d") == mode(tmp_path / "plaindir") == 0o777 & ~mask
    assert safewrite.current_umask() == mask


def test_prepared_dataset_has_ordinary_modes(tmp_path, umask):
    from vaecf.data.prepare import PrepareSettings, prepare_frame
    from vaecf.data.synthetic import generate

    umask(0o022)
    ds = prepare_frame(
        generate(n_users=60, n_items=30, seed=0), tmp_path / "ds", PrepareSettings(heldout_users=5)
    )
    assert mode(ds.path) == 0o755
    assert {mode(f) for f in ds.path.iterdir()} == {0o644}


# -- atomicity -----------------------------------------------------------------------------------
def test_failed_atomic_file_keeps_old_content_and_leaves_no_temp(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), safewrite.atomic_file(target, "w") as f:
        f.write("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.json"]


def test_atomic_dir_replaces_whole_and_cleans_up(tmp_path):
    d = tmp_path / "d"
    with safewrite.atomic_dir(d) as t:
        (t / "a").write_text("1")
    with safewrite.atomic_dir(d) as t:
        (t / "b").write_text("2")
    assert os.listdir(d) == ["b"]
    assert os.listdir(tmp_path) == ["d"]
    with pytest.raises(RuntimeError), safewrite.atomic_dir(d) as t:
        (t / "c").write_text("3")
        raise RuntimeError
    assert os.listdir(d) == ["b"] and os.listdir(tmp_path) == ["d"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_exchange_swaps_two_directories_in_one_step(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "from_a").touch()
    (b / "from_b").touch()
    assert safewrite.exchange(a, b)
    assert os.listdir(a) == ["from_b"] and os.listdir(b) == ["from_a"]


def test_a_swap_cut_short_is_recovered(tmp_path):
    # without an atomic exchange, a kill between the two renames leaves only .d.old-PID
    old = tmp_path / ".d.old-12345"
    old.mkdir()
    (old / "x").write_text("kept")
    with safewrite.atomic_dir(tmp_path / "d") as t:
        assert (tmp_path / "d" / "x").read_text() == "kept"  # recovered before writing
        (t / "y").touch()
    assert os.listdir(tmp_path / "d") == ["y"]


def test_sweep_restores_a_set_aside_version_before_removing_remains(tmp_path):
    (tmp_path / ".d.old-7").mkdir()
    (tmp_path / ".d.old-7" / "x").touch()
    (tmp_path / ".d.1.tmp").mkdir()
    safewrite.sweep_temps(tmp_path / "d")
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(tmp_path / "d") == ["x"]


def test_sweep_removes_only_the_remains_of_its_target(tmp_path):
    for name in (".d.abc.tmp", ".d.old-1", ".d.json.x.tmp", ".e.abc.tmp", "d", ".d.lock"):
        (tmp_path / name).mkdir()
    removed = safewrite.sweep_temps(tmp_path / "d")
    assert sorted(p.name for p in removed) == [".d.abc.tmp", ".d.json.x.tmp", ".d.old-1"]
    assert sorted(os.listdir(tmp_path)) == [".d.lock", ".e.abc.tmp", "d"]


def test_load_csr_names_the_file_and_what_to_do(tmp_path):
    p = tmp_path / "m.npz"
    with pytest.raises(DataError, match=f"{p} is missing; prepare the dataset again"):
        safewrite.load_csr(p)
    safewrite.save_csr(p, sp.random(20, 10, 0.3, format="csr", random_state=0))
    p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(DataError, match="corrupted.*prepare the dataset again"):
        safewrite.load_csr(p)
    bad = sp.csr_matrix((np.ones(1), np.array([7]), np.array([0, 1])), shape=(1, 3))
    sp.save_npz(p, bad, compressed=False)  # a column index beyond the shape
    with pytest.raises(DataError, match="out of range"):
        safewrite.load_csr(p)


# -- a full disk ---------------------------------------------------------------------------------
@pytest.fixture
def small_fs():
    if not can_mount():
        pytest.skip("mounting a tmpfs needs root on Linux")
    try:
        fs = Tmpfs(1 << 20)
    except OSError as e:
        pytest.skip(str(e))
    yield fs
    fs.close()


def test_full_disk_is_a_write_error_naming_the_path(small_fs):
    target = small_fs.path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(WriteError) as e, safewrite.atomic_file(target) as f:
        f.write(os.urandom(2 << 20))
    assert str(target) in str(e.value) and "no space left" in str(e.value)
    assert target.read_bytes() == b"old"
    assert os.listdir(small_fs.path) == ["f.bin"]
    d = small_fs.path / "d"
    with pytest.raises(WriteError, match=str(d)), safewrite.atomic_dir(d) as t:
        (t / "big").write_bytes(os.urandom(2 << 20))
    assert os.listdir(small_fs.path) == ["f.bin"]


# -- one writer ----------------------------------------------------------------------------------
HOLD = """
import sys, time
from vaecf.storage.writelock import writer_lock
with writer_lock(sys.argv[1], "holding it for a test"):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/d."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "d")],
        stdout=subprocess.PIPE,
        text=True,
        env=drill_env(),
    )
    assert p.stdout.readline().strip() == "held"
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()


def test_lock_holds_pid_and_is_released(tmp_path):
    d = tmp_path / "d"
    with writelock.writer_lock(d) as lock:
        assert lock == tmp_path / ".d.lock"
        info = json.loads(lock.read_text())
        assert info["pid"] == os.getpid()
        with writelock.writer_lock(d):  # re-entrant in one process
            pass
        assert lock.exists()
    assert not lock.exists()


def test_second_writer_is_refused_with_the_first_ones_pid(tmp_path, holder):
    with pytest.raises(BusyError) as e, writelock.writer_lock(tmp_path / "d"):
        pass
    msg = str(e.value)
    assert f"pid {holder.pid}" in msg and "holding it for a test" in msg
    assert "wait for it to finish" in msg


def test_lock_of_a_killed_process_is_taken_over(tmp_path, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / ".d.lock").exists()  # left behind
    with writelock.writer_lock(tmp_path / "d") as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_torn_and_reused_pid_locks_are_stale(tmp_path):
    lock = tmp_path / ".d.lock"
    lock.write_text("")  # a writer killed between create and write
    with writelock.writer_lock(tmp_path / "d"):
        pass
    # our own (live) pid, but a different process start time: the pid was reused
    lock.write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "started": "1"}))
    if writelock.process_start_time(os.getpid()) is not None:
        with writelock.writer_lock(tmp_path / "d"):
            pass
    # a live process on another host cannot be checked: it is respected
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere-host"}))
    with pytest.raises(BusyError, match="pid 1"), writelock.writer_lock(tmp_path / "d"):
        pass


def test_cli_prepare_refuses_while_another_writer_holds_the_directory(tmp_path, holder):
    from tests.helpers import cli_in_process

    csv = tmp_path / "x.csv"
    csv.write_text("u,i\n" + "".join(f"{u},{i}\n" for u in range(30) for i in range(6)))
    args = ["prepare", "csv", "--path", csv, "--user-col", "u", "--item-col", "i",
            "--heldout-users", 3, "--out", tmp_path / "d"]  # fmt: skip
    rc, err = cli_in_process(args)
    assert rc == 2 and f"pid {holder.pid}" in err, err
    assert not (tmp_path / "d").exists()
    holder.kill()
    holder.wait()
    time.sleep(0.05)
    rc, err = cli_in_process(
        args
    )  # the dead holder's lock is recovered without deleting files by hand
    assert rc == 0, err
    assert not (tmp_path / ".d.lock").exists()
