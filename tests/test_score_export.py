"""Batch scoring (vaecf score) against Recommender.recommend_batch, and ONNX export (vaecf
export) against PyTorch's scores through onnxruntime."""

from __future__ import annotations

import os
import random

import numpy as np
import polars as pl
import pytest
import torch

from vaecf import rundir, score
from vaecf.cli import main
from vaecf.errors import ConfigError, DataError, WriteError
from vaecf.export import check_onnx, export_onnx
from vaecf.recommender import Recommender
from vaecf.score import onefile, reading, score_file
from vaecf.serve.fixtures import fresh_run

IDS = list(range(500, 580))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("score")
    return fresh_run(root / "run", len(IDS), "multvae", {"hidden_dims": [16], "latent_dim": 4}, IDS)


def interactions(n_users: int = 37, seed: int = 0) -> pl.DataFrame:
    rng = random.Random(seed)
    rows = []
    for u in rng.sample(range(10_000), n_users):
        for item in rng.sample([*IDS, 9, 10], rng.randint(1, 12)):  # 9, 10: unknown ids
            rows.append((u, item))
    rng.shuffle(rows)  # users interleaved, as files come
    return pl.DataFrame(rows, schema={"uid": pl.Int64, "movie": pl.Int64}, orient="row")


@pytest.mark.parametrize("fmt,precision", [("csv", "fp32"), ("parquet", "fp32"), ("csv", "int8")])
def test_score_file_equals_recommend_batch(run, tmp_path, fmt, precision):
    df = interactions()
    src = tmp_path / f"in.{fmt}"
    getattr(df, f"write_{fmt}")(src)
    rec = Recommender.load(run, precision=precision)
    out = tmp_path / "recs.parquet"
    seen = []
    res = score_file(
        rec, src, "uid", "movie", out, k=7, chunk_rows=40, batch_users=5, progress=seen.append
    )
    got = pl.read_parquet(out)
    assert got.columns == ["uid", "rank", "item_id", "score"]
    users = sorted(df.get_column("uid").unique().to_list())
    assert res["users"] == len(users) == sum(seen) and res["chunks"] > 1
    histories = [df.filter(pl.col("uid") == u).get_column("movie").to_list() for u in users]
    # in batches of at most 5, like score_file's: an int8 copy scores small batches with the
    # int8 kernel and large ones with a bf16 product (equal to within bf16 rounding, not bits)
    want = [
        r for b in range(0, len(users), 5) for r in rec.recommend_batch(histories[b : b + 5], 7)
    ]
    assert got.get_column("uid").to_list() == [u for u, r in zip(users, want) for _ in r.item_ids]
    assert got.get_column("rank").to_list() == [j + 1 for r in want for j in range(len(r.item_ids))]
    assert got.get_column("item_id").to_list() == [i for r in want for i in r.item_ids]
    np.testing.assert_allclose(
        got.get_column("score").to_numpy(), [s for r in want for s in r.scores], rtol=1e-5
    )


@pytest.mark.parametrize("name", ["in.csv", "in.jsonl.gz"])
def test_score_file_with_text_user_ids_in_chunks(run, tmp_path, name):
    """Users named by text (Amazon's reviewerID), in several chunks of users, from a CSV and
    from gzip-compressed JSON Lines: each user's rows are recommend_batch's for their items."""
    import gzip

    df = interactions().with_columns(("A" + pl.col("uid").cast(pl.String)).alias("reviewerID"))
    df = df.select("reviewerID", pl.col("movie").alias("asin"))
    src = tmp_path / name
    if name.endswith(".gz"):
        src.write_bytes(gzip.compress(df.write_ndjson().encode()))
    else:
        df.write_csv(src)
    rec = Recommender.load(run)
    res = score_file(rec, src, None, None, tmp_path / "o.parquet", k=3, chunk_rows=40)
    got = pl.read_parquet(tmp_path / "o.parquet")
    users = sorted(df.get_column("reviewerID").unique().to_list())
    assert res["chunks"] > 1 and got.get_column("reviewerID").unique().sort().to_list() == users
    histories = [df.filter(pl.col("reviewerID") == u).get_column("asin").to_list() for u in users]
    want = rec.recommend_batch(histories, 3)
    assert got.get_column("item_id").to_list() == [i for r in want for i in r.item_ids]


