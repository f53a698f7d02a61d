"""Checkpoints on a wall-time cadence, written in the background; metrics.jsonl appended and kept
consistent with last.pt; SIGINT/SIGTERM stop after the epoch with a checkpoint; resume exact."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import vaecf
from tests.helpers import cpu_config
from vaecf.storage import checkpoint
from vaecf.training.background import CheckpointWriter, snapshot


@pytest.fixture(scope="module")
def ds(planted):
    return planted("ckpt", 600, 120, 4, 15, seed=9, heldout=60)


def cfg(**kw):
    return cpu_config(**{"epochs": 6, "batch_size": 100, "seed": 3, "preset": "paper", **kw})


def small():
    return vaecf.ModelConfig(hidden_dims=[24], latent_dim=8)


def model_weights(path):
    return torch.load(path, weights_only=True)["model"]


def test_cadence_writes_each_checkpoint_once(ds, tmp_path):
    res = vaecf.train(ds, cfg(checkpoint_every=3600), tmp_path / "r", small())
    results = json.loads((tmp_path / "r/results.json").read_text())
    rows = [json.loads(x) for x in (tmp_path / "r/metrics.jsonl").read_text().splitlines()]
    timing = results["timing"]
    assert timing["checkpoint_writes"] == 2  # best.pt and last.pt, once each, at the end
    assert torch.load(tmp_path / "r/last.pt", weights_only=True)["epoch"] == 6
    assert torch.load(tmp_path / "r/best.pt", weights_only=True)["epoch"] == res.best_epoch
    assert [r["epoch"] for r in rows] == list(range(1, 7))
    assert timing["train_s"] > 0 and timing["total_s"] >= timing["train_s"]


def test_every_epoch_cadence_gives_the_same_weights(ds, tmp_path):
    a = vaecf.train(ds, cfg(checkpoint_every=0), tmp_path / "a", small())
    b = vaecf.train(ds, cfg(checkpoint_every=3600), tmp_path / "b", small())
    wa, wb = model_weights(tmp_path / "a/last.pt"), model_weights(tmp_path / "b/last.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.test_metrics == b.test_metrics
    rows = [json.loads(x) for x in (tmp_path / "a/metrics.jsonl").read_text().splitlines()]
    improvements, best = 0, -1.0
    for r in rows:
        if r["validation"]["ndcg@100"] > best:
            best, improvements = r["validation"]["ndcg@100"], improvements + 1
    writes = json.loads((tmp_path / "a/results.json").read_text())["timing"]["checkpoint_writes"]
    assert writes == 6 + improvements  # last.pt every epoch, best.pt after each improvement
    assert torch.load(tmp_path / "a/best.pt", weights_only=True)["epoch"] == a.best_epoch


def test_metrics_running_ahead_of_last_pt_are_dropped_on_resume(ds, tmp_path):
    full = vaecf.train(ds, cfg(epochs=4), tmp_path / "full", small())
    vaecf.train(ds, cfg(epochs=2), tmp_path / "r", small())
    with open(tmp_path / "r/metrics.jsonl", "a") as f:  # as if killed after epoch 3's line
        f.write(json.dumps({"epoch": 3, "loss": -1.0}) + "\n")
    res = vaecf.train(ds, cfg(epochs=4), tmp_path / "r", resume=True)
    rows = [json.loads(x) for x in (tmp_path / "r/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["loss"] != -1.0
    assert res.test_metrics == full.test_metrics


def test_a_run_directory_deleted_while_training_is_not_made_again(ds, tmp_path):
    """Deleting the run directory under a training run stops it at the next epoch with an
    error naming it; no checkpoint makes the directory again. (A one-hour checkpoint cadence:
    no write is in flight when the callback deletes it.)"""
    import shutil

    out = tmp_path / "r"

    def delete(row):
        if row["epoch"] == 2:
            shutil.rmtree(out)

    with pytest.raises(vaecf.RunError, match="is gone"):
        vaecf.train(ds, cfg(checkpoint_every=3600), out, small(), on_epoch=delete)
    assert not out.exists()
    with pytest.raises(vaecf.RunError, match="is gone.*last.pt was not written"):
        checkpoint.save(out / "last.pt", {"epoch": 1})
    assert not out.exists()


def test_a_run_moved_while_training_continues_from_its_new_place(ds, tmp_path):
    full = vaecf.train(ds, cfg(epochs=4), tmp_path / "full", small())
    out, moved = tmp_path / "r", tmp_path / "moved"
    vaecf.train(ds, cfg(epochs=2), out, small())  # last.pt at epoch 2

    def move(row):
        if row["epoch"] == 3:
            out.rename(moved)

    with pytest.raises(vaecf.RunError, match="moved run continues"):
        vaecf.train(ds, cfg(epochs=4, checkpoint_every=3600), out, on_epoch=move, resume=True)
    assert not out.exists()
    res = vaecf.train(ds, cfg(epochs=4), moved, resume=True)
    assert res.test_metrics == full.test_metrics


def test_writer_reports_a_failed_write(tmp_path):
    w = CheckpointWriter()
    (tmp_path / "file").write_text("x")
    w.submit(tmp_path / "file" / "last.pt", snapshot({"a": torch.ones(3)}))  # parent is a file
    with pytest.raises(OSError):
        w.flush()
    w.close()


def test_snapshot_is_a_copy():
    t = torch.zeros(4)
    snap = snapshot({"x": [t, {"y": t}], "n": 3})
    t.add_(1)
    assert torch.equal(snap["x"][0], torch.zeros(4)) and snap["n"] == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_after_the_epoch_with_a_checkpoint(ds, tmp_path, sig):
    """A real `vaecf train` asked to stop saves last.pt; --resume ends where an uninterrupted
    run does, bit for bit."""
    args = [
        sys.executable, "-m", "vaecf", "train", "--data", str(ds.path), "--out",
        str(tmp_path / "r"), "--epochs", "12", "--batch-size", "50", "--preset", "paper",
        "--seed", "3", "--device", "cpu", "--precision", "fp32", "--hidden-dims", "24",
        "--latent-dim", "8", "--checkpoint-every", "3600",
    ]  # fmt: skip
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while (
        not (tmp_path / "r/metrics.jsonl").is_file()
        or not (tmp_path / "r/metrics.jsonl").read_text()
    ):
        assert time.time() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    stopped = torch.load(tmp_path / "r/last.pt", weights_only=True)["epoch"]
    assert 1 <= stopped < 12
    if sig == signal.SIGTERM:
        return  # the same path as SIGINT from here; the resume is checked once
    done = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    ref = vaecf.train(
        ds,
        cfg(epochs=12, batch_size=50, checkpoint_every=3600),
        tmp_path / "ref",
        small(),
    )
    a, b = model_weights(tmp_path / "r/last.pt"), model_weights(tmp_path / "ref/last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "r/results.json").read_text())["test"] == ref.test_metrics
    assert os.path.getsize(tmp_path / "r/metrics.jsonl") > 0


def test_a_second_trainer_into_the_same_run_is_refused(ds, tmp_path):
    out = tmp_path / "r"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom vaecf.storage.writelock import writer_lock\n"
         f"with writer_lock({str(out)!r}, 'vaecf train'):\n"
         "    print('held', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(vaecf.VaecfError, match=str(holder.pid)):
            vaecf.train(ds, cfg(epochs=1), out, small())
    finally:
        holder.kill()
        holder.wait()
    res = vaecf.train(ds, cfg(epochs=1), out, small())  # the dead holder's lock is taken over
    assert res.best_epoch == 1
