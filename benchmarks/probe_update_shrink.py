"""probe_update_shrink: does a warm start shrunk toward a fresh start ("shrink and perturb", Ash &
Adams 2020) bring an autoencoder's update closer to its retrain? ML-1M temporal, the first 80% of
the ratings older, all newer; one older run, the updates in turn.

    MODEL=recvae|multvae python benchmarks/probe_update_shrink.py default shrink=0.5 shrink=0.0
"""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, "benchmarks")
import update as ub

import vaecf
import torch
import vaecf.training.update as U
from vaecf.training.update import update

df = ub.read(Path.home() / ".cache/vaecf-data/ml-1m/ratings.dat")
import os
MODEL = os.environ.get("MODEL", "recvae")
tmp = Path(tempfile.gettempdir()) / ("probe-update-lr" + ("" if MODEL == "recvae" else "-" + MODEL))
tmp.mkdir(exist_ok=True)
old = (
    ub.prepared(df, 0.8, tmp / "old")
    if not (tmp / "old" / "manifest.json").exists()
    else vaecf.PreparedDataset(tmp / "old")
)
new = (
    ub.prepared(df, 1.0, tmp / "new")
    if not (tmp / "new" / "manifest.json").exists()
    else vaecf.PreparedDataset(tmp / "new")
)
cfg = vaecf.TrainConfig(progress=False, budget=300)
if not (tmp / "old-run" / "best.pt").exists():
    vaecf.train(old, cfg, tmp / "old-run", model=MODEL)
import json

print(
    "old run train cfg lr",
    json.loads((tmp / "old-run" / "config.json").read_text())["train"].get("lr"),
)
import shutil

for label, kw in [(a.split("=")[0], a) for a in sys.argv[1:]]:
    out = tmp / f"upd-{label}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    if label == "default":
        r = update(tmp / "old-run", new, out, 300, progress=False)
    elif label.startswith("lr"):
        lr = float(kw.split("=")[1])
        orig = U.train
        U.train = lambda ds, tcfg, *a, **k: orig(ds, replace(tcfg, lr=lr), *a, **k)
        r = update(tmp / "old-run", new, out, 300, progress=False)
        U.train = orig
    elif label.startswith("shrink"):
        lam = float(kw.split("=")[1])
        orig_ws = U.warm_start

        def ws(old_state, old_n, pos, lam=lam):
            inner = orig_ws(old_state, old_n, pos)

            @torch.no_grad()
            def init(model):
                fresh = {k: v.clone() for k, v in model.state_dict().items()}
                inner(model)
                for k, t in model.state_dict().items():
                    if t.is_floating_point() and "prior" not in k:
                        t.mul_(lam).add_(fresh[k], alpha=1 - lam)
            return init

        U.warm_start = ws
        r = update(tmp / "old-run", new, out, 300, progress=False)
        U.warm_start = orig_ws
    elif label.startswith("pat"):
        r = update(tmp / "old-run", new, out, 300, progress=False, patience=int(kw.split("=")[1]))
    print(
        label,
        kw,
        f"{r.test_metrics['ndcg@100']:.4f}",
        f"{time.perf_counter() - t0:.1f}s",
        r.validation_metrics.get("ndcg@100"),
        flush=True,
    )
