"""The command line, end to end: every test runs the real entry point in a subprocess.

`python -m vaecf ...` with VAECF_HOME in a temporary directory. Each subprocess pays the import
of torch (~2.5 s here), so independent commands are run a few at a time in parallel by
module-scoped fixtures, and the tests assert on their results.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from vaecf.data.synthetic import generate

TIMEOUT = 240  # seconds any single command may take before the test fails
PARALLEL = 3  # commands run at once (the machine has 2 cores; imports are single-threaded)
METRICS = ("recall@20", "recall@50", "ndcg@100")
MIN_RATING = 2


# -- running the CLI -----------------------------------------------------------------------------
@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:  # shown by failing asserts
        return (
            f"vaecf {' '.join(self.args)}\n-> exit {self.returncode}\n"
            f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"
        )

    def json(self):
        assert self.returncode == 0, str(self)
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as e:
            pytest.fail(f"stdout is not one JSON document ({e}):\n{self}")


CONSOLE_SCRIPT = Path(sys.executable).parent / "vaecf"


def _argv(args: Sequence, console: bool = False) -> list[str]:
    head = [str(CONSOLE_SCRIPT)] if console else [sys.executable, "-m", "vaecf"]
    return [*head, *map(str, args)]


def run(args: Sequence, env: dict, extra_env: dict | None = None, console: bool = False) -> Result:
    """`python -m vaecf ARGS` (or the installed console script) in a subprocess."""
    args = [str(a) for a in args]
    try:
        p = subprocess.run(
            _argv(args, console),
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"vaecf {' '.join(args)} ran past {TIMEOUT} s")
    return Result(args, p.returncode, p.stdout, p.stderr)


def run_many(cmds: dict[str, Sequence], env: dict, extra_env: dict | None = None) -> dict:
    """Run independent commands PARALLEL at a time; {name: Result}. `extra_env`: {name: env}."""
    extra_env = extra_env or {}
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            name: pool.submit(run, args, env, extra_env.get(name)) for name, args in cmds.items()
        }
        return {name: f.result() for name, f in futures.items()}


def assert_bad_input(r: Result, *keywords: str) -> None:
    """Exit 2, a one-line-ish message naming what to do, and no traceback."""
    assert r.returncode == 2, str(r)
    assert "Traceback" not in r.stderr, str(r)
    assert r.stderr.strip(), str(r)
    assert f"vaecf {r.args[0]}: error:" in r.stderr, str(r)
    for k in keywords:
        assert k.lower() in r.stderr.lower(), f"{k!r} not in stderr:\n{r}"


def listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def snapshot(run_dir: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("vaecf_home")
    e = dict(os.environ)
    e.update(VAECF_HOME=str(home), COLUMNS="200", PYTHONDONTWRITEBYTECODE="1")
    return e


@dataclass
class Workspace:
    root: Path
    csv: Path
    frame: pl.DataFrame
    data: Path  # prepared small dataset
    run: Path  # trained run on it
    big_data: Path  # prepared bigger dataset (resume test)
    prepare: Result
    prepare_big: Result
    train: Result


@pytest.fixture(scope="module")
def ws(tmp_path_factory, env) -> Workspace:
    root = tmp_path_factory.mktemp("cli")
    (root / "inputs").mkdir()
    (root / "prepared").mkdir()
    (root / "runs").mkdir()

    df = generate(n_users=600, n_items=150, n_groups=5, seed=1)
    rng = np.random.default_rng(0)
    # ~10% of rows are "dislikes" (rating 1) that --min-rating 2 must drop
    rating = np.where(rng.random(df.height) < 0.1, 1, rng.integers(3, 6, df.height))
    df = df.with_columns(rating=pl.Series(rating.astype(np.int64)))
    csv = root / "inputs" / "interactions.csv"
    df.write_csv(csv)

    big_csv = root / "inputs" / "big.csv"
    generate(n_users=1500, n_items=250, n_groups=6, seed=2).write_csv(big_csv)

    data, big_data = root / "prepared" / "small", root / "prepared" / "big"
    prep = run_many(
        {
            "small": [
                "prepare", "csv", "--path", csv, "--user-col", "user_id", "--item-col",
                "item_id", "--rating-col", "rating", "--min-rating", MIN_RATING,
                "--heldout-users", 50, "--out", data, "--json",
            ],
            "big": [
                "prepare", "csv", "--path", big_csv, "--user-col", "user_id", "--item-col",
                "item_id", "--heldout-users", 100, "--out", big_data,
            ],
        },
        env,
    )  # fmt: skip
    assert prep["small"].returncode == 0, str(prep["small"])
    assert prep["big"].returncode == 0, str(prep["big"])

    run_dir = root / "runs" / "run1"
    tr = run(
        ["train", "--data", data, "--out", run_dir, "--epochs", 3, "--batch-size", 100,
         "--quiet", "--json"],
        env,
    )  # fmt: skip
    return Workspace(root, csv, df, data, run_dir, big_data, prep["small"], prep["big"], tr)


@pytest.fixture(scope="module")
def popular(ws) -> list[int]:
    """The three most frequent positive items: the ones a model most wants to recommend."""
    pos = ws.frame.filter(pl.col("rating") >= MIN_RATING)
    return pos.get_column("item_id").value_counts(sort=True).get_column("item_id")[:3].to_list()


@pytest.fixture(scope="module")
def manifest_text(ws) -> str:
    return (ws.data / "manifest.json").read_text()


@pytest.fixture(scope="module")
def queries(ws, env, popular, manifest_text) -> dict:
    hist = ",".join(map(str, popular))
    return run_many(
        {
            "prepare_again": [
                "prepare", "csv", "--path", ws.csv, "--user-col", "user_id", "--item-col",
                "item_id", "--rating-col", "rating", "--min-rating", MIN_RATING,
                "--heldout-users", 50, "--out", ws.data,
            ],
            "prepare_by_names": [  # the columns found by their names: the same dataset
                "prepare", "csv", "--path", ws.csv, "--min-rating", MIN_RATING,
                "--heldout-users", 50, "--out", ws.root / "by-names",
            ],
            "info_json": ["info", ws.data, "--json"],
            "eval_test": ["evaluate", ws.run, "--json"],
            "eval_validation": ["evaluate", ws.run, "--split", "validation", "--json"],
            "eval_int8": ["evaluate", ws.run, "--precision", "int8", "--json"],
            "recommend": ["recommend", ws.run, "--items", hist, "-k", 5, "--json"],
            "recommend_unknown": [
                "recommend", ws.run, "--items", f"{hist},no-such-item", "-k", 5, "--json",
            ],
            "recommend_text": ["recommend", ws.run, "--items", f"no-such-item,{hist}", "-k", 5],
        },
        env,
    )  # fmt: skip


# -- 1. happy path -------------------------------------------------------------------------------
def test_prepare_writes_a_dataset(ws):
    r = ws.prepare
    assert "Traceback" not in r.stderr, str(r)
    out = r.json()
    assert ws.data.is_dir() and (ws.data / "manifest.json").is_file()
    for name in ("train", "validation_tr", "validation_te", "test_tr", "test_te"):
        assert (ws.data / f"{name}.npz").is_file(), name
    assert (ws.data / "items.parquet").is_file()
    c = out["counts"]
    assert c["n_validation_users"] == c["n_test_users"] == 50
    assert c["n_train_users"] == c["n_users"] - 100
    assert c["n_items"] <= 150
    # no temp or backup directories left beside the output
    assert listing(ws.data.parent) == ["big", "small"]


def test_prepare_rating_filter_is_applied(ws):
    m = json.loads((ws.data / "manifest.json").read_text())
    n_pos = ws.frame.filter(pl.col("rating") >= MIN_RATING).height
    assert m["counts"]["n_rows"] == ws.frame.height
    assert m["counts"]["n_positive_rows"] == n_pos < ws.frame.height
    assert m["settings"]["min_rating"] == MIN_RATING
    assert m["settings"]["heldout_users"] == 50
    assert m["source"]["columns"] == {"user": "user_id", "item": "item_id", "rating": "rating"}


def test_prepare_finds_the_columns_by_name_and_says_which(ws, queries, manifest_text):
    r = queries["prepare_by_names"]
    assert r.returncode == 0, str(r)
    first, second = r.stdout.splitlines()
    assert first == "columns found by name: users 'user_id', items 'item_id', ratings 'rating'"
    assert second.startswith(f"prepared {ws.root / 'by-names'}:")
    got = json.loads((ws.root / "by-names" / "manifest.json").read_text())
    want = json.loads(manifest_text)  # the dataset prepared with the columns named
    assert got["source"]["columns"] == want["source"]["columns"]
    assert got["counts"] == want["counts"] and got["settings"] == want["settings"]


def test_prepare_again_with_same_settings_reuses_the_dataset(ws, queries, manifest_text):
    r = queries["prepare_again"]
    assert r.returncode == 0, str(r)
    assert "50 validation + 50 test users" in r.stdout
    assert (ws.data / "manifest.json").read_text() == manifest_text  # not rewritten
    assert listing(ws.data.parent) == ["big", "small"]


def test_info(ws, queries):
    manifest = queries["info_json"].json()
    assert manifest == json.loads((ws.data / "manifest.json").read_text())
    assert manifest["counts"]["n_validation_users"] == 50


def test_train_writes_a_complete_run(ws):
    out = ws.train.json()
    run_dir = ws.run
    for name in ("config.json", "best.pt", "last.pt", "metrics.jsonl", "results.json",
                 "items.parquet"):  # fmt: skip
        assert (run_dir / name).is_file(), f"{name} missing; run dir has {listing(run_dir)}"
    assert not [n for n in listing(run_dir) if n.startswith(".")], listing(run_dir)

    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert all(np.isfinite(row["loss"]) and "validation" in row for row in rows)
    counts = ws.prepare.json()["counts"]
    results = json.loads((run_dir / "results.json").read_text())
    # Mult-VAE's default: the training users, then the held-out users' fold-in rows
    n_rows = sum(counts[f"n_{k}_users"] for k in ("train", "validation", "test"))
    assert results["train_rows"] == n_rows
    assert rows[-1]["step"] == 3 * -(-n_rows // 100)  # ceil(rows / batch size)

    assert out["best_epoch"] == results["best_epoch"] in (1, 2, 3)
    assert out["test"] == results["test"]
    assert out["validation"] == results["validation"]
    best_row = rows[results["best_epoch"] - 1]
    assert best_row["validation"] == results["validation"]

    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["batch_size"] == 100
    assert cfg["data"]["fingerprint"] == ws.prepare.json()["fingerprint"]
    assert (run_dir / "items.parquet").read_bytes() == (ws.data / "items.parquet").read_bytes()


def _check_metrics(m: dict) -> None:
    for k in METRICS:
        assert isinstance(m[k], float) and 0.0 <= m[k] <= 1.0, (k, m[k])
    assert isinstance(m["n_users"], int) and 0 < m["n_users"] <= 50


def test_evaluate_test_split_reproduces_results(ws, queries):
    m = queries["eval_test"].json()
    assert isinstance(m, dict)
    _check_metrics(m)
    assert m["split"] == "test"
    results = json.loads((ws.run / "results.json").read_text())
    for k in (*METRICS, "n_users"):
        assert m[k] == results["test"][k], k


def test_evaluate_uses_the_runs_precision(ws, env):
    run_dir = ws.root / "runs" / "bf16"
    args = ["train", "--data", ws.data, "--out", run_dir, "--epochs", 1, "--batch-size", 100]
    tr = run([*args, "--precision", "bf16", "--quiet", "--json"], env)
    assert tr.returncode == 0, str(tr)
    m = run(["evaluate", run_dir, "--json"], env).json()
    results = json.loads((run_dir / "results.json").read_text())
    for k in (*METRICS, "n_users"):
        assert m[k] == results["test"][k], k


def test_evaluate_a_serving_copy(ws, queries):
    m = queries["eval_int8"].json()
    _check_metrics(m)
    results = json.loads((ws.run / "results.json").read_text())
    assert m["n_users"] == results["test"]["n_users"]
    for k in METRICS:  # int8 item weights cost little accuracy
        assert abs(m[k] - results["test"][k]) < 0.05, k


def test_evaluate_validation_split_reproduces_results(ws, queries):
    m = queries["eval_validation"].json()
    _check_metrics(m)
    assert m["split"] == "validation"
    results = json.loads((ws.run / "results.json").read_text())
    for k in (*METRICS, "n_users"):
        assert m[k] == results["validation"][k], k


def test_recommend(ws, queries, popular):
    rec = queries["recommend"].json()
    assert rec["unknown"] == []
    items = [x["item_id"] for x in rec["items"]]
    scores = [x["score"] for x in rec["items"]]
    assert len(items) == 5 and len(set(items)) == 5
    assert not set(items) & set(popular), "history items were recommended"
    known = set(pl.read_parquet(ws.run / "items.parquet").get_column("item_id").to_list())
    assert set(items) <= known
    assert all(isinstance(i, int) for i in items)  # integer ids stay integers
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s <= 1.0 for s in scores)


def test_recommend_reports_unknown_ids(queries):
    with_unknown = queries["recommend_unknown"].json()
    assert with_unknown["unknown"] == ["no-such-item"]
    # the unknown id is ignored: same recommendations as without it
    assert with_unknown["items"] == queries["recommend"].json()["items"]
    t = queries["recommend_text"]
    assert t.returncode == 0, str(t)
    assert "no-such-item" in t.stderr and "unknown" in t.stderr
    assert "Traceback" not in t.stderr
    first = with_unknown["items"][0]["item_id"]
    assert str(first) in t.stdout.splitlines()[1]


# -- 2. help -------------------------------------------------------------------------------------
HELP = {
    "vaecf": ([], ["prepare", "train", "evaluate", "recommend", "info", "demo", "--version"]),
    "prepare csv": (
        ["prepare", "csv"],
        ["--path", "--user-col", "--item-col", "--rating-col", "--min-rating", "--sep",
         "--min-user-items", "--heldout-users", "--seed", "--out"],
    ),
    "train": (
        ["train"],
        ["--data", "--out", "--model", "--epochs", "--batch-size", "--lr", "--total-anneal-steps",
         "--anneal-cap", "--seed", "--device", "--resume"],
    ),
    "evaluate": (["evaluate"], ["--split", "--json", "--data", "--device", "--precision"]),
    "recommend": (["recommend"], ["--items", "-k", "--json"]),
    "info": (["info"], ["--json"]),
    "demo": (["demo"], ["--out", "--epochs", "--users", "--items", "--seed"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def helps(env) -> dict:
    cmds = {name: [*verb, "--help"] for name, (verb, _) in HELP.items()}
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            # top-level help through the installed console script: the entry point works too
            name: pool.submit(run, args, env, None, name == "vaecf" and CONSOLE_SCRIPT.is_file())
            for name, args in cmds.items()
        }
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", list(HELP))
def test_help(helps, name):
    r = helps[name]
    assert r.returncode == 0, str(r)
    assert r.stdout.startswith("usage: vaecf"), str(r)
    assert "Traceback" not in r.stderr
    for option in HELP[name][1]:
        assert option in r.stdout, f"{option} not in `vaecf {name} --help`:\n{r.stdout}"


# -- 3. bad input: exit 2, a message that says what to do, nothing half-written -------------------
PREPARE_ERRORS = {
    # name: (file name, file content or None for "no such file", extra args, keywords)
    "misnamed_column": (
        "ok.csv", "good", ["--user-col", "userId"], ["userId", "--user-col", "user_id"],
    ),
    "empty_file": ("interactions.csv", "", [], ["is empty", "header row"]),
    "rating_not_a_number": (
        "ratings.csv", "user_id,item_id,rating\n1,10,5\n1,11,abc\n2,10,4\n",
        ["--rating-col", "rating"], ["'abc'", "not a number", "row 2", "fix the file"],
    ),
    "wrong_separator": ("semicolons.csv", "semicolon", ["--sep", ","], ["--sep ';'"]),
    "garbage_parquet": (
        "junk.parquet", b"\x00\x01not parquet\xff" * 50, [], ["cannot read", "as parquet"],
    ),
    "too_few_users": ("ok.csv", "good", ["--heldout-users", 300], ["--heldout-users", "lower"]),
    "columns_with_header": ("ok.csv", "good", ["--columns", "user,item"], ["add --no-header"]),
    "two_char_sep": ("ok.csv", "good", ["--sep", ";;"], ["not a field separator", "whitespace"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def prepare_errors(ws, env, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("prepare_errors")
    good = ws.frame.select("user_id", "item_id")
    cmds, outs = {}, {}
    for name, (fname, content, extra, _) in PREPARE_ERRORS.items():
        inputs = root / name / "inputs"
        inputs.mkdir(parents=True)
        path = inputs / fname
        if content == "good":
            good.write_csv(path)
        elif content == "semicolon":
            good.write_csv(path, separator=";")
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        parent = root / name / "outputs"
        parent.mkdir()
        outs[name] = parent / "prepared"
        args = {"--user-col": "user_id", "--heldout-users": 50}
        args.update(dict(zip(extra[::2], extra[1::2], strict=True)))
        cmds[name] = [
            "prepare", "csv", "--path", path, "--item-col", "item_id", "--out", outs[name],
            *[x for kv in args.items() for x in kv],
        ]  # fmt: skip
    results = run_many(cmds, env)
    return {name: (results[name], outs[name]) for name in cmds}


@pytest.mark.parametrize("name", list(PREPARE_ERRORS))
def test_prepare_bad_input(prepare_errors, name):
    r, out = prepare_errors[name]
    assert_bad_input(r, *PREPARE_ERRORS[name][3])
    assert not out.exists(), f"{out} was created"
    assert listing(out.parent) == [], "temporary files left beside --out"


@pytest.fixture(scope="module")
def run_errors(ws, env, tmp_path_factory, popular) -> dict:
    """Commands against runs that must fail cleanly; the good run must be left untouched."""
    root = tmp_path_factory.mktemp("run_errors")
    broken = root / "broken" / "run"
    shutil.copytree(ws.run, broken)
    (broken / "best.pt").write_bytes(b"this is not a checkpoint\x00\xff" * 100)
    (root / "cuda").mkdir()
    hist = ",".join(map(str, popular))
    before = snapshot(ws.run)
    train = ["train", "--data", ws.data, "--epochs", 1, "--batch-size", 100, "--quiet"]
    cmds = {
        "evaluate_dataset_dir": ["evaluate", ws.data, "--json"],
        "evaluate_broken": ["evaluate", broken, "--json"],
        "recommend_broken": ["recommend", broken, "--items", hist, "--json"],
        "evaluate_other_data": ["evaluate", ws.run, "--data", ws.big_data],
        "train_existing_run": [*train, "--out", ws.run],
        "train_cuda": [*train, "--out", root / "cuda" / "run", "--device", "cuda"],
    }
    # "a machine without CUDA": hide any GPU so that the test means the same everywhere
    results = run_many(cmds, env, {"train_cuda": {"CUDA_VISIBLE_DEVICES": ""}})
    results["root"], results["before"], results["after"] = root, before, snapshot(ws.run)
    return results


def test_evaluate_on_a_directory_that_is_not_a_run(run_errors):
    assert_bad_input(run_errors["evaluate_dataset_dir"], "not a vaecf run", "vaecf train")


@pytest.mark.parametrize("verb", ["evaluate", "recommend"])
def test_corrupted_checkpoint(run_errors, verb):
    r = run_errors[f"{verb}_broken"]
    assert_bad_input(r, "checkpoint", "best.pt", "corrupted", "retrain")
    assert r.stdout == ""


def test_evaluate_with_another_dataset(run_errors):
    assert_bad_input(run_errors["evaluate_other_data"], "not the dataset", "--data")


def test_train_into_an_existing_run_needs_resume(run_errors):
    assert_bad_input(run_errors["train_existing_run"], "already holds a run", "--resume")
    assert run_errors["after"] == run_errors["before"], "the existing run was modified"


def test_train_device_cuda_without_cuda(run_errors):
    assert_bad_input(run_errors["train_cuda"], "cuda", "--device cpu")
    assert listing(run_errors["root"] / "cuda") == [], "a run directory was left behind"


# -- 4. resume ----------------------------------------------------------------------------------
def test_resume_into_a_new_out_keeps_the_given_settings(ws, env, tmp_path):
    out, log = tmp_path / "run", tmp_path / "stderr.txt"
    args = ["train", "--data", ws.data, "--out", out, "--resume", "--batch-size", 100,
            "--lr", 0.005, "--seed", 5, "--quiet"]  # fmt: skip
    with open(log, "wb") as err:
        p = subprocess.Popen(_argv(args), env=env, stdout=subprocess.DEVNULL, stderr=err,
                             stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + TIMEOUT
            while not (out / "config.json").is_file() and p.poll() is None:
                assert time.monotonic() < deadline, "no config.json and no exit"
                time.sleep(0.02)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait(30)
    if not (out / "config.json").is_file():  # refusing "nothing to resume" is fine too
        stderr = log.read_text()
        assert p.returncode == 2 and "Traceback" not in stderr, stderr
        return
    cfg = json.loads((out / "config.json").read_text())["train"]
    assert (cfg["batch_size"], cfg["lr"], cfg["seed"], cfg["progress"]) == (100, 0.005, 5, False)


# CPU: CUDA's scatter-add kernels are not deterministic, so even two uninterrupted runs differ there
RESUME_ARGS = ["--epochs", 6, "--batch-size", 100, "--seed", 3, "--device", "cpu", "--quiet"]


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_resume_after_sigkill_is_bit_identical(ws, env, tmp_path):
    interrupted, straight = tmp_path / "interrupted", tmp_path / "straight"
    base = ["train", "--data", ws.big_data, *RESUME_ARGS]
    logs = {name: open(tmp_path / name, "w+") for name in ("victim", "ref_out", "ref_err")}
    # the same run, uninterrupted, alongside (CPU contention only slows the victim down)
    reference = subprocess.Popen(
        _argv([*base, "--out", straight, "--json"]),
        env=env, stdin=subprocess.DEVNULL, stdout=logs["ref_out"], stderr=logs["ref_err"],
    )  # fmt: skip
    victim = subprocess.Popen(
        _argv([*base, "--out", interrupted]),
        env=env, stdin=subprocess.DEVNULL, stdout=logs["victim"], stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        metrics = interrupted / "metrics.jsonl"
        deadline = time.monotonic() + TIMEOUT
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            if victim.poll() is not None:
                logs["victim"].seek(0)
                pytest.fail(
                    f"training ended (exit {victim.returncode}) before it could be "
                    f"killed; make the resume dataset bigger\n{logs['victim'].read()}"
                )
            assert time.monotonic() < deadline, f"{metrics} did not reach 2 lines in {TIMEOUT} s"
            time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        assert victim.returncode == -signal.SIGKILL
        done = read_jsonl(metrics)
        assert 2 <= len(done) < 6 and not (interrupted / "results.json").exists()

        resumed = run(["train", "--data", ws.big_data, "--out", interrupted, "--resume",
                       "--quiet", "--json"], env)  # fmt: skip
        reference.wait(TIMEOUT)
    finally:
        for p in (victim, reference):
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for f in logs.values():
            f.seek(0)
        ref_out, ref_err = logs["ref_out"].read(), logs["ref_err"].read()
        for f in logs.values():
            f.close()
    assert reference.returncode == 0, ref_err
    assert resumed.returncode == 0, str(resumed)
    assert "Traceback" not in resumed.stderr
    ref, res = json.loads(ref_out), resumed.json()
    assert res["best_epoch"] == ref["best_epoch"]
    assert res["test"] == ref["test"] and res["validation"] == ref["validation"]

    rows_a = read_jsonl(interrupted / "metrics.jsonl")
    rows_b = read_jsonl(straight / "metrics.jsonl")
    assert [r["epoch"] for r in rows_a] == [r["epoch"] for r in rows_b] == list(range(1, 7))
    for a, b in zip(rows_a, rows_b, strict=True):
        assert (a["loss"], a["step"], a["validation"]) == (b["loss"], b["step"], b["validation"])

    res_a = json.loads((interrupted / "results.json").read_text())
    res_b = json.loads((straight / "results.json").read_text())
    for key in ("best_epoch", "validation", "test", "epochs", "steps"):
        assert res_a[key] == res_b[key], key
    for name in ("best.pt", "last.pt"):
        a, b = _tensors(interrupted / name), _tensors(straight / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}: {k} differs after resume"
    assert not [n for n in listing(interrupted) if n.startswith(".")], listing(interrupted)


def test_parser_help_and_data_verbs_do_not_import_torch(tmp_path):
    """The package's promise: building the parser (every verb's options and help), `--help`
    of any verb and `vaecf models` run without importing torch."""
    code = (
        "import sys\n"
        "from vaecf.cli import build_parser, main\n"
        "build_parser()\n"
        "for verb in ('info', 'train', 'tune', 'compare', 'serve', 'bench', 'prepare'):\n"
        "    try:\n"
        "        main([verb, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "main(['models', '--json'])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "NO-TORCH"
    assert '"recvae-edlae"' in out.stdout  # models --json listed the declarations


def test_model_classes_take_their_declarations_from_specs():
    from vaecf import models
    from vaecf.config import specs

    assert list(models.MODELS) == list(specs.SPECS)
    for name, cls in models.MODELS.items():
        spec = specs.SPECS[name]
        assert (cls.name, cls.title, cls.family, cls.Config) == (
            spec.name,
            spec.title,
            spec.family,
            spec.Config,
        )
        assert cls.train_settings == spec.train_settings and cls.closed_form == spec.closed_form
    assert models.describe() == specs.describe()


def test_output_cut_short_by_its_reader_ends_quietly():
    """`vaecf models | head -1`: the reader leaves after a line; no BrokenPipeError traceback."""
    p = subprocess.run(
        f"{sys.executable} -m vaecf models | head -1", shell=True, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert p.stdout.startswith("multvae") and len(p.stdout.splitlines()) == 1
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_a_mistyped_flag_gets_the_verbs_nearest_flag_and_help(capsys):
    from vaecf.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--data", "d", "--out", "o", "--modle", "ease"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines() == [
        "vaecf train: error: unrecognized arguments: --modle (did you mean --model?), ease",
        "see `vaecf train --help`",
    ]
    with pytest.raises(SystemExit):  # a verb's verb, --flag=value
        main(["bench", "infer", "10", "--secnds=1"])
    err = capsys.readouterr().err
    assert err.startswith("vaecf bench infer: error: unrecognized argument: --secnds=1 (did ")
    assert "see `vaecf bench infer --help`" in err


def test_a_mistyped_choice_gets_one_line_and_the_nearest_choice(capsys):
    from vaecf.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--data", "d", "--out", "o", "--model", "eaze"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage:" not in err
    first, second = err.splitlines()
    assert first.startswith("vaecf train: error: argument --model: invalid choice: 'eaze'")
    assert first.endswith("did you mean 'ease'?") and second == "see `vaecf train --help`"
    with pytest.raises(SystemExit):
        main(["trian"])
    assert "did you mean 'train'?" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a missing sub-command: its choices
        main(["bench"])
    assert "required: WHAT (one of: train, infer, eval)\n" in capsys.readouterr().err


def test_vaecf_alone_lists_the_verbs_and_where_to_start(capsys):
    from vaecf.cli import main

    assert main([]) == 2
    err = capsys.readouterr().err
    verbs = ("prepare", "train", "evaluate", "recommend", "serve", "demo", "tune", "compare")
    listed = {line.split()[0] for line in err.splitlines() if line.startswith("    ")}
    assert listed >= set(verbs), err
    assert err.rstrip().endswith("start with `vaecf demo`; `vaecf VERB --help` for a verb's flags")


def test_recommend_text_abridges_unknown_ids_and_says_when_nothing_is_left(ws, capsys):
    from vaecf.cli import main

    many = ",".join(f"nope{i}" for i in range(40))
    assert main(["recommend", str(ws.run), "--items", many, "-k", "3"]) == 0
    err = capsys.readouterr().err
    assert "nope0, nope1" in err and "nope39" not in err and "and 30 more" in err
    every = pl.read_parquet(ws.run / "items.parquet").get_column("item_id").to_list()
    assert main(["recommend", str(ws.run), "--items", ",".join(map(str, every)), "-k", "3"]) == 0
    assert "no item left to recommend" in capsys.readouterr().err


def test_unknown_ids_keep_the_catalogues_type(ws, capsys):
    """Integer item ids: an unknown "999999" from the command line is 999999 in the JSON, as
    the known ids are integers; a name that is no integer stays a string."""
    from vaecf.cli import main

    assert main(["recommend", str(ws.run), "--items", "999999,nope", "-k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unknown"] == [999999, "nope"]
    assert all(isinstance(i["item_id"], int) for i in out["items"])
