"""The drills of the verbs that write one file from a run: `vaecf score` (a Parquet table) and
`vaecf export` (an ONNX model, checked with onnxruntime), with the states of their files.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

from .outputs import Broken
from .runners import prepare_synthetic, run_ok, timed
from .trials import ReplaceDrill, safe_state


class ScoreDrill(ReplaceDrill):
    """`vaecf score` of a history file into recs.parquet: even trials replace an older output
    (k 5), odd ones write where nothing was; after a kill the file is the old one, the complete
    new one, or absent where there was none, never a torn one; rerunning gives the result."""

    name = "score"

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        import polars as pl

        self.root = Path(root)
        data, df = prepare_synthetic(runner, self.root, 600, 150, 8, 50)
        self.history = self.root / "inputs" / "history.csv"
        df.filter(pl.col("user_id") < 400).write_csv(self.history)
        self.run_dir = self.root / "run"
        run_ok(runner, [
            "train", "--data", data, "--out", self.run_dir, "--epochs", 1, "--precision", "fp32",
            "--device", "cpu", "--quiet",
        ])  # fmt: skip
        self.out = Path(out_parent or self.root / "out") / "recs.parquet"
        self.ref_old, self.ref_new = (
            self.root / "ref" / "old.parquet",
            self.root / "ref" / "new.parquet",
        )
        for ref, k in ((self.ref_old, 5), (self.ref_new, 20)):
            t0 = time.perf_counter()
            run_ok(runner, self._argv(ref, k))
            self.duration = time.perf_counter() - t0
        self.state_old, self.state_new = _table_state(self.ref_old), _table_state(self.ref_new)

    def _argv(self, out: Path, k: int) -> list:
        return [
            "score", self.run_dir, "--input", self.history, "--user-col", "user_id",
            "--item-col", "item_id", "-k", k, "--out", out,
        ]  # fmt: skip

    def reset(self, trial: int) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for p in self.out.parent.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if trial % 2 == 0:
            shutil.copyfile(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.out, 20)

    def state(self):
        return _table_state(self.out)


class ScoreTableDrill(ScoreDrill):
    """`vaecf score --out recs/` (a directory of parts), killed and then run again: after a
    kill the directory holds nothing, or parts each equal to the uninterrupted run's (never a
    torn or foreign one under a part's name), with `_SUCCESS` only once all are there; the same
    command then completes it to the uninterrupted table."""

    name = "score-table"

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        super().setup(root, runner, out_parent)
        self.out = Path(out_parent or self.root / "out") / "recs"
        self.ref_table = self.root / "ref" / "table"
        run_ok(runner, self._table_argv(self.ref_table))
        self.state_new = _parts_state(self.ref_table)

    def _table_argv(self, out: Path) -> list:
        return [*self._argv(out, 20), "--chunk-rows", 400, "--batch-users", 16]

    def reset(self, trial: int) -> None:
        if self.out.exists():
            shutil.rmtree(self.out)

    def command(self, trial: int) -> list:
        return self._table_argv(self.out)

    def state(self):
        return _parts_state(self.out)

    def old(self, trial: int):
        return None

    def allowed_after_kill(self, trial: int):
        def allowed(st) -> bool:
            if st is None or st == self.state_new:
                return True
            done, parts = st
            return not done and parts <= self.state_new[1]  # some of the final parts

        return allowed


def _parts_state(out: Path):
    """(_SUCCESS written, the set of (part, digest of its rows)); None where there is no
    directory; Broken for a part that does not read."""
    if not out.exists():
        return None
    parts = frozenset((p.name, _table_state(p)) for p in out.glob("part-*.parquet"))
    return (out / "_SUCCESS").is_file(), parts


def _table_state(path: Path):
    """A digest of a Parquet table's rows; None if absent; Broken if it does not read."""
    import polars as pl

    if not path.exists():
        return None
    try:
        df = pl.read_parquet(path)
    except Exception as e:  # a torn file under the final name
        raise Broken(f"{path}: {type(e).__name__}: {e}") from None
    return hashlib.sha256(df.write_csv().encode()).hexdigest()


