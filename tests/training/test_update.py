"""`vaecf update`: a linear model solved again at the settings its run chose (bit for bit what a
train at those settings gives), an autoencoder's weights carried over item by item (new items
at the mean of the old), the old run untouched (also by a kill or a full disk), the refusals in
one line, and a server reloaded onto the new run."""

import hashlib
import json
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
import torch

import vaecf
from tests.helpers import cli_in_process, cpu_config
from vaecf import models, rundir
from vaecf.data import synthetic
from vaecf.data.vocab import Vocabulary
from vaecf.errors import DataError, RunError
from vaecf.training.single import train
from vaecf.training.update import item_map, update, warm_start


def digest(run) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.iterdir()) if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def older_newer(tmp_path_factory):
    """The newer data: more users and rows, 10 items the older never had."""
    root = tmp_path_factory.mktemp("update")
    df = synthetic.generate(n_users=500, n_items=70, n_groups=4, mean_items=10, seed=3)
    older = df.filter((pl.col("user_id") < 400) & (pl.col("item_id") < 60))
    settings = vaecf.PrepareSettings(heldout_users=40, seed=1)
    return (vaecf.prepare_frame(older, root / "old", settings),
            vaecf.prepare_frame(df, root / "new", settings), root)  # fmt: skip


def test_a_linear_update_solves_once_at_the_chosen_settings(older_newer):
    old, new, root = older_newer
    vaecf.train(old, cpu_config(), root / "ease-old", model="ease")
    chosen = json.loads((root / "ease-old" / "config.json").read_text())["model"]["config"]["l2"]
    before = digest(root / "ease-old")
    res = update(root / "ease-old", new, root / "ease-upd", progress=False, device="cpu")
    assert digest(root / "ease-old") == before  # never over the old run
    cfg = json.loads((res.run_dir / "config.json").read_text())["model"]["config"]
    assert cfg["l2"] == chosen and cfg["l2_grid"] == [chosen]  # no search
    same = vaecf.train(new, cpu_config(), root / "ease-at", models.config_from_dict(
        "ease", {"l2": chosen, "l2_grid": [chosen]}), model="ease")  # fmt: skip
    a = vaecf.Recommender.load(res.run_dir).model.weight
    b = vaecf.Recommender.load(same.run_dir).model.weight
    assert torch.equal(a, b) and a.shape[0] == new.n_items


def test_warm_start_carries_each_item_over_by_id():
    small = models.config_from_dict("multvae", {"hidden_dims": [4], "latent_dim": 2})
    old = models.build("multvae", 5, small)
    new = models.build("multvae", 7, old.config)
    pos = np.array([4, 0, -1, 2, 1, 3, -1])  # new item i was old item pos[i]; -1: new
    warm_start(old.state_dict(), 5, pos)(new)
    o, n = old.state_dict(), new.state_dict()
    for name, t in n.items():
        dims = [d for d in range(t.dim()) if t.shape[d] == 7]
        if not dims:
            assert torch.equal(t, o[name]), name
            continue
        d = dims[0]
        for i, p in enumerate(pos):
            row = t.select(d, i)
            want = o[name].select(d, int(p)) if p >= 0 else o[name].mean(dim=d)
            assert torch.allclose(row, want), (name, i)


def test_a_shrunk_warm_start_is_between_the_run_and_a_fresh_start():
    small = models.config_from_dict("recvae", {"hidden_dim": 4, "latent_dim": 2})
    old = models.build("recvae", 5, small)
    pos = np.array([4, 0, -1, 2, 1, 3, -1])
    torch.manual_seed(7)
    fresh = models.build("recvae", 7, old.config).state_dict()
    torch.manual_seed(7)
    carried = models.build("recvae", 7, old.config)
    warm_start(old.state_dict(), 5, pos)(carried)
    torch.manual_seed(7)
    shrunk = models.build("recvae", 7, old.config)
    warm_start(old.state_dict(), 5, pos, keep=0.5)(shrunk)
    for name, t in shrunk.state_dict().items():
        want = 0.5 * carried.state_dict()[name] + 0.5 * fresh[name]
        assert torch.allclose(t, want), name
    assert not torch.allclose(shrunk.decoder.weight, carried.decoder.weight)