def test_score_cli_writes_atomically_and_checks_columns(run, tmp_path, capsys):
    src = tmp_path / "in.parquet"
    interactions(12).write_parquet(src)
    out = tmp_path / "deep" / "recs.csv"
    args = ["score", str(run), "--input", str(src), "--user-col", "uid", "--item-col", "movie"]
    assert main([*args, "-k", "3", "--out", str(out), "--quiet"]) == 0
    got = pl.read_csv(out)
    assert got.height == 36 and got.get_column("rank").max() == 3
    assert [p.name for p in out.parent.iterdir()] == ["recs.csv"]  # no temp files left
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as open(out, "w") gives, not 0600
    # what a killed run leaves (a parts directory, a temp file) goes with the next run
    (out.parent / ".recs.csv.k1ll3d.parts.tmp").mkdir()
    (out.parent / ".recs.csv.k1ll3d.parts.tmp" / "000000.parquet").write_bytes(b"x" * 100)
    (out.parent / ".recs.csv.abc123.tmp").write_bytes(b"half a file")
    assert main([*args, "-k", "3", "--out", str(out), "--quiet"]) == 0
    assert [p.name for p in out.parent.iterdir()] == ["recs.csv"]
    flagged = out.read_bytes()  # without the flags, uid and movie are found by name
    assert main(["score", str(run), "--input", str(src), "-k", "3", "--out", str(out)]) == 0
    assert out.read_bytes() == flagged
    odd = tmp_path / "odd.parquet"
    interactions(12).rename({"uid": "who", "movie": "what"}).write_parquet(odd)
    assert main(["score", str(run), "--input", str(odd), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--user-col (the columns" in err and "'who'" in err
    with pytest.raises(DataError, match="does not exist"):
        score_file(Recommender.load(run), tmp_path / "nope.csv", "u", "i", tmp_path / "o.parquet")


def test_score_precision_auto_scores_with_the_copy_it_chose_and_says_which(run, tmp_path, capsys):
    """`vaecf score` chooses its copy (auto, the default) at its batch size, prints the choice
    and each candidate's timings, names it in --json, and scores as that precision given
    explicitly does; a second run reads the choice from the cache."""
    import json

    src = tmp_path / "in.parquet"
    interactions(20).write_parquet(src)
    base = ["score", str(run), "--input", str(src), "-k", "4", "--quiet", "--batch-users", "8"]
    assert main([*base, "--out", str(tmp_path / "auto.parquet"), "--json"]) == 0
    out, err = capsys.readouterr()
    res = json.loads(out)
    choice = res["precision_choice"]
    assert res["precision"] == choice["chosen"] and choice["batch_sizes"] == [8]
    assert choice["source"] == "measured" and res["users"] == 20
    lines = err.splitlines()
    assert lines[0].startswith(f"precision auto: {choice['chosen']} (measured in ")
    assert [line.split()[0] for line in lines[1 : 1 + len(choice["candidates"])]] == [
        c["precision"] for c in choice["candidates"]
    ]
    given = tmp_path / "given.parquet"
    assert main([*base, "--out", str(given), "--precision", choice["chosen"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["precision_choice"] is None
    assert pl.read_parquet(tmp_path / "auto.parquet").equals(pl.read_parquet(given))
    assert main([*base, "--out", str(tmp_path / "again.parquet")]) == 0
    assert "timings read from" in capsys.readouterr().err.splitlines()[0]


MODELS = {
    "multvae": {"hidden_dims": [32], "latent_dim": 8},
    "multdae": {"latent_dim": 8},
    "recvae": {"hidden_dim": 32, "latent_dim": 8, "n_layers": 3},
    "ease": None,
    "popular": None,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_scores_match_pytorch(name, tmp_path):
    n = 300
    run_dir = fresh_run(tmp_path / name, n, name, MODELS[name], seed=7)
    path = export_onnx(run_dir, tmp_path / f"{name}.onnx")
    model, _ = rundir.load_model(run_dir)
    rng = random.Random(1)
    histories = [rng.sample(range(n), rng.randint(1, 40)) for _ in range(16)] + [[]]
    res = check_onnx(path, model, histories)
    assert res["top100_equal"]
    assert res["max_abs_diff"] <= 1e-5 * max(1.0, res["max_abs_score"])


def test_export_cli_default_path_and_dynamic_batch(run, capsys):
    import onnx
    import onnxruntime as ort

    assert main(["export", str(run), "--format", "onnx", "--json"]) == 0
    assert '"top100_equal": true' in capsys.readouterr().out
    path = run / "model.onnx"
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["vaecf_model"] == "multvae" and meta["n_items"] == str(len(IDS))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b in (1, 5):
        x = np.zeros((b, len(IDS)), np.float32)
        assert sess.run(None, {"history": x})[0].shape == (b, len(IDS))


def test_an_export_that_fails_its_check_never_takes_the_name(run, tmp_path):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"the previous export")
    seen = []

    def refuse(path, model):
        seen.append((path.name, path.stat().st_size > 1000, model.n_items))
        raise ConfigError("differs")

    with pytest.raises(ConfigError, match="differs"):
        export_onnx(run, out, check=refuse)
    assert out.read_bytes() == b"the previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temp file left
    assert seen and seen[0][0] != "m.onnx" and seen[0][1:] == (True, len(IDS))
    export_onnx(run, out, check=lambda path, model: None)
    assert out.stat().st_size > 1000


def test_score_maps_string_ids_like_the_recommender(run, tmp_path):
    """An int vocabulary read from a text column: " 501" and "501" are item 501, "x9" is
    unknown; a user with only unknown items still gets an answer, like recommend_batch's."""
    src = tmp_path / "in.csv"
    src.write_text('uid,movie\n1," 501"\n1,502\n1,x9\n2,x9\n3,503\n3,503\n')
    df = pl.read_csv(src, schema_overrides={"movie": pl.String})
    assert df.schema["movie"] == pl.String
    df.write_parquet(tmp_path / "in.parquet")
    rec = Recommender.load(run)
    score_file(rec, tmp_path / "in.parquet", "uid", "movie", tmp_path / "o.parquet", k=4)
    got = pl.read_parquet(tmp_path / "o.parquet")
    want = rec.recommend_batch([[" 501", "502", "x9"], ["x9"], ["503", "503"]], 4)
    assert got.get_column("item_id").to_list() == [i for r in want for i in r.item_ids]
    assert got.get_column("uid").to_list() == [1] * 4 + [2] * 4 + [3] * 4
    assert not {501, 502} & set(got.filter(pl.col("uid") == 1).get_column("item_id").to_list())
    floats = pl.DataFrame({"uid": [1, 1, 2], "movie": [501.0, 502.5, 503.0]})
    floats.write_parquet(tmp_path / "f.parquet")
    score_file(rec, tmp_path / "f.parquet", "uid", "movie", tmp_path / "f_out.parquet", k=4)
    got = pl.read_parquet(tmp_path / "f_out.parquet")
    want = rec.recommend_batch([[501], [503]], 4)  # 502.5 names no item
    assert got.get_column("item_id").to_list() == [i for r in want for i in r.item_ids]


@pytest.mark.parametrize("name", ["recvae-edlae", "blend"])
def test_onnx_of_composite_models_through_the_contract(name, tmp_path):
    """Models that combine others export through their `dense_scores`, like every model."""
    n = 200
    config = {"hidden_dim": 32, "latent_dim": 8, "n_layers": 3}
    if name == "blend":
        config = {"parts": ["ease", "multdae"], "configs": [{}, {"latent_dim": 8}], "weight": 0.3}
    run_dir = fresh_run(tmp_path / name, n, name, config, seed=3)
    model, _ = rundir.load_model(run_dir)
    torch.manual_seed(0)
    for key, t in model.state_dict().items():  # the linear paths a fresh run leaves at zero
        if key.endswith(("weight", "shallow", "alpha")) and not key.startswith("parts.1"):
            if t.dim() == 2 and t.shape[0] == t.shape[1] == n:
                t.normal_(0.0, 0.05).fill_diagonal_(0.0)
            elif t.dim() == 0:
                t.fill_(0.7)
    rundir.save_model(run_dir, model, epoch=0, metrics={})
    path = export_onnx(run_dir, tmp_path / f"{name}.onnx")
    model, _ = rundir.load_model(run_dir)
    rng = random.Random(2)
    histories = [rng.sample(range(n), rng.randint(1, 30)) for _ in range(12)]
    res = check_onnx(path, model, histories)
    assert res["top100_equal"]
    assert res["max_abs_diff"] <= 1e-4 * max(1.0, res["max_abs_score"])


def test_onnx_of_a_sparse_solver_ease(tmp_path):
    """The sparse solver's B (CSR parts, no n_items^2 weight) exports as a dense product."""
    import scipy.sparse as sp

    from vaecf import models

    n = 120
    rng = np.random.default_rng(4)
    x = sp.csr_matrix((rng.random((300, n)) < 0.1).astype(np.float32))
    run_dir = fresh_run(tmp_path / "run", n, "ease", {"l2": 20.0, "solver": "sparse"}, seed=1)
    model, _ = rundir.load_model(run_dir)
    model.fit(x)
    assert model.sparse and model.weight.numel() == 0
    rundir.save_model(run_dir, model, epoch=0, metrics={})
    path = export_onnx(run_dir, tmp_path / "ease.onnx")
    loaded, _ = rundir.load_model(run_dir)
    assert loaded.sparse and isinstance(loaded, models.MODELS["ease"])
    histories = [rng.choice(n, size=rng.integers(1, 20), replace=False).tolist() for _ in range(9)]
    res = check_onnx(path, loaded, histories)
    assert res["top100_equal"] and res["max_abs_score"] > 0
    assert res["max_abs_diff"] <= 1e-4 * max(1.0, res["max_abs_score"])


def test_score_refuses_before_scoring_when_the_disk_is_too_small(run, tmp_path, monkeypatch):
    src = tmp_path / "in.parquet"
    interactions().write_parquet(src)
    rec = Recommender.load(run)
    out = tmp_path / "recs.csv"
    assert score.check_disk(out, 37, 7) == 37 * 7 * 50  # a part row and a CSV row
    assert score.check_disk(tmp_path / "r.parquet", 10, 80) == 10 * 80 * 20
    monkeypatch.setattr(onefile, "free_bytes", lambda path: 5_000)
    monkeypatch.setattr(rec, "top_k", lambda *a, **kw: pytest.fail("scored before the check"))
    with pytest.raises(
        WriteError,
        match=r"no space for .*recs.csv: scoring 37 users at k=7 writes up to 259 rows",
    ):
        score_file(rec, src, "uid", "movie", out, k=7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]  # nothing left


def test_score_batches_are_sized_by_memory(run, tmp_path, monkeypatch):
    src = tmp_path / "in.parquet"
    interactions().write_parquet(src)
    rec = Recommender.load(run)
    sizes, top_k = [], rec.top_k
    monkeypatch.setattr(
        rec, "top_k", lambda b, *a, **kw: (sizes.append(b.batch_size), top_k(b, *a, **kw))[1]
    )
    monkeypatch.setattr(reading, "SCORE_BUDGET", 4 * len(IDS) * 3)  # three users' scores
    res = score_file(rec, src, "uid", "movie", tmp_path / "r.parquet", k=5, batch_users=1024)
    assert max(sizes) == 3 and sum(sizes) == res["users"] == 37


@pytest.fixture(scope="module")
def rated_run(tmp_path_factory):
    """A run prepared keeping ratings of at least 4, with item names; its ratings file holds the
    low ratings too, as a user's file of everything they rated would."""
    import vaecf

    root = tmp_path_factory.mktemp("rated")
    rng = random.Random(3)
    rows = [(u, i, rng.choice([1, 2, 4, 5])) for u in range(60) for i in rng.sample(IDS, 12)]
    ratings = pl.DataFrame(rows, schema=["user", "item", "rating"], orient="row")
    ratings.write_csv(root / "ratings.csv")
    names = {i: f"Film {i}" for i in IDS}
    rec = vaecf.fit(
        ratings, model="ease", l2=10.0, min_rating=4, validation=5, test=0.1,
        item_names=names, progress=False, out=root / "run",
    )  # fmt: skip
    return rec, root


def test_score_keeps_the_runs_own_rating_threshold_and_names_the_items(rated_run, tmp_path):
    rec, root = rated_run
    out = tmp_path / "recs.parquet"
    score_file(rec, root / "ratings.csv", None, None, out, k=5)
    got = pl.read_parquet(out)
    assert got.columns == ["user", "rank", "item_id", "score", "title"]
    assert got.get_column("title").to_list() == [f"Film {i}" for i in got.get_column("item_id")]
    for u in (0, 1, 2):  # as `vaecf recommend --user`: the history the run was prepared with
        want = rec.recommend_user(u, k=5).item_ids
        assert got.filter(pl.col("user") == u).get_column("item_id").to_list() == want, u
    import pandas as pd  # as a user reads it: make demo's environment has what pandas needs

    assert pd.read_parquet(out).shape == got.shape
    every = tmp_path / "every.parquet"  # every row as history: the low ratings too
    score_file(rec, root / "ratings.csv", None, None, every, k=5, rows=score.RowFilter())
    assert not pl.read_parquet(every).equals(got)


def test_score_needs_the_ratings_its_run_kept_and_reads_a_file_without_a_header(
    rated_run, tmp_path, capsys
):
    rec, root = rated_run
    ratings = pl.read_csv(root / "ratings.csv")
    ratings.select("user", "item").write_csv(tmp_path / "pairs.csv")
    with pytest.raises(DataError, match=r"the run's own preparation keeps ratings of at least 4"):
        score_file(rec, tmp_path / "pairs.csv", None, None, tmp_path / "o.parquet")
    run = str(root / "run")
    assert main(["score", run, "--input", str(tmp_path / "pairs.csv"), "--out",
                 str(tmp_path / "o.parquet"), "--quiet"]) == 2  # fmt: skip
    assert "or pass --every-row" in capsys.readouterr().err
    bare = tmp_path / "ratings.txt"  # FilmTrust's form: no header, fields split by spaces
    bare.write_text("".join(f"{u} {i} {r}\n" for u, i, r in ratings.iter_rows()))
    assert main(["score", run, "--input", str(bare), "--out", str(tmp_path / "b.csv")]) == 2
    assert "has no header row" in capsys.readouterr().err
    argv = ["score", run, "--input", str(bare), "--out", str(tmp_path / "b.csv"), "--quiet"]
    argv += ["--precision", "fp32"]  # the scores `rec` gives (auto may choose another copy)
    assert main([*argv, "--no-header", "--columns", "user,item,rating", "-k", "5"]) == 0
    score_file(rec, root / "ratings.csv", None, None, tmp_path / "a.csv", k=5)
    got, want = (pl.read_csv(tmp_path / f).sort("user", "rank") for f in ("b.csv", "a.csv"))
    assert got.drop("score").equals(want.drop("score"))
