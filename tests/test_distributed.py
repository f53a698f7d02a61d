"""Data-parallel training with torchrun: 2 CPU processes (gloo) against one process."""

import json
import os
import subprocess
import sys

import pytest
import torch

import vaecf
from vaecf.data import synthetic
from vaecf.distributed import DistContext


def test_shards_cover_the_global_batch_in_order():
    rows = torch.arange(11)
    parts = [DistContext(rank=r, world=3).shard(rows) for r in range(3)]
    assert torch.equal(torch.cat(parts), rows)
    assert [p.numel() for p in parts] == [4, 4, 3]
    assert torch.equal(DistContext().shard(rows), rows)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    df = synthetic.generate(n_users=700, n_items=120, n_groups=4, mean_items=15, seed=5)
    return vaecf.prepare_frame(
        df,
        tmp_path_factory.mktemp("dist") / "prep",
        vaecf.PrepareSettings(heldout_users=60, seed=5),
    )


def _train_cmd(ds, out, nproc, *extra):
    args = [
        "-m",
        "vaecf",
        "train",
        "--data",
        str(ds.path),
        "--out",
        str(out),
        "--epochs",
        "2",
        "--batch-size",
        "125",
        "--device",
        "cpu",
        "--precision",
        "fp32",  # compared within float tolerance: pinned whatever the default becomes
        "--quiet",
        "--json",
        *extra,
    ]
    if nproc == 1:
        return [sys.executable, *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *args,
    ]


def _run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_two_processes_match_one(ds, tmp_path):
    # Mult-DAE without dropout is deterministic given the batches: the only differences left
    # are the gradient all-reduce and the loss scaling, which must reproduce the global mean.
    extra = ("--model", "multdae", "--dropout", "0")
    _run(_train_cmd(ds, tmp_path / "one", 1, *extra))
    _run(_train_cmd(ds, tmp_path / "two", 2, *extra))
    a = torch.load(tmp_path / "one/last.pt", weights_only=True)
    b = torch.load(tmp_path / "two/last.pt", weights_only=True)
    assert a["step"] == b["step"] > 0
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5)
    ra = json.loads((tmp_path / "one/results.json").read_text())
    rb = json.loads((tmp_path / "two/results.json").read_text())
    assert rb["test"]["n_users"] == ra["test"]["n_users"]  # all-reduced over both ranks
    assert rb["test"]["ndcg@100"] == pytest.approx(ra["test"]["ndcg@100"], abs=1e-3)
    assert rb["validation"]["ndcg@100"] == pytest.approx(ra["validation"]["ndcg@100"], abs=1e-3)


def test_torchrun_vae_and_resume(ds, tmp_path):
    p = _run(_train_cmd(ds, tmp_path / "vae", 2))
    res = json.loads(p.stdout)
    assert 0 < res["test"]["ndcg@100"] <= 1
    lines = (tmp_path / "vae/metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # rank 0 alone writes
    cmd = _train_cmd(ds, tmp_path / "vae", 2, "--resume")
    cmd[cmd.index("--epochs") + 1] = "3"
    _run(cmd)
    assert len((tmp_path / "vae/metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_two_gpus(ds, tmp_path):
    cmd = _train_cmd(ds, tmp_path / "gpu", 2)
    cmd[cmd.index("--device") + 1] = "cuda"
    _run(cmd)


def test_torchrun_recvae_two_optimizers(ds, tmp_path):
    """RecVAE's phases leave one parameter group unused per step: DDP must cope."""
    small = ("--model", "recvae", "--hidden-dim", "16", "--latent-dim", "8", "--n-layers", "2")
    p = _run(_train_cmd(ds, tmp_path / "rv", 2, *small))
    res = json.loads(p.stdout)
    assert 0 < res["test"]["ndcg@100"] <= 1
    ck = torch.load(tmp_path / "rv/last.pt", weights_only=True)
    assert set(ck["optimizer"]) == {"encoder", "decoder"}
