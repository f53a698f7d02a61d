"""GradientFit: annealing, determinism, resume bit-for-bit, model selection, beats popularity."""

import json

import pytest
import torch

import vaecf
from vaecf.data import synthetic
from vaecf.data.matrix import CSR


@pytest.fixture(scope="module")
def small_ds(planted):
    return planted("train", 900, 200, 6, 20, seed=3, heldout=100)


def fast_cfg(**kw):
    base = dict(epochs=4, batch_size=128, seed=7, device="cpu", precision="fp32", progress=False)
    base["preset"] = "paper"  # annealing not rescaled to the run: resume can extend epochs
    return vaecf.TrainConfig(**{**base, **kw})


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_beta_schedule():
    cfg = vaecf.TrainConfig(total_anneal_steps=1000, anneal_cap=0.2)
    assert cfg.beta_at(0) == 0.0
    assert cfg.beta_at(100) == pytest.approx(0.1)
    assert cfg.beta_at(200) == pytest.approx(0.2)
    assert cfg.beta_at(5000) == 0.2


def test_run_directory_contents(small_ds, tmp_path):
    res = vaecf.train(small_ds, fast_cfg(eval_every=3), tmp_path / "run")
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {
        "config.json",
        "items.parquet",
        "last.pt",
        "best.pt",
        "metrics.jsonl",
        "results.json",
    } <= names
    assert not [n for n in names if n.startswith(".")]  # no temp files left
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert ["validation" in r for r in rows] == [False, False, True, True]  # every 3rd + last
    steps_per_epoch = -(-small_ds.manifest["counts"]["n_train_users"] // 128)
    assert rows[-1]["step"] == 4 * steps_per_epoch
    best = max((r for r in rows if "validation" in r), key=lambda r: r["validation"]["ndcg@100"])
    assert res.best_epoch == best["epoch"]
    assert res.validation_metrics == best["validation"]
    assert 0 < res.test_metrics["ndcg@100"] <= 1


def test_same_seed_same_result(small_ds, tmp_path):
    a = vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "a")
    b = vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "b")
    c = vaecf.train(small_ds, fast_cfg(epochs=2, seed=8), tmp_path / "c")
    assert a.test_metrics == b.test_metrics
    assert_same_weights(weights(tmp_path / "a/last.pt"), weights(tmp_path / "b/last.pt"))
    assert not torch.equal(
        weights(tmp_path / "a/last.pt")["in_weight"], weights(tmp_path / "c/last.pt")["in_weight"]
    )
    assert c.test_metrics != a.test_metrics


