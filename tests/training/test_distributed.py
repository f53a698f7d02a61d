"""Data-parallel training with torchrun: 2 CPU processes (gloo) against one process."""

import json
import os
import subprocess
import sys

import pytest
import torch

from vaecf.distributed import DistContext


def test_shards_cover_the_global_batch_in_order():
    rows = torch.arange(11)
    parts = [DistContext(rank=r, world=3).shard(rows) for r in range(3)]
    assert torch.equal(torch.cat(parts), rows)
    assert [p.numel() for p in parts] == [4, 4, 3]
    assert torch.equal(DistContext().shard(rows), rows)


@pytest.fixture(scope="module")
def ds(planted):
    return planted("dist", 700, 120, 4, 15, seed=5, heldout=60)


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


def test_torchrun_vae(ds, tmp_path):
    """Mult-VAE (sampling, dropout) under two standalone processes: rank 0 alone writes. That two
    processes train what one does, and resume, is the two-launcher drill below."""
    p = _run(_train_cmd(ds, tmp_path / "vae", 2))
    res = json.loads(p.stdout)
    assert 0 < res["test"]["ndcg@100"] <= 1
    lines = (tmp_path / "vae/metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # rank 0 alone writes


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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(pid: int) -> None:
    """SIGKILL a launcher and its workers (torchrun starts each in a session of its own)."""
    import signal
    from pathlib import Path

    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the parent's pid
            children.append(int(stat.parent.name))
    for p in [pid, *children]:
        try:
            os.killpg(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_two_launchers_on_loopback_survive_a_killed_node(ds, tmp_path):
    """Two torchrun launchers (as on two machines: --nnodes 2, c10d rendezvous on 127.0.0.1),
    each in its own directory with its own copy of the prepared data and no shared run
    directory. One launcher is killed mid-run; both are started again with --resume, and the
    run ends where one process training without interruption ends."""
    import shutil
    import time

    epochs = "40"
    extra = ("--model", "multdae", "--dropout", "0", "--checkpoint-every", "0")
    one = _train_cmd(ds, tmp_path / "one", 1, *extra)
    one[one.index("--epochs") + 1] = epochs
    _run(one)
    nodes = [tmp_path / "node-a", tmp_path / "node-b"]
    for node in nodes:
        shutil.copytree(ds.path, node / "prep")  # each node's own copy, at the same path
    port = _free_port()

    def launch(*more, first=0):
        cmd = _train_cmd(ds, "run", 2, *extra, *more)
        cmd[cmd.index("--epochs") + 1] = epochs
        cmd[cmd.index("--data") + 1] = "prep"
        at = cmd.index("--standalone")
        cmd[at : at + 2] = [
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=vaecf-two-nodes",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return [
            subprocess.Popen(
                cmd,
                cwd=node,
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for node in (nodes if first == 0 else nodes[::-1])  # first: the lower pid, rank 0
        ]

    def lines(node):
        path = node / "run" / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else 0

    procs = launch()
    try:
        deadline = time.monotonic() + 120
        while max(lines(n) for n in nodes) < 3 and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
            time.sleep(0.02)
        main = [n for n in nodes if (n / "run").is_dir()]
        assert len(main) == 1  # rank 0's node alone holds the run directory
        other = nodes[1 - nodes.index(main[0])]
        _kill_tree(procs[nodes.index(other)].pid)  # the other machine dies
        procs[nodes.index(main[0])].wait(timeout=120)  # its peer gone, rank 0's launcher stops
        killed_at = lines(main[0])
        assert 3 <= killed_at < int(epochs)
        assert not (main[0] / "run" / "results.json").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_tree(p.pid)
            p.communicate()
    procs = launch("--resume", first=nodes.index(main[0]))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    run = main[0] / "run"
    assert not (other / "run").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == int(epochs)
    a = torch.load(tmp_path / "one/last.pt", weights_only=True)
    b = torch.load(run / "last.pt", weights_only=True)
    assert a["step"] == b["step"] > 0 and b["epoch"] == int(epochs)
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5)
    ra = json.loads((tmp_path / "one/results.json").read_text())
    rb = json.loads((run / "results.json").read_text())
    assert rb["test"]["n_users"] == ra["test"]["n_users"]  # all-reduced over both ranks
    assert rb["test"]["ndcg@100"] == pytest.approx(ra["test"]["ndcg@100"], abs=1e-3)
    assert rb["validation"]["ndcg@100"] == pytest.approx(ra["validation"]["ndcg@100"], abs=1e-3)
    # ranked the other way round, rank 0 would start a new run on the machine without it
    procs = launch("--resume", first=nodes.index(other))
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode != 0 for p in procs)
    assert any("rank 0, which writes the run, is on a machine without run" in o[1] for o in outs)
    assert not (other / "run").exists()
