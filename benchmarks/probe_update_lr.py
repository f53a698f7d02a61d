"""probe_update_lr: does a lower learning rate (or another patience) bring RecVAE's update closer
to its retrain? ML-1M temporal, the first 80% of the ratings older, all newer.

    python benchmarks/probe_update_lr.py default lr=0.0001 lr=0.00025 [patience=10]
"""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, "benchmarks")
import update as ub

import vaecf
import vaecf.training.update as U
from vaecf.training.update import update

df = ub.read(Path.home() / ".cache/vaecf-data/ml-1m/ratings.dat")
tmp = Path(tempfile.gettempdir()) / "probe-update-lr"
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
    vaecf.train(old, cfg, tmp / "old-run", model="recvae")
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