@pytest.mark.parametrize("model", ["multvae", "multdae"])
def test_resume_continues_bit_for_bit(small_ds, tmp_path, model):
    mcfg = vaecf.ModelConfig(model)
    full = vaecf.train(small_ds, fast_cfg(epochs=4), tmp_path / "full", mcfg)
    vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "split", mcfg)
    resumed = vaecf.train(small_ds, fast_cfg(epochs=4), tmp_path / "split", resume=True)
    assert_same_weights(weights(tmp_path / "full/last.pt"), weights(tmp_path / "split/last.pt"))
    assert_same_weights(weights(tmp_path / "full/best.pt"), weights(tmp_path / "split/best.pt"))
    assert resumed.test_metrics == full.test_metrics
    lines = (tmp_path / "split/metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2, 3, 4]


def test_resume_under_another_thread_count_continues_the_run(small_ds, tmp_path):
    """A run resumed with more intra-op threads (another machine, another OMP_NUM_THREADS) is
    accepted and ends where the uninterrupted run does, within float rounding: sums split over
    threads may round differently, so bit for bit holds for the same thread count only."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = vaecf.train(small_ds, fast_cfg(epochs=4), tmp_path / "full")
        vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "split")
        torch.set_num_threads(2)
        resumed = vaecf.train(small_ds, fast_cfg(epochs=4), tmp_path / "split", resume=True)
    finally:
        torch.set_num_threads(threads)
    a, b = weights(tmp_path / "full/last.pt"), weights(tmp_path / "split/last.pt")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5)
    for k, v in full.test_metrics.items():
        assert abs(resumed.test_metrics[k] - v) < 1e-3, k


def test_refuses_to_overwrite_a_run(small_ds, tmp_path):
    vaecf.train(small_ds, fast_cfg(epochs=1), tmp_path / "r")
    with pytest.raises(vaecf.RunError, match="resume=True"):
        vaecf.train(small_ds, fast_cfg(epochs=1), tmp_path / "r")


def test_mult_vae_beats_popularity_by_far(tmp_path):
    df = synthetic.generate(n_users=3000, n_items=400, n_groups=10, mean_items=25, seed=0)
    ds = vaecf.prepare_frame(df, tmp_path / "p", vaecf.PrepareSettings(heldout_users=300, seed=0))
    res = vaecf.train(ds, fast_cfg(epochs=12, batch_size=250), tmp_path / "r")
    test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
    pop = vaecf.evaluate_scores(vaecf.popularity_scores(CSR.from_scipy(ds.split("train"))), *test)
    assert res.test_metrics["ndcg@100"] > 1.5 * pop["ndcg@100"]
    assert res.test_metrics["recall@20"] > 2 * pop["recall@20"]


def test_bf16_trains_on_cpu(small_ds, tmp_path):
    res = vaecf.train(small_ds, fast_cfg(epochs=2, precision="bf16"), tmp_path / "bf16")
    ref = vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "fp32")
    assert abs(res.test_metrics["ndcg@100"] - ref.test_metrics["ndcg@100"]) < 0.05


def test_bad_settings_are_rejected(small_ds, tmp_path):
    with pytest.raises(ValueError, match="batch_size="):
        vaecf.train(small_ds, fast_cfg(batch_size=0), tmp_path / "x")
    with pytest.raises(ValueError, match="precision= must be one of"):
        vaecf.train(small_ds, fast_cfg(precision="fp8"), tmp_path / "y")


def test_fp16_trains_on_cpu_with_loss_scaling(small_ds, tmp_path):
    res = vaecf.train(small_ds, fast_cfg(epochs=2, precision="fp16"), tmp_path / "fp16")
    ref = vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "fp32")
    assert abs(res.test_metrics["ndcg@100"] - ref.test_metrics["ndcg@100"]) < 0.05
    scaler = torch.load(tmp_path / "fp16/last.pt", weights_only=True)["scaler"]
    assert 0 < scaler["scale"] <= 65536.0  # the scaler ran (and is saved for --resume)


def test_fp16_scaler_skips_an_overflowing_step_and_backs_off():
    from vaecf import precision as prec
    from vaecf.training.single import make_optimizer

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    net = torch.nn.Linear(16, 4)
    opt = make_optimizer(net, 1e-2, cpu)  # the fused Adam the trainer uses
    scaler = prec.grad_scaler(cpu, "fp16")
    x = torch.randn(8, 16)

    def step(scale_input: float):
        with prec.autocast(cpu, "fp16"):
            loss = net(x * scale_input).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    step(1.0)
    first = scaler.get_scale()
    before = [p.detach().clone() for p in net.parameters()]
    step(1e4)  # fp16 overflows: inf gradients
    assert scaler.get_scale() == first / 2
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))  # step skipped
    step(1.0)
    assert not all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu_closely(small_ds, tmp_path):
    cpu = vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "cpu")
    gpu = vaecf.train(small_ds, fast_cfg(epochs=2, device="cuda"), tmp_path / "gpu")
    assert abs(cpu.test_metrics["ndcg@100"] - gpu.test_metrics["ndcg@100"]) < 0.05


def test_host_data_with_prefetch_equals_device_data(small_ds, tmp_path):
    a = vaecf.train(small_ds, fast_cfg(epochs=2), tmp_path / "dev")
    b = vaecf.train(small_ds, fast_cfg(epochs=2, data_on="host"), tmp_path / "host")
    assert a.test_metrics == b.test_metrics
    assert_same_weights(weights(tmp_path / "dev/last.pt"), weights(tmp_path / "host/last.pt"))


def test_prefetch_stops_cleanly_and_reraises():
    import numpy as np
    import scipy.sparse as sp

    from vaecf.data.matrix import prefetch_batches

    csr = CSR.from_scipy(sp.random(50, 10, density=0.3, format="csr", dtype=np.float32))
    rows = list(torch.arange(50).split(7))
    got = list(prefetch_batches(csr, rows, torch.device("cpu")))
    assert [b.batch_size for b in got] == [r.numel() for r in rows]
    it = prefetch_batches(csr, rows, torch.device("cpu"), depth=1)
    next(it)
    it.close()  # consumer stops early: the producer thread must not hang
    bad = rows[:2] + [torch.tensor([999])]
    with pytest.raises(IndexError):
        list(prefetch_batches(csr, bad, torch.device("cpu")))


@pytest.mark.parametrize("native", [False, True])
def test_default_precision_is_auto_and_recorded_resolved(small_ds, tmp_path, monkeypatch, native):
    from vaecf import precision as prec

    assert vaecf.TrainConfig().precision == "auto"
    monkeypatch.setattr(prec, "native_bf16", lambda dev: native)
    cfg = fast_cfg(epochs=1)
    cfg.precision = "auto"
    vaecf.train(small_ds, cfg, tmp_path / "r")
    saved = json.loads((tmp_path / "r/config.json").read_text())
    assert saved["train"]["precision"] == ("bf16" if native else "fp32")  # resolved, recorded


def test_no_progress_bar_when_output_is_not_a_terminal(small_ds, tmp_path, capsys):
    # under pytest stdout/stderr are not terminals, as in a redirected log file
    vaecf.train(small_ds, fast_cfg(epochs=3, progress=True), tmp_path / "r")
    out = capsys.readouterr()
    assert "\r" not in out.out + out.err and "it/s" not in out.out + out.err
    lines = [x for x in out.out.splitlines() if x.startswith("epoch")]
    assert len(lines) == 3  # one line per epoch instead


def test_a_diverging_run_exits_1_naming_the_epoch_and_what_to_do(small_ds, tmp_path, capsys):
    """A learning rate far too large drives the loss to inf/NaN: train stops at that epoch with
    exit 1 (a failure, not bad input) and says to lower --lr, with no traceback."""
    from vaecf.cli import main

    rc = main([
        "train", "--data", str(small_ds.path), "--out", str(tmp_path / "run"), "--epochs", "5",
        "--lr", "1e30", "--precision", "fp32", "--device", "cpu", "--quiet",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "failed: the training loss became" in err and "--lr" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["multdae", "recvae"])
def test_fold_in_rows_join_the_training_rows_only_when_asked(small_ds, tmp_path, name):
    """With `fold_in_rows` a gradient model trains on the training users and then the held-out
    users' fold-in rows (exactly those, never their targets); without, on the first alone."""
    import scipy.sparse as sp

    from vaecf.training.single import GradientFit, resolve_config

    n = {k: small_ds.split(k).shape[0] for k in ("train", "validation_tr", "test_tr")}
    for use in (False, True):
        spec = vaecf.ModelConfig("multdae", fold_in_rows=use)
        if name == "recvae":
            spec = vaecf.RecVAEConfig(hidden_dim=32, latent_dim=16, n_layers=2, fold_in_rows=use)
        run = vaecf.train(
            small_ds, fast_cfg(epochs=1), tmp_path / f"r{use}", model=name, model_config=spec
        )
        rows = json.loads((run.run_dir / "results.json").read_text())["train_rows"]
        assert rows == n["train"] + (n["validation_tr"] + n["test_tr"] if use else 0)
    cfg = resolve_config(fast_cfg(epochs=1), vaecf.models.get(name), n["train"])
    got = GradientFit(small_ds, cfg, name, spec, tmp_path / "t")._train_rows()
    want = sp.vstack([small_ds.split(k) for k in ("train", "validation_tr", "test_tr")])
    assert (got != want.tocsr()).nnz == 0
    for held in ("validation", "test"):  # no target is a training input
        te = small_ds.split(f"{held}_te")
        start = n["train"] + (n["validation_tr"] if held == "test" else 0)
        assert got[start : start + te.shape[0]].multiply(te).nnz == 0


def test_fold_in_rows_default_is_resolved_per_model_and_preset_and_recorded(small_ds, tmp_path):
    """Unset, Mult-VAE trains on the fold-in rows too under --preset auto (not under paper);
    Mult-DAE and RecVAE do not; config.json records the resolved value."""
    n = {k: small_ds.split(k).shape[0] for k in ("train", "validation_tr", "test_tr")}
    every = n["train"] + n["validation_tr"] + n["test_tr"]
    for name, preset, want in [
        ("multvae", "auto", every),
        ("multvae", "paper", n["train"]),
        ("multdae", "auto", n["train"]),
        ("recvae", "auto", n["train"]),
    ]:
        out = tmp_path / f"{name}-{preset}"
        spec = (
            vaecf.RecVAEConfig(hidden_dim=32, latent_dim=16, n_layers=2)
            if name == "recvae"
            else None
        )
        vaecf.train(small_ds, fast_cfg(epochs=1, preset=preset), out, model=name, model_config=spec)
        assert json.loads((out / "results.json").read_text())["train_rows"] == want, name
        saved = json.loads((out / "config.json").read_text())["model"]["config"]["fold_in_rows"]
        assert saved is (want == every)


def test_a_run_from_before_fold_in_rows_resumes_on_the_training_rows(small_ds, tmp_path):
    out = tmp_path / "old"
    spec = vaecf.ModelConfig("multvae", fold_in_rows=False)
    vaecf.train(small_ds, fast_cfg(epochs=1, preset="auto"), out, model_config=spec)
    path = out / "config.json"
    saved = json.loads(path.read_text())
    del saved["model"]["config"]["fold_in_rows"]  # as written before the setting existed
    path.write_text(json.dumps(saved))
    vaecf.train(small_ds, fast_cfg(epochs=2, preset="auto"), out, resume=True)
    assert (
        json.loads((out / "results.json").read_text())["train_rows"]
        == small_ds.split("train").shape[0]
    )