def test_an_autoencoder_update_starts_from_the_run(older_newer):
    old, new, root = older_newer
    cfg = cpu_config(seed=2, epochs=4, batch_size=100)
    vaecf.train(old, cfg, root / "mv-old", model="multvae")
    before = digest(root / "mv-old")
    res = update(root / "mv-old", new, root / "mv-upd", progress=False, device="cpu")
    assert digest(root / "mv-old") == before
    rec = vaecf.Recommender.load(res.run_dir)
    assert rec.model.n_items == new.n_items and res.test_metrics["n_users"] > 0
    saved = json.loads((res.run_dir / "config.json").read_text())
    assert saved["train"]["patience"] == 1  # an epoch without gain ends an update


def test_an_update_keeps_its_warm_start_where_no_epoch_beats_it(older_newer):
    """Early stopping counts the warm start as epoch 0 (an update is never forced onto a worse
    epoch of its own): at a learning rate too small to move a weight no epoch beats it, so the
    update stops after its patience and keeps the warm start, bit for bit."""
    old, new, root = older_newer
    vaecf.train(old, cpu_config(seed=4, epochs=3, batch_size=100), root / "w0-old", model="multvae")
    net, _ = rundir.load_model(root / "w0-old", "cpu")
    pos = item_map(Vocabulary.load(root / "w0-old" / rundir.ITEMS), new.items, root, new.path)
    init = warm_start(net.state_dict(), net.n_items, pos)
    cfg = cpu_config(seed=4, epochs=6, batch_size=100, lr=1e-30, patience=2)
    res = train(new, cfg, root / "w0-upd", net.config, model="multvae", init=init)
    assert res.best_epoch == 0 and len(res.history) == 2  # stopped after its patience
    assert json.loads((res.run_dir / "results.json").read_text())["best_epoch"] == 0
    want = models.build("multvae", new.n_items, net.config)
    init(want)
    got, _ = rundir.load_model(res.run_dir, "cpu")
    for name, t in want.state_dict().items():
        assert torch.equal(got.state_dict()[name], t), name


def test_an_update_validates_an_epoch_of_its_own_whatever_the_runs_eval_every(older_newer):
    """A run validated every 2 epochs: its update's patience (1 by default) is raised to 2, so
    that an epoch of the update's own is validated before early stopping can end it."""
    old, new, root = older_newer
    cfg = cpu_config(seed=5, epochs=2, batch_size=100, eval_every=2)
    vaecf.train(old, cfg, root / "e2-old", model="multvae")
    res = update(root / "e2-old", new, root / "e2-upd", progress=False, device="cpu")
    assert json.loads((res.run_dir / "config.json").read_text())["train"]["patience"] == 2
    assert any("validation" in row for row in res.history)


