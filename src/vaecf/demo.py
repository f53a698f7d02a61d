"""The demo: synthetic dataset -> prepare -> train Mult-VAE -> metrics -> recommendations."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from vaecf.config.train import TrainConfig
from vaecf.data import synthetic
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PrepareSettings, prepare_csv
from vaecf.evaluate import evaluate_scores, popularity_scores
from vaecf.metrics import self_information
from vaecf.recommender import Recommender
from vaecf.run_evaluation import evaluate_run
from vaecf.storage.safewrite import atomic_file
from vaecf.training import train

# accuracy, then what the lists look like: how novel, how much of the catalogue, how unequal
DEMO_METRICS = ("recall@20", "ndcg@100", "map@10", "mrr@10", "novelty@10", "coverage@10", "gini@10")


def run_demo(
    out: Path, epochs: int = 20, n_users: int = 12_000, n_items: int = 3_000, seed: int = 0
) -> dict:
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    csv = out / f"synthetic-u{n_users}-i{n_items}-s{seed}.csv"
    if not csv.is_file():
        print(f"generating {n_users} users x {n_items} items (seed {seed}) -> {csv}")
        df = synthetic.generate(n_users=n_users, n_items=n_items, seed=seed)
        with atomic_file(csv) as f:
            df.write_csv(f)
    heldout = max(1, n_users // 10)
    ds = prepare_csv(
        csv,
        out / f"prepared-{csv.stem}",
        "user_id",
        "item_id",
        settings=PrepareSettings(heldout_users=heldout, seed=seed),
    )
    c = ds.manifest["counts"]
    print(
        f"prepared: {c['n_train_users']} training users, {c['n_items']} items, "
        f"{c['nnz_train']} interactions; {heldout} validation + {heldout} test users"
    )

    run_dir = out / "runs" / time.strftime("%Y%m%d-%H%M%S")
    # planted tastes are learnt in a few epochs: a short patience shows early stopping at work
    train(ds, TrainConfig(epochs=epochs, seed=seed, device="auto", patience=3), run_dir)

    train_csr = CSR.from_scipy(ds.split("train"))
    test = [CSR.from_scipy(ds.split(f"test_{p}")) for p in ("tr", "te")]
    info = self_information(torch.from_numpy(ds.split("train").getnnz(axis=0)), c["n_train_users"])
    pop = evaluate_scores(popularity_scores(train_csr), *test, DEMO_METRICS, info=info)
    ev = evaluate_run(run_dir, metrics=DEMO_METRICS).summary  # as `vaecf evaluate --metrics`
    print("\ntest users:" + "".join(f"{k:>12s}" for k in DEMO_METRICS))
    for name, m in (("Mult-VAE", ev), ("popularity", pop)):
        print(f"{name:11s}" + "".join(f"{m[k]:12.4f}" for k in DEMO_METRICS))

    rec = Recommender.load(run_dir)
    fold_in, target = (ds.split(f"test_{p}") for p in ("tr", "te"))
    print("\nrecommendations for three test users (* = in the user's hidden 20%):")
    for row in range(3):
        history = rec.items.id_of(fold_in[row].indices)
        hidden = set(rec.items.id_of(target[row].indices))
        r = rec.recommend(history, k=10)
        shown = " ".join(f"{i}{'*' if i in hidden else ''}" for i in r.item_ids)
        print(f"  history {len(history):3d} items, e.g. {history[:6]}\n    top 10: {shown}")
    print(
        f"\nrun directory: {run_dir}  ({time.perf_counter() - t0:.0f} s in all, "
        f"{torch.get_num_threads()} threads)"
    )
    return {"test": ev, "popularity": pop, "run_dir": str(run_dir)}
