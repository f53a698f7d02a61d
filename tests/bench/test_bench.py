"""Benchmarks as commands: shapes, FLOP counts, percentile order, precision defaults, CLI JSON.

These check what the benchmarks report, never how fast anything is (speed lives in
benchmarks/, not in unit tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from vaecf import precision as prec
from vaecf.bench import speed as bench
from vaecf.models.multvae import ModelConfig, build_model


def test_synthetic_csr_has_the_asked_shape_and_is_binary():
    m = bench.synthetic_csr(300, 50, 3_000, seed=3)
    assert m.shape == (300, 50)
    assert (m.data == 1.0).all()
    assert (m.getnnz(axis=1) >= 1).all()  # every user has an item
    assert 0.5 * 3_000 < m.nnz <= 3_000 + 300  # duplicates collapse, rounding adds a few
    assert (bench.synthetic_csr(300, 50, 3_000, seed=3) != m).nnz == 0  # deterministic


def test_step_flops_known_answer():
    net = build_model(1000, ModelConfig())  # 1000 -> 600 -> 400 | 200 -> 600 -> 1000
    dense = 600 * 400 + 200 * 600 + 600 * 1000
    assert bench.step_flops(net, 10, 70) == 2.0 * (3 * dense * 10 + 2 * 600 * 70)


def test_bench_train_reports_a_consistent_step():
    r = bench.bench_train(
        "fp32", batch_size=32, users=200, items=300, nnz=4_000, steps=3, warmup=1, progress=False
    )
    parts = sum(r.breakdown_ms.values())
    assert r.step_ms == pytest.approx(parts)
    assert r.users_per_s == pytest.approx(32 / (parts / 1e3))
    assert r.gflops > 0
    assert set(r.to_dict()) >= {"precision", "users_per_s", "step_ms", "gflops", "breakdown_ms"}


def test_bench_infer_percentiles_are_ordered():
    rows = bench.bench_infer(
        400, batch_sizes=(1, 16), precision="fp32", seconds=0.2, k=10, progress=False
    )
    assert [r["batch_size"] for r in rows] == [1, 16]
    for r in rows:
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["n"] >= 18  # at least 20 timed calls, minus the warm-up share
        assert r["users_per_s"] == pytest.approx(r["batch_size"] / (r["mean_ms"] / 1e3))


@pytest.mark.parametrize("native", [True, False])
def test_default_precisions_skip_emulated_bf16(monkeypatch, native):
    monkeypatch.setattr(prec, "native_bf16", lambda dev: native)
    assert bench.default_precisions("cpu") == (["fp32", "bf16"] if native else ["fp32"])
    assert prec.resolve_precision("auto", torch.device("cpu")) == ("bf16" if native else "fp32")


def test_cli_bench_json():
    args = ["bench", "train", "--users", "100", "--items", "200", "--nnz", "2000"]
    args += ["--batch-size", "20", "--steps", "2", "--warmup", "1", "--precision", "fp32", "--json"]
    p = subprocess.run(
        [sys.executable, "-m", "vaecf", *args], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert row["precision"] == "fp32" and row["batch_size"] == 20 and row["users_per_s"] > 0


def test_bench_eval_scores_every_user():
    r = bench.bench_eval(items=300, users=120, history=20, batch_size=50, device="cpu", repeats=1)
    assert r["precision"] in ("fp32", "bf16") and r["users"] == 120
    assert 0 < r["n_users"] <= 120  # users whose 20% draw came out empty are skipped
    assert r["seconds"] > 0 and r["users_per_s"] == pytest.approx(120 / r["seconds"])