def test_an_ease_update_of_a_few_rows_updates_the_runs_inverse(tmp_path, capsys):
    """Five histories a little longer (and the held-out rows the new split moves): the run's
    inverse updated by the rows that changed, the B of a solve at the same lambda to float
    rounding; where the run's dataset is gone, the solve itself."""
    df = synthetic.generate(n_users=500, n_items=300, n_groups=4, mean_items=10, seed=3)
    settings = vaecf.PrepareSettings(heldout_users=40, seed=1)
    new = vaecf.prepare_frame(df, tmp_path / "new", settings)
    grew = new.users.filter(pl.col("split") == "train").get_column("user_id").head(5)
    last = pl.col("item_id") == pl.col("item_id").max().over("user_id")
    older = df.filter(~(pl.col("user_id").is_in(grew.implode()) & last))
    old = vaecf.prepare_frame(older, tmp_path / "old", settings)
    vaecf.train(old, cpu_config(), tmp_path / "run", model="ease")
    capsys.readouterr()
    res = update(tmp_path / "run", new, tmp_path / "upd", progress=True, device="cpu")
    row = res.history[0]
    assert 0 < row["rows_added"] + row["rows_removed"] < 300 * 0.41, row
    said = f"({row['rows_added']:,} added, {row['rows_removed']:,} removed) in place of the solve"
    assert said in capsys.readouterr().out  # the route taken, said as it runs
    l2 = row["l2"]
    same = vaecf.train(new, cpu_config(), tmp_path / "same", models.config_from_dict(
        "ease", {"l2": l2, "l2_grid": [l2]}), model="ease")  # fmt: skip
    a, b = (vaecf.Recommender.load(r.run_dir).model for r in (res, same))
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=1e-6 * b.weight.abs().max())
    torch.testing.assert_close(a.p_diag, b.p_diag, rtol=1e-5, atol=0)
    assert abs(res.test_metrics["ndcg@100"] - same.test_metrics["ndcg@100"]) < 1e-6
    kept = vaecf.rundir.load_rows(tmp_path / "run")  # the run keeps its rows: its data may go
    fold_in = vaecf.rundir.load_config(tmp_path / "run")["model"]["config"]["fold_in_rows"]
    parts = ["train"] + (["validation_tr", "test_tr"] if fold_in else [])
    want = sp.vstack([old.split(s) for s in parts]).tocsr()
    assert kept.shape == want.shape and (kept != want).nnz == 0
    old.path.rename(tmp_path / "moved")
    again = update(tmp_path / "run", new, tmp_path / "upd2", progress=True, device="cpu")
    assert again.history[0]["rows_added"] == row["rows_added"]
    assert said in capsys.readouterr().out
    (tmp_path / "run" / vaecf.rundir.GRAM_ROWS).unlink()  # neither the rows nor the data: solved
    again = update(tmp_path / "run", new, tmp_path / "upd3", progress=True, device="cpu")
    assert "rows_added" not in again.history[0]
    assert f"EASE: solved again: the run's prepared data is gone from {old.path}" in (
        capsys.readouterr().out
    )
    assert torch.equal(vaecf.Recommender.load(again.run_dir).model.weight, b.weight)
    chained = update(tmp_path / "upd", new, tmp_path / "upd4", progress=True, device="cpu")
    assert (chained.history[0]["rows_added"], chained.history[0]["rows_removed"]) == (0, 0)


