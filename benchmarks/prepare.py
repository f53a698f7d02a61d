"""Preprocessing: `vaecf prepare` against a pandas version of the paper's notebook, ML-20M's size.

`vaecf prepare ml-20m --source ratings.csv` against a pandas implementation of the paper's
notebook (Liang et al. 2018), on a synthetic file in the exact ML-20M format and size
(20,000,263 rows, 138,493 users, 26,744 movies); then a Netflix-format run.

Each side runs in its own subprocess; wall time and peak RSS (ru_maxrss of that process) are
printed side by side.

    .venv/bin/python benchmarks/prepare.py                      # ML-20M size, then Netflix size
    .venv/bin/python benchmarks/prepare.py --netflix-rows 0     # ML-20M only
    .venv/bin/python benchmarks/prepare.py --rows 2000000 --netflix-rows 10000000  # quick
    .venv/bin/python benchmarks/prepare.py --rows 40000 --netflix-rows 40000 --heldout-users 100
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

ML_USERS, ML_ITEMS, ML_ROWS = 138_493, 26_744, 20_000_263
NF_USERS, NF_ITEMS, NF_ROWS = 480_189, 17_770, 100_480_507
# MovieLens 20M's share of each half-star rating, 0.5 ... 5.0 (approximately)
ML_STARS = np.array([1.2, 3.4, 1.4, 7.1, 4.4, 21.2, 11.0, 27.8, 7.6, 14.9])


def _counts(rng, n_users: int, n_rows: int, lo: int, cap: int) -> np.ndarray:
    """Per-user row counts: at least `lo`, at most `cap`, heavy-tailed, summing to n_rows."""
    w = rng.lognormal(0.0, 1.3, n_users)
    n = lo + np.floor(w / w.sum() * (n_rows - lo * n_users)).astype(np.int64)
    n = np.minimum(n, cap)
    while (left := n_rows - int(n.sum())) > 0:
        room = np.flatnonzero(n < cap)
        n[rng.choice(room, size=min(left, room.size), replace=False)] += 1
    return n


def _pairs(rng, counts: np.ndarray, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct items per user with a popularity skew: user u takes an arithmetic progression
    (stride a prime > n_items) inside the `span_u` most popular items."""
    n_users = counts.size
    users = np.repeat(np.arange(n_users, dtype=np.int64), counts)
    span = np.minimum(
        n_items, np.maximum(counts, (counts * rng.uniform(2, 30, n_users)).astype(np.int64))
    )
    start = (rng.random(n_users) * span).astype(np.int64)
    j = np.arange(users.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    rank = (start[users] + j * 104_729) % span[users]
    return users, rank


def make_ml20m(path: Path, n_rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    n_users = min(ML_USERS, n_rows // 20)
    counts = _counts(rng, n_users, n_rows, 20, 9_254)
    users, rank = _pairs(rng, counts, ML_ITEMS)
    movie_ids = np.sort(rng.choice(131_262, ML_ITEMS, replace=False) + 1)
    movie = movie_ids[rng.permutation(ML_ITEMS)][rank]
    stars = rng.choice(np.arange(1, 11) / 2, size=users.size, p=ML_STARS / ML_STARS.sum())
    df = pl.DataFrame(
        {
            "userId": users + 1,
            "movieId": movie,
            "rating": stars,
            "timestamp": rng.integers(789_652_009, 1_427_784_002, users.size),
        }
    )
    df.sort("userId", "movieId").write_csv(path)


def make_netflix(directory: Path, n_rows: int, seed: int = 1) -> None:
    """Four combined_data_*.txt files: 'MovieID:' then CustomerID,Rating,Date rows per movie."""
    rng = np.random.default_rng(seed)
    n_items = NF_ITEMS
    counts = _counts(rng, n_items, n_rows, 3, 250_000)  # ratings per movie
    movies, rank = _pairs(rng, counts, NF_USERS)
    customers = np.sort(rng.choice(2_649_429, NF_USERS, replace=False) + 1)
    cust = customers[rng.permutation(NF_USERS)][rank]
    stars = rng.choice(np.arange(1, 6), size=movies.size, p=[0.046, 0.101, 0.287, 0.336, 0.23])
    day = rng.integers(0, 2_200, movies.size)
    dates = (np.datetime64("1999-11-11") + day.astype("timedelta64[D]")).astype(str)
    rows = pl.DataFrame(
        {
            "movie": movies + 1,
            "line": pl.Series(cust).cast(pl.String)
            + ","
            + pl.Series(stars).cast(pl.String)
            + ","
            + pl.Series(dates),
        }
    )
    del cust, stars, dates, day
    bounds = np.linspace(0, n_items, 5).astype(int)
    for k in range(4):
        part = rows.filter(pl.col("movie").is_between(bounds[k] + 1, bounds[k + 1]))
        heads = part.group_by("movie", maintain_order=True).agg(pl.len())
        head = heads.select(
            "movie", pl.col("movie").cast(pl.String).add(":").alias("line"), pl.lit(0).alias("o")
        )
        body = part.with_columns(pl.lit(1).alias("o"))
        lines = pl.concat([head, body]).sort("movie", "o", maintain_order=True).select("line")
        lines.write_csv(
            directory / f"combined_data_{k + 1}.txt", include_header=False, quote_style="never"
        )


PANDAS_REFERENCE = r"""
import sys, numpy as np, pandas as pd
src, out, n_heldout = sys.argv[1], sys.argv[2], int(sys.argv[3])
raw_data = pd.read_csv(src, header=0)
raw_data = raw_data[raw_data['rating'] > 3.5]
def get_count(tp, id):
    return tp[[id]].groupby(id, as_index=False).size()
def filter_triplets(tp, min_uc=5, min_sc=0):
    if min_sc > 0:
        itemcount = get_count(tp, 'movieId')
        tp = tp[tp['movieId'].isin(itemcount['movieId'][itemcount['size'] >= min_sc])]
    if min_uc > 0:
        usercount = get_count(tp, 'userId')
        tp = tp[tp['userId'].isin(usercount['userId'][usercount['size'] >= min_uc])]
    return tp, get_count(tp, 'userId'), get_count(tp, 'movieId')
raw_data, user_activity, item_popularity = filter_triplets(raw_data)
unique_uid = user_activity['userId'].values
np.random.seed(98765)
unique_uid = unique_uid[np.random.permutation(unique_uid.size)]
n_users = unique_uid.size
tr_users = unique_uid[:(n_users - n_heldout * 2)]
vd_users = unique_uid[(n_users - n_heldout * 2): (n_users - n_heldout)]
te_users = unique_uid[(n_users - n_heldout):]
train_plays = raw_data.loc[raw_data['userId'].isin(tr_users)]
unique_sid = pd.unique(train_plays['movieId'])
show2id = dict((sid, i) for (i, sid) in enumerate(unique_sid))
profile2id = dict((pid, i) for (i, pid) in enumerate(unique_uid))
def split_train_test_proportion(data, test_prop=0.2):
    tr_list, te_list = list(), list()
    np.random.seed(98765)
    for _, group in data.groupby('userId'):
        n_items_u = len(group)
        if n_items_u >= 5:
            idx = np.zeros(n_items_u, dtype='bool')
            idx[np.random.choice(n_items_u, size=int(test_prop * n_items_u),
                                 replace=False).astype('int64')] = True
            tr_list.append(group[np.logical_not(idx)])
            te_list.append(group[idx])
        else:
            tr_list.append(group)
    return pd.concat(tr_list), pd.concat(te_list)
vad_plays = raw_data.loc[raw_data['userId'].isin(vd_users)]
vad_plays = vad_plays.loc[vad_plays['movieId'].isin(unique_sid)]
vad_plays_tr, vad_plays_te = split_train_test_proportion(vad_plays)
test_plays = raw_data.loc[raw_data['userId'].isin(te_users)]
test_plays = test_plays.loc[test_plays['movieId'].isin(unique_sid)]
test_plays_tr, test_plays_te = split_train_test_proportion(test_plays)
def numerize(tp):
    uid = [profile2id[x] for x in tp['userId']]
    sid = [show2id[x] for x in tp['movieId']]
    return pd.DataFrame(data={'uid': uid, 'sid': sid}, columns=['uid', 'sid'])
import os
os.makedirs(out, exist_ok=True)
numerize(train_plays).to_csv(os.path.join(out, 'train.csv'), index=False)
numerize(vad_plays_tr).to_csv(os.path.join(out, 'validation_tr.csv'), index=False)
numerize(vad_plays_te).to_csv(os.path.join(out, 'validation_te.csv'), index=False)
numerize(test_plays_tr).to_csv(os.path.join(out, 'test_tr.csv'), index=False)
numerize(test_plays_te).to_csv(os.path.join(out, 'test_te.csv'), index=False)
print(len(unique_sid), 'items', len(tr_users), 'train users')
"""


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GB, last output line) of one subprocess."""
    t = time.perf_counter()
    p = subprocess.Popen(
        [str(c) for c in cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{out[-3000:]}")
    return wall, usage.ru_maxrss / 1024**2, out.strip().splitlines()[-1] if out.strip() else ""


def _generate(kind: str, path: Path, n_rows: int) -> None:
    """Write the synthetic files in a child process. A forked child starts with its parent's
    peak RSS (Linux keeps the high-water mark across fork and exec), so this process must stay
    small for the ru_maxrss of the timed children to be theirs alone."""
    subprocess.run([sys.executable, __file__, "--make", kind, str(path), str(n_rows)], check=True)


def main() -> None:
    if sys.argv[1:2] == ["--make"]:
        kind, path, n_rows = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
        (make_ml20m if kind == "ml20m" else make_netflix)(path, n_rows)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=ML_ROWS, help="ML-20M-format rows")
    ap.add_argument("--netflix-rows", type=int, default=NF_ROWS, help="0 skips the Netflix run")
    ap.add_argument("--no-pandas", action="store_true", help="skip the pandas reference")
    ap.add_argument(
        "--heldout-users", type=int, default=10_000, help="validation and test users each (10,000)"
    )
    ap.add_argument("--workdir", help="keep the generated files here (default: a temp dir)")
    a = ap.parse_args()
    if 0 < a.netflix_rows < 3 * NF_ITEMS:
        ap.error(f"--netflix-rows: 0, or at least {3 * NF_ITEMS:,} (3 ratings per movie)")
    work = Path(a.workdir or tempfile.mkdtemp(prefix="vaecf-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    csv = work / "ml-20m" / "ratings.csv"
    if not csv.exists() or a.workdir is None:
        csv.parent.mkdir(exist_ok=True)
        _generate_timed("ml20m", csv, a.rows, f"{csv} ({a.rows:,} rows)")
    data = f"ml-20m format, {a.rows:,} rows"
    rows.append((data, "vaecf (Polars)", *_vaecf_prepare(work, "ml-20m", csv, a.heldout_users)))
    print(rows[-1], flush=True)
    if not a.no_pandas:
        script = work / "reference.py"
        script.write_text(PANDAS_REFERENCE)
        cmd = [sys.executable, script, csv, work / "out-pandas", a.heldout_users]
        rows.append((data, "pandas notebook", *timed(cmd)))
        print(rows[-1], flush=True)
    if a.netflix_rows:
        nf = work / "netflix"
        nf.mkdir(exist_ok=True)
        if not (nf / "combined_data_4.txt").exists() or a.workdir is None:
            what = f"4 combined_data files ({a.netflix_rows:,} ratings)"
            _generate_timed("netflix", nf, a.netflix_rows, what)
        data = f"netflix format, {a.netflix_rows:,} rows"
        rows.append((data, "vaecf (Polars)", *_vaecf_prepare(work, "netflix", nf, a.heldout_users)))
        print(rows[-1], flush=True)

    print(f"\n{'data':38s} {'implementation':16s} {'wall s':>8s} {'peak RSS GB':>12s}")
    for data, impl, w, m, _ in rows:
        print(f"{data:38s} {impl:16s} {w:8.1f} {m:12.2f}")
    if len(rows) >= 2 and rows[1][1] == "pandas notebook":
        print(f"\nvaecf is {rows[1][2] / rows[0][2]:.1f}x faster than the pandas reference")
    print(f"(files in {work}; {os.cpu_count()} CPUs)")


def _generate_timed(kind: str, path: Path, n_rows: int, what: str) -> None:
    t = time.perf_counter()
    _generate(kind, path, n_rows)
    print(f"wrote {what} in {time.perf_counter() - t:.0f} s", flush=True)


def _vaecf_prepare(work: Path, name: str, source: Path, heldout: int) -> tuple:
    """(wall s, peak RSS GB, last line) of `vaecf prepare NAME --source SOURCE`."""
    cmd = [sys.executable, "-m", "vaecf", "prepare", name, "--source", source, "--overwrite"]
    cmd += ["--out", work / f"out-{'vaecf' if name == 'ml-20m' else name}"]
    cmd += ["--heldout-users", heldout, "--quiet"]
    return timed(cmd, {"VAECF_HOME": str(work / "home")})


if __name__ == "__main__":
    main()
