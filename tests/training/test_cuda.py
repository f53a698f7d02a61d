"""The CUDA paths against the CPU: every model and precision trains there and lands where the CPU
does (replaying its steps as CUDA graphs, one per phase), a replayed graph computes the eager
step, the linear solvers agree, a GPU-trained run serves on the CPU and every serving precision
ranks as fp32 does, resume and torchrun (NCCL) work. Skipped without a GPU; with
VAECF_TEST_DEVICE=cpu the same checks run on the CPU against itself (to check the tests)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import vaecf
from vaecf import precision as prec
from vaecf.data.matrix import CSR
from vaecf.models import first_layer
from vaecf.models.serving_choice import AGREEMENT_K, MIN_AGREEMENT

DEVICE = os.environ.get("VAECF_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA GPU"
)
TINY_RECVAE = dict(hidden_dim=64, latent_dim=32, n_layers=2)


@pytest.fixture(scope="module")
def ds(planted):
    return planted("cuda", 1500, 300, 8, 25, seed=11, heldout=150)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def cfg(device, **kw):
    base = dict(epochs=6, batch_size=100, seed=7, device=device, precision="fp32", progress=False)
    return vaecf.TrainConfig(**{**base, "preset": "paper", **kw})


def model_config(name):
    return vaecf.RecVAEConfig(**TINY_RECVAE) if name == "recvae" else None


def ndcg(run) -> float:
    return run.test_metrics["ndcg@100"]


@pytest.fixture(scope="module")
def cpu_runs(ds, root):
    return {
        name: vaecf.train(
            ds, cfg("cpu"), root / f"cpu-{name}", model=name, model_config=model_config(name)
        )
        for name in ("multvae", "multdae", "recvae")
    }


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("name", ["multvae", "multdae", "recvae"])
def test_trains_like_the_cpu(ds, root, cpu_runs, name, precision):
    run = vaecf.train(
        ds,
        cfg(DEVICE, precision=precision),
        root / f"{DEVICE}-{name}-{precision}",
        model=name,
        model_config=model_config(name),
    )
    split = {k: CSR.from_scipy(ds.split(k)) for k in ("train", "test_tr", "test_te")}
    pop = vaecf.evaluate_scores(
        vaecf.popularity_scores(split["train"]), split["test_tr"], split["test_te"]
    )["ndcg@100"]
    ref = ndcg(cpu_runs[name])
    print(f"{name} {precision}: {ndcg(run):.4f} (cpu fp32 {ref:.4f}, popularity {pop:.4f})")
    assert ndcg(run) > pop + 0.05, "no better than popularity"
    assert abs(ndcg(run) - ref) < 0.03
    ck = torch.load(run.run_dir / "last.pt", weights_only=True, map_location="cpu")
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
    graphed = DEVICE.startswith("cuda") and precision != "fp16"  # at this batch: graphs win
    results = json.loads((run.run_dir / "results.json").read_text())
    steps = results["timing"]["graph_steps"]
    assert (steps > 0) == graphed, f"{steps} steps replayed as a CUDA graph"
    chosen = results["first_layer"]
    print(f"{name} {precision}: first layer {chosen}")
    assert chosen["kernel"] in first_layer.KERNELS
    assert chosen["cuda_graphs"] == graphed
    assert (chosen["ms"] == {}) == (not DEVICE.startswith("cuda"))


@pytest.mark.parametrize(
    "name,kernel",
    [("multdae", k) for k in ("bag", "gather", "dense")]  # "csr" cannot be captured
    + [("recvae", "dense"), ("recvae-edlae", "gather")],
)
def test_a_graphed_step_replays_the_eager_step(name, kernel):
    """Capturing leaves the parameters, Adam's state and the RNG as they were; the replays'
    losses follow the eager padded steps' (nothing random: Mult-DAE without dropout, RecVAE in
    eval mode), RecVAE's with one graph per phase (3 encoder steps, 1 decoder step a batch)."""
    if not DEVICE.startswith("cuda"):
        pytest.skip("CUDA graphs need a GPU")
    from vaecf import models
    from vaecf.bench.speed import synthetic_csr
    from vaecf.training import graphs
    from vaecf.training.single import make_optimizer

    m = synthetic_csr(3000, 800, 60_000, seed=4)
    csr = CSR.from_scipy(m, DEVICE)
    cap = graphs.graph_capacity(np.diff(m.indptr), 200)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 3000, (200,), generator=gen).to(DEVICE) for _ in range(6)]
    losses = []
    for use_graph in (False, True):
        torch.manual_seed(0)
        if name == "multdae":
            net = models.build(name, 800, {"model": "multdae", "dropout": 0.0}).to(DEVICE).train()
        else:
            net = models.build(name, 800).to(DEVICE).eval()
        net.use_first_layer(kernel)
        opts = {
            k: make_optimizer(p, 1e-3, torch.device(DEVICE)) for k, p in net.param_groups().items()
        }
        steps = [
            (ph, [opts[g] for g in ph.groups]) for ph in net.phases() for _ in range(ph.passes)
        ]
        out = []
        if use_graph:
            before = [p.detach().clone() for p in net.parameters()]
            rng = torch.cuda.get_rng_state()
            graphed = {
                ph.name: graphs.GraphedStep(net, o, csr, 200, "fp32", cap, ph) for ph, o in steps
            }
            assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
            for o in opts.values():
                assert all(torch.all(v == 0) for st in o.state.values() for v in st.values())
            assert torch.equal(torch.cuda.get_rng_state(), rng)
            for rows in batches:
                for ph, _ in steps:
                    net.begin_phase(ph)
                    out.append(graphed[ph.name](rows, 0.1)["nll_sum"].item())
        else:
            for rows in batches:
                for ph, phase_opts in steps:
                    net.begin_phase(ph)
                    for o in opts.values():
                        o.zero_grad(set_to_none=True)
                    loss, parts = net.loss(csr.padded_batch(rows, cap), 0.1, 200, ph)
                    loss.backward()
                    for o in phase_opts:
                        o.step()
                    out.append(parts["nll_sum"].item())
        losses.append(out)
    print(name, kernel, "eager", losses[0][-4:], "graph", losses[1][-4:])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


