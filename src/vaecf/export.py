"""ONNX export of a run's model, as a dense-input graph: (B, n_items) multi-hot -> (B, n_items).

The models' first layer is a sparse `embedding_bag` over a history's item indices; ONNX
runtimes have no fast equivalent, so the exported graph takes the history as a dense float32
multi-hot row per user (1.0 at the item's column, the column order of the run's items.parquet)
and computes the first layer as a dense product. Everything after it is the model's own layers.
Output `scores` are the model's raw scores (`Model.scores`): logits for Mult-VAE, Mult-DAE and
RecVAE (softmax gives probabilities; the ranking is the same), EASE's and popularity's as they
are. The history's own items are not masked: do it as the caller (set them to -inf). Batch size
is a dynamic axis. `check_onnx` compares onnxruntime's scores with PyTorch's.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vaecf import rundir
from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError
from vaecf.models.base import Model
from vaecf.storage.safewrite import current_umask, free_bytes, no_space_error

MAX_BYTES = 2_000_000_000  # protobuf's limit on one ONNX file


class DenseScores(nn.Module):
    """`model.scores` of multi-hot rows, through the model's own `dense_scores` (the sparse
    first layer as a dense product): a model exports by declaring that, not by a change here."""

    def __init__(self, model: Model):
        super().__init__()
        self.model = model.eval()
        with torch.no_grad():  # a model without dense_scores is refused here, before export
            self.model.dense_scores(torch.zeros(1, model.n_items))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.dense_scores(x)


def export_onnx(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    opset: int = 17,
    check: Callable[[Path, Model], None] | None = None,
) -> Path:
    """Write the run's best model to `out` as ONNX (input `history` (B, n_items) float32
    multi-hot, output `scores` (B, n_items)); returns `out`. The file is written beside `out`
    under a temporary name, synced, given to `check(path, model)` (which raises to refuse it)
    and only then renamed to `out`: a kill or a failed check leaves the previous `out`."""
    model, cfg = rundir.load_model(run_dir, "cpu")
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if size > MAX_BYTES:
        raise ConfigError(
            f"the model's weights take {size / 1e9:.1f} GB, more than one ONNX file holds "
            "(2 GB); export a smaller model"
        )
    wrapper = DenseScores(model)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    example = torch.zeros(2, model.n_items)
    example[:, :3] = 1.0
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                wrapper,
                (example,),
                str(tmp),
                input_names=["history"],
                output_names=["scores"],
                dynamic_axes={"history": {0: "batch"}, "scores": {0: "batch"}},
                opset_version=opset,
                dynamo=False,
            )
        _add_metadata(tmp, model, cfg, run_dir)
        os.chmod(tmp, 0o666 & ~current_umask())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if check is not None:
            check(tmp, model)
        os.replace(tmp, out)
    except Exception as e:  # ONNX's writers report a full disk without the file's name
        if (full := no_space_error(e, out, free_bytes(out.parent))) is not None:
            raise full from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _add_metadata(path: Path, model: Model, cfg: dict, run_dir) -> None:
    try:
        import onnx
    except ImportError:  # metadata is a nicety; the graph is complete without it
        return
    m = onnx.load(str(path))
    meta = {
        "vaecf_model": cfg["model"]["name"],
        "vaecf_run": Path(run_dir).resolve().name,  # its name: no path of this machine
        "n_items": str(model.n_items),
        "columns": "item order of the run's items.parquet",
        "scores": "logits (softmax for probabilities)" if model.multinomial else "raw scores",
    }
    for k, v in meta.items():
        entry = m.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(m, str(path))


def check_onnx(path: str | os.PathLike, model: Model, histories: list[list[int]]) -> dict:
    """onnxruntime's scores of `histories` (item indices) against `model.scores` of the same
    histories as a sparse batch (the path the server uses):
    {"max_abs_diff", "max_abs_score", "top100_equal"}. Needs onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError(
            "checking an ONNX export needs onnxruntime: pip install 'vaecf[export]'"
        ) from None
    rows = [sorted(set(h)) for h in histories]
    x = np.zeros((len(rows), model.n_items), np.float32)
    for r, h in enumerate(rows):
        x[r, h] = 1.0
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(["scores"], {"history": x})[0]
    batch = SparseBatch.of_rows(rows)  # the sparse path the model serves with
    with torch.no_grad():
        want = model.eval().scores(batch).float().numpy()
    k = min(100, model.n_items)
    top_got = np.argsort(-got, axis=1, kind="stable")[:, :k]
    top_want = np.argsort(-want, axis=1, kind="stable")[:, :k]
    return {
        "max_abs_diff": float(np.abs(got - want).max()),
        "max_abs_score": float(np.abs(want).max()),
        "top100_equal": bool((top_got == top_want).all()),
    }