def test_refusals_are_one_line(older_newer, tmp_path):
    old, new, root = older_newer
    if not (root / "ease-old").exists():
        vaecf.train(old, cpu_config(), root / "ease-old", model="ease")
    for out in (root / "ease-old", root / "ease-upd2"):
        if out.name == "ease-upd2":
            update(root / "ease-old", new, out, progress=False, device="cpu")
        rc, err = cli_in_process(["update", root / "ease-old", "--data", new.path, "--out", out])
        assert rc == 2 and "never over one" in err and len(err.strip().splitlines()) == 1
    other = synthetic.generate(n_users=200, n_items=40, n_groups=4, mean_items=8, seed=0)
    other = other.with_columns(pl.col("item_id").cast(pl.String) + "x")  # another source's ids
    foreign = vaecf.prepare_frame(
        other, tmp_path / "foreign", vaecf.PrepareSettings(heldout_users=20)
    )
    with pytest.raises(DataError, match="not a newer preparation of the run's data"):
        update(root / "ease-old", foreign, tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists()
    with pytest.raises(RunError, match="never over one"):
        update(root / "ease-old", new, root / "ease-old", progress=False)


def test_a_killed_update_leaves_the_old_run_and_train_resume_completes_it(older_newer):
    old, new, root = older_newer
    cfg = cpu_config(seed=3, epochs=40, batch_size=20, patience=None)
    vaecf.train(old, cfg, root / "k-old", model="multvae")
    before = digest(root / "k-old")
    out = root / "k-upd"
    cmd = [sys.executable, "-m", "vaecf", "update", str(root / "k-old"), "--data", str(new.path),
           "--out", str(out), "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (out / "config.json").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # into the training
    assert proc.poll() is None, "the update ended before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert digest(root / "k-old") == before
    # an interrupted update: train --resume completes it
    rc, err = cli_in_process(["train", "--data", new.path, "--out", out, "--resume",
                              "--device", "cpu"])  # fmt: skip
    assert rc == 0, err
    assert vaecf.Recommender.load(out).model.n_items == new.n_items


@pytest.mark.parametrize("share", [0.05, 0.4, 0.8])
def test_an_update_onto_a_full_disk_says_so_and_completes_once_space_is_freed(older_newer, share):
    """The new run on a disk with a share of what it needs: one line naming the lack of space,
    exit 2, the old run as it was, nothing there that loads as a run; once space is freed,
    `train --resume` completes the update (as after a kill), or a new update where nothing
    was written."""
    from benchmarks.drillkit import Tmpfs, can_mount

    if not can_mount():
        pytest.skip("mounts a tmpfs: root on Linux only")
    old, new, root = older_newer
    if not (root / "ease-old").exists():
        vaecf.train(old, cpu_config(), root / "ease-old", model="ease")
    before = digest(root / "ease-old")
    if not (root / "ease-ref").exists():
        update(root / "ease-old", new, root / "ease-ref", progress=False, device="cpu")
    need = sum(p.stat().st_size for p in (root / "ease-ref").rglob("*") if p.is_file())
    fs = Tmpfs(8 << 20)
    try:
        filler = fs.fill(int(share * need))
        out = fs.path / "upd"
        rc, err = cli_in_process(["update", root / "ease-old", "--data", new.path, "--out", out])
        assert digest(root / "ease-old") == before
        assert rc == 2 and "no space" in err and len(err.strip().splitlines()) == 1, err
        with pytest.raises(RunError):  # nothing there loads as a run
            vaecf.Recommender.load(out)
        filler.unlink()
        if out.exists():
            rc, err = cli_in_process(["train", "--data", new.path, "--out", out, "--resume",
                                      "--device", "cpu"])  # fmt: skip
            assert rc == 0, err
        else:
            update(root / "ease-old", new, out, progress=False, device="cpu")
        got, ref = vaecf.Recommender.load(out), vaecf.Recommender.load(root / "ease-ref")
        assert got.recommend([0, 1, 2], k=5).item_ids == ref.recommend([0, 1, 2], k=5).item_ids
    finally:
        fs.close()


def test_the_server_reloads_onto_an_updated_run_with_its_new_items(older_newer):
    """A server of the old run, reloaded onto its update: the new run's catalogue (new items
    known, and recommended from their neighbours), the same answers as the run loaded anew."""
    from tests.serve.helpers import running
    from vaecf.config.serve import ServeSettings

    old, new, root = older_newer
    if not (root / "ease-old").exists():
        vaecf.train(old, cpu_config(), root / "ease-old", model="ease")
    if not (root / "ease-ref").exists():
        update(root / "ease-old", new, root / "ease-ref", progress=False, device="cpu")
    fresh = vaecf.Recommender.load(root / "ease-ref")
    new_item = next(i for i in fresh.items.ids.to_list() if i >= 60)  # the older data had < 60
    settings = ServeSettings(run=str(root / "ease-old"), reload_min_interval_s=0,
                             precision="fp32")  # fmt: skip
    with running(settings) as (base, _), httpx.Client(base_url=base, timeout=30) as c:
        before = c.post("/v1/recommend", json={"items": [new_item], "k": 5}).json()
        assert before["unknown"] == [new_item]
        r = c.post("/v1/admin/reload", json={"run": str(root / "ease-ref")})
        assert r.status_code == 200, r.text
        after = c.post("/v1/recommend", json={"items": [new_item], "k": 5}).json()
        assert after["unknown"] == []
        assert [i["item_id"] for i in after["items"]] == fresh.recommend([new_item], k=5).item_ids