@pytest.mark.parametrize("softmax", ["triton", "torch"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_first_layer_kernels_and_the_fused_loss_equal_the_cpus(precision, softmax, monkeypatch):
    """On the device, each first-layer kernel and the fused output layer (its GPU softmax: the
    Triton kernels, or PyTorch's) against the CPU's embedding_bag and chunked softmax: fp32 to
    1e-5, bf16 within its rounding; forward and gradients."""
    from vaecf.bench.speed import synthetic_csr
    from vaecf.models import fused, softmax_kernels
    from vaecf.models.fused import linear_multinomial_nll

    if softmax == "triton" and not softmax_kernels.available(torch.device(DEVICE)):
        pytest.skip("Triton's kernels do not run on this device")
    monkeypatch.setattr(fused, "USE_KERNELS", softmax == "triton")

    m = synthetic_csr(2000, 3000, 80_000, seed=5)
    rows = torch.arange(0, 2000, 3)
    tol = dict(rtol=1e-5, atol=1e-5) if precision == "fp32" else dict(rtol=2e-2, atol=2e-2)
    torch.manual_seed(0)
    w, wo = torch.randn(3000, 64) * 0.05, torch.randn(3000, 64) * 0.05
    bo = torch.randn(3000) * 0.05
    results = {}
    for device, kernels in (("cpu", ["bag"]), (DEVICE, list(first_layer.KERNELS))):
        batch = CSR.from_scipy(m, device).batch(rows.to(device))
        for kernel in kernels:
            params = [t.clone().to(device).requires_grad_() for t in (w, wo, bo)]
            with prec.autocast(torch.device(device), precision if device != "cpu" else "fp32"):
                h = torch.tanh(first_layer.product(batch, params[0], batch.values, kernel))
                loss = linear_multinomial_nll(h, params[1], params[2], batch)
            loss.backward()
            results[(device, kernel)] = [loss.detach().cpu()] + [p.grad.cpu() for p in params]
    want = results[("cpu", "bag")]
    for kernel in first_layer.KERNELS:
        got = results[(DEVICE, kernel)]
        for a, b, what in zip(got, want, ("loss", "first", "output", "bias")):
            scale = b.abs().max()
            torch.testing.assert_close(a / scale, b / scale, **tol, msg=f"{kernel} {what}")


def test_host_data_with_pinned_prefetch_equals_device_data(ds, root):
    a = vaecf.train(ds, cfg(DEVICE, epochs=2), root / "dev-data", model="multdae")
    b = vaecf.train(ds, cfg(DEVICE, epochs=2, data_on="host"), root / "host-data", model="multdae")
    assert ndcg(a) == pytest.approx(ndcg(b), abs=2e-3)


@pytest.mark.parametrize("name", ["multvae", "recvae"])
def test_resume_continues_the_run(ds, root, name):
    kw = dict(model=name, model_config=model_config(name))
    full = vaecf.train(ds, cfg(DEVICE, epochs=4), root / f"full-{name}", **kw)
    vaecf.train(ds, cfg(DEVICE, epochs=2), root / f"half-{name}", **kw)
    resumed = vaecf.train(ds, cfg(DEVICE, epochs=4), root / f"half-{name}", resume=True, **kw)
    rows = (root / f"half-{name}/metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in rows] == [1, 2, 3, 4]
    # bit-exact on the CPU (tests/training/test_gradient.py); CUDA's atomic scatter-add may
    # differ in the last bits, so the two runs agree within float noise rather than exactly
    print(f"{name} full {ndcg(full):.6f} resumed {ndcg(resumed):.6f}")
    assert ndcg(resumed) == pytest.approx(ndcg(full), abs=5e-3)


@pytest.mark.parametrize("name", ["multvae", "recvae"])
def test_the_epochs_last_smaller_batch_replays_a_graph_of_its_own(ds, root, name):
    """At batch 70 the 1,200 training users leave a last batch of 10 an epoch: it replays a
    second graph (every step of the run is a replay), captured mid-run without changing the
    state, and the run lands where the eager one does."""
    if not DEVICE.startswith("cuda"):
        pytest.skip("CUDA graphs need a GPU")
    kw = dict(model=name, model_config=model_config(name))
    graphed = vaecf.train(ds, cfg(DEVICE, batch_size=70), root / f"rest-graph-{name}", **kw)
    eager = vaecf.train(
        ds, cfg(DEVICE, batch_size=70, cuda_graphs=False), root / f"rest-eager-{name}", **kw
    )
    results = json.loads((graphed.run_dir / "results.json").read_text())
    assert results["train_rows"] % 70 == 10
    assert results["timing"]["graph_steps"] == results["steps"]
    print(f"{name} graphed {ndcg(graphed):.4f} eager {ndcg(eager):.4f}")
    assert ndcg(graphed) == pytest.approx(ndcg(eager), abs=0.03)


CV = dict(selection="cv", popularity_grid=[0.0, 0.1, 0.25])


@pytest.mark.parametrize(
    "name,solver,extra",
    [
        ("ease", "dense", {}),
        ("edlae", "dense", {}),
        ("edlae", "sparse", {}),
        ("edlae", "dense", CV),  # lambda, p and beta chosen on validation + training-user folds
        ("edlae", "sparse", CV),  # the same on folds, each fold's B by the sparse solver
        ("infae", None, {}),  # the closed-form autoencoder: its kernel solve on the device
    ],
)
def test_linear_models_agree_with_the_cpu(ds, root, name, solver, extra):
    from vaecf import models

    spec = models.get(name).Config
    if solver is not None:
        extra = {**extra, "solver": solver}
    runs = {
        tag: vaecf.train(
            ds,
            vaecf.TrainConfig(device=dev, progress=False),
            root / f"{name}-{solver}-{len(extra)}-{tag}",
            model_config=spec(**extra),
        )
        for tag, dev in (("ref", "cpu"), ("dev", DEVICE))
    }
    fits = [
        json.loads((r.run_dir / "metrics.jsonl").read_text().splitlines()[0]) for r in runs.values()
    ]
    chosen = ("l2", "dropout", "popularity_exponent", "ridge", "selection")
    picked = [{k: fit.get(k) for k in chosen} for fit in fits]
    print(name, solver, [ndcg(r) for r in runs.values()], picked)
    assert picked[0] == picked[1], "the GPU's search chose other settings"
    if extra.get("selection") == "cv":
        assert picked[1]["selection"] == "cv"
    assert ndcg(runs["dev"]) == pytest.approx(ndcg(runs["ref"]), abs=2e-3)
    a, b = (
        vaecf.Recommender.load(r.run_dir, device=dev).scores([[1, 2, 3, 40, 41]])[0]
        for r, dev in ((runs["ref"], "cpu"), (runs["dev"], DEVICE))
    )
    assert torch.allclose(a.cpu(), b.cpu(), rtol=1e-3, atol=1e-5)


def _histories(ds, n=200):
    x = ds.split("test_tr")[:n]
    return [x.indices[x.indptr[i] : x.indptr[i + 1]].tolist() for i in range(x.shape[0])]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "int8"])
@pytest.mark.parametrize("name", ["multvae", "recvae"])
def test_serving_precisions_rank_as_fp32_on_the_cpu(ds, root, cpu_runs, name, precision):
    """A GPU-trained run loads on the CPU, and every serving precision on the GPU picks the
    CPU fp32 top 10 (overlap, not order: near-ties swap under reduced precision), to the
    tolerance `--precision auto` holds a copy to."""
    run_dir = root / f"{DEVICE}-{name}-fp32"
    if not run_dir.exists():
        pytest.skip("needs test_trains_like_the_cpu's run")
    hist = _histories(ds)
    ref, _ = vaecf.Recommender.load(run_dir, device="cpu").scores(hist)
    got, _ = vaecf.Recommender.load(run_dir, device=DEVICE, precision=precision).scores(hist)
    assert got.device.type == torch.device(DEVICE).type
    for h, row in zip(hist, ref):
        row[h] = -np.inf
    for h, row in zip(hist, got):
        row[h] = -np.inf
    top_ref, top_got = ref.topk(AGREEMENT_K).indices, got.cpu().topk(AGREEMENT_K).indices
    overlap = np.mean(
        [len(set(a.tolist()) & set(b.tolist())) / AGREEMENT_K for a, b in zip(top_ref, top_got)]
    )
    print(f"{name} {precision}: top-10 overlap with cpu fp32 {overlap:.3f}")
    assert overlap >= (0.99 if precision == "fp32" else MIN_AGREEMENT)


def test_recommend_and_similar_on_the_device(ds, root):
    run_dir = root / f"{DEVICE}-multvae-fp32"
    if not run_dir.exists():
        pytest.skip("needs test_trains_like_the_cpu's run")
    rec = vaecf.Recommender.load(run_dir, device=DEVICE)
    ids = ds.items.array
    r = rec.recommend([ids[0], ids[1], ids[2]], k=5)
    assert len(r.item_ids) == 5 and not {ids[0], ids[1], ids[2]} & set(r.item_ids)
    assert rec.recommend([], k=3).fallback == "popular"
    assert len(rec.similar_items(ids[5], k=4).item_ids) == 4


def _cli(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    p = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_torchrun_one_process_nccl(ds, root):
    if not DEVICE.startswith("cuda"):
        pytest.skip("NCCL needs CUDA")
    out = root / "nccl"
    _cli(
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        "-m", "vaecf", "train", "--data", str(ds.path), "--out", str(out), "--epochs", "2",
        "--device", DEVICE, "--quiet", "--json",
    )  # fmt: skip
    assert json.loads((out / "results.json").read_text())["test"]["ndcg@100"] > 0


def test_bench_cli_on_the_device():
    small = (
        "--users",
        "4000",
        "--items",
        "3000",
        "--nnz",
        "200000",
        "--steps",
        "4",
        "--warmup",
        "2",
    )
    train = ("-m", "vaecf", "bench", "train", *small, "--device", DEVICE, "--json")
    rows = json.loads(_cli(*train, "--precision", "fp32", "--precision", "bf16"))
    print(rows)
    infer = json.loads(
        _cli(
            "-m",
            "vaecf",
            "bench",
            "infer",
            "3000",
            "--device",
            DEVICE,
            "--precision",
            "int8",
            "--seconds",
            "0.5",
            "--json",
        )  # fmt: skip
    )
    print(infer)
    assert rows and infer
    # on a GPU, Mult-VAE's step is timed as training replays it: one CUDA graph
    graphed = DEVICE.startswith("cuda")
    assert all(("graph" in r["breakdown_ms"]) == graphed for r in rows)
    assert all(r["users_per_s"] > 0 for r in rows)
    eager = json.loads(_cli(*train, "--precision", "fp32", "--cuda-graphs", "false"))
    assert set(eager[0]["breakdown_ms"]) == {"batch", "forward", "backward", "optimizer"}