class ExportDrill(ReplaceDrill):
    """`vaecf export RUN --format onnx --out model.onnx` (checked with onnxruntime): even trials
    replace an older export (of another run, so old and new differ), odd ones write where
    nothing was; after a kill the file is the old one, the complete new one, or absent where
    there was none, never a torn one; rerunning gives the result. States compare the file's
    bytes (sha256): export is deterministic for a given run, which setup checks (two exports,
    the same bytes), and a file only counts once it parses, passes onnx.checker and onnxruntime
    runs it (`onnx_state`). A kill leaves its temp file (`.model.onnx.*.tmp`) beside the output,
    as score's leaves its own: the rerun writes under a fresh name and does not sweep them."""

    name = "export"

    def __init__(self, n_items: int = 2000, hidden: int = 200, latent: int = 32):
        self.n_items, self.hidden, self.latent = n_items, hidden, latent

    def setup(self, root: Path, runner, out_parent: Path | None = None) -> None:
        from vaecf.serve.fixtures import fresh_run

        self.root = Path(root)
        cfg = {"hidden_dims": [self.hidden], "latent_dim": self.latent}
        # two runs of the same shape (different weights): the old export is the other run's
        self.run_old, self.run_new = (
            fresh_run(self.root / "runs" / name, self.n_items, "multvae", cfg, seed=seed)
            for name, seed in (("old", 1), ("new", 2))
        )
        self.out = Path(out_parent or self.root / "out") / "model.onnx"
        ref = self.root / "ref"
        self.ref_old, self.ref_new = ref / "old.onnx", ref / "new.onnx"
        for run_dir, dest in ((self.run_old, self.ref_old), (self.run_new, self.ref_new)):
            run_ok(runner, self._argv(run_dir, dest))
        self.duration = timed(runner, self._argv(self.run_new, self.out), self.out)
        again = ref / "again.onnx"  # bytes compare only if exporting is deterministic
        run_ok(runner, self._argv(self.run_new, again))
        if again.read_bytes() != self.ref_new.read_bytes():
            raise RuntimeError("two exports of one run differ: compare outputs, not bytes")
        self.state_old, self.state_new = onnx_state(self.ref_old), onnx_state(self.ref_new)
        if self.state_old == self.state_new:
            raise RuntimeError("the old and new exports are the same file")

    def _argv(self, run_dir: Path, out: Path) -> list:
        return ["export", run_dir, "--format", "onnx", "--out", out]

    def reset(self, trial: int) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for p in self.out.parent.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if trial % 2 == 0:
            shutil.copyfile(self.ref_old, self.out)

    def command(self, trial: int) -> list:
        return self._argv(self.run_new, self.out)

    def state(self):
        return onnx_state(self.out)

    def diagnose(self) -> str:
        st = safe_state(self)
        return f"{self.out}: {st[1] or st[0]} (new: {self.state_new}, old: {self.state_old})"


def onnx_state(path: Path):
    """(the run it exports, sha256 of the file) of an ONNX export; None if absent; Broken if it
    does not load, fails onnx.checker, lacks export's metadata (added in a second write), or
    onnxruntime cannot run it on a fixed input (finite scores of shape (2, n_items))."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    if not path.exists():
        return None
    data = path.read_bytes()
    try:
        m = onnx.load_from_string(data)
        onnx.checker.check_model(m)
        meta = {p.key: p.value for p in m.metadata_props}
        if "n_items" not in meta or "vaecf_run" not in meta:
            raise ValueError(f"no vaecf metadata (a graph caught before it was added): {meta}")
        n = int(meta["n_items"])
        x = np.zeros((2, n), np.float32)
        x[0, :3] = 1.0
        x[1, n // 2 :: 7] = 1.0
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        (y,) = sess.run(["scores"], {"history": x})
        if y.shape != (2, n) or not np.isfinite(y).all():
            raise ValueError(f"scores of shape {y.shape}, finite: {np.isfinite(y).all()}")
    except Exception as e:  # noqa: BLE001 - a torn file under the final name
        raise Broken(f"{path}: {type(e).__name__}: {e}") from None
    return meta["vaecf_run"], hashlib.sha256(data).hexdigest()
