"""How much of the blend's validation lead in `--model auto` is its weight's own choice: per
split of an `accuracy_compare.py` run's `auto` runs, the blend of the best linear and the best
autoencoder candidate (their saved models) at each of the nine weights, its paired per-user
gain over the linear candidate on the validation users at the weight chosen on all of them (in
sample: what the selection judged before 2026-11-26) and cross-fitted (each half of the users
at the weight chosen on the other half: what `auto.cross_fitted` gives the selection now), with
the gain's z (gain / paired standard error).

    python benchmarks/blend_crossfit.py --out DIR [--datasets filmtrust,ml-latest-small]
        [--label auto] [--seeds 98765,1,2,3,4]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from vaecf import rundir
from vaecf.auto import BLEND_WEIGHTS, blend_of, cross_fitted
from vaecf.data.matrix import CSR
from vaecf.data.prepare import PreparedDataset
from vaecf.evaluate import model_scores, per_user_metric


def per_user(model, val) -> np.ndarray:
    return per_user_metric(model_scores(model.eval()), *val, "ndcg@100").numpy()


def one_split(run: str, data: str) -> str:
    record = json.load(open(f"{run}/results.json"))["auto"]["candidates"]
    fitted = {r["model"]: r for r in record if "validation" in r and r["family"] != "selection"}

    def best(family: str) -> str:
        names = [n for n in fitted if fitted[n]["family"] == family]
        return max(names, key=lambda n: fitted[n]["validation"]["ndcg@100"])

    linear, ae = best("linear"), best("autoencoder")
    ds = PreparedDataset(data)
    val = tuple(CSR.from_scipy(ds.split(f"validation_{p}")) for p in ("tr", "te"))
    parts = {n: rundir.load_model(f"{run}/candidates/{n}", "cpu") for n in (linear, ae)}
    blend = blend_of(ds.n_items, parts)
    base = per_user(parts[linear][0], val)
    rows = []
    for w in BLEND_WEIGHTS:
        blend.config.weight = w
        rows.append(per_user(blend, val))
    per_weight = np.stack(rows)

    def gain(v: np.ndarray) -> str:
        d = v - base
        return f"{d.mean():+.4f} (z {d.mean() / (d.std(ddof=1) / np.sqrt(d.size)):5.2f})"

    w = per_weight.mean(1).argmax()
    return (
        f"{linear}+{ae}, weight {BLEND_WEIGHTS[w]:g}: in sample {gain(per_weight[w])}, "
        f"cross-fitted {gain(cross_fitted(per_weight))}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="an accuracy_compare.py --out directory")
    ap.add_argument("--datasets", default="filmtrust,ml-latest-small")
    ap.add_argument("--label", default="auto")
    ap.add_argument("--seeds", default="98765,1,2,3,4")
    a = ap.parse_args()
    for d in a.datasets.split(","):
        for s in a.seeds.split(","):
            run = f"{a.out}/{d}/runs/{a.label}/seed-{s}"
            print(f"{d} seed {s}: {one_split(run, f'{a.out}/{d}/data/seed-{s}')}", flush=True)


if __name__ == "__main__":
    main()
