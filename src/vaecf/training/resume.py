"""Stopping a gradient run and resuming it bit for bit (gradient's `GradientFit`): a stop asked
by a signal (after the epoch, with a checkpoint); last.pt, everything a resume needs (the model,
its optimizers and gradient scaler, the counters, the best so far, the history, the random
generators), written, read and restored; metrics.jsonl kept to the state trained from.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vaecf import distributed, rundir
from vaecf.errors import RunError
from vaecf.storage import checkpoint
from vaecf.storage.safewrite import atomic_file
from vaecf.training.background import CheckpointWriter, snapshot


class StopRequests:
    """SIGINT/SIGTERM during training: the first asks to stop after the current epoch (with a
    checkpoint); a second SIGINT interrupts at once. Only in the main thread of a single
    process (data-parallel ranks keep the default handlers)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        tqdm.write(
            f"{signal.Signals(signum).name}: stopping after this epoch with a checkpoint "
            "(Ctrl-C again to stop at once)"
        )

    def __enter__(self):
        if self.enabled:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _rng_state(gen: torch.Generator) -> dict:
    state = {"torch": torch.get_rng_state(), "shuffle": gen.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    gen.set_state(state["shuffle"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def last_state(run) -> dict:
    """What last.pt holds, from `run` (a gradient.GradientFit: its model, optimizers `opts`,
    gradient `scaler`, shuffling generator `gen`, counters, best and history), in live tensors
    (`save_last` snapshots them)."""
    return {
        "model": run.model.state_dict(),
        "optimizer": {k: o.state_dict() for k, o in run.opts.items()},
        "scaler": run.scaler.state_dict(),
        "epoch": run.epoch,
        "step": run.step,
        "best": run.best,
        "history": run.history,
        "rng": _rng_state(run.gen),
    }


def save_last(
    writer: CheckpointWriter,
    out: Path,
    state: dict,
    best_state: dict | None,
    metrics_file,
    background: bool,
) -> None:
    """Queue last.pt (`state`, snapshotted where `background`) for the background writer, after
    making the metrics lines it covers durable, and before it best.pt (`best_state`) if the best
    model changed since the last checkpoint. best.pt is written only here, so it always holds
    the best model that last.pt records: a kill loses a newer best together with the epochs
    that found it, and the resumed run finds it again."""
    writer.flush()  # the last save's copies are written and freed before new ones
    if best_state is not None:
        writer.submit(out / rundir.BEST, best_state)
    metrics_file.flush()
    os.fsync(metrics_file.fileno())
    if background:
        writer.submit(out / rundir.LAST, snapshot(state))
    else:  # no memory for a copy: written from the live tensors while training waits
        writer.write_now(out / rundir.LAST, state)


def open_metrics(path: Path, history: list):
    """metrics.jsonl, holding exactly the epochs of the state trained from (after a kill it may
    run ahead of last.pt: those lines are dropped), opened to be appended to."""
    lines = path.read_text().splitlines() if path.is_file() else []
    if lines != [json.dumps(row) for row in history]:  # ahead, or a torn line
        with atomic_file(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in history)
    return open(path, "a")  # noqa: SIM115 (the caller closes it)


def read_last(out: Path, ctx: distributed.DistContext) -> dict | None:
    """last.pt's state if the run has one; under torchrun rank 0's, sent to every rank (a
    node other than rank 0's needs only its copy of the prepared data, not the run
    directory). A finished run whose last.pt was removed is refused: starting over would
    overwrite its model."""
    ck, error = None, None
    if ctx.is_main:
        if (out / rundir.LAST).is_file():
            try:
                ck = checkpoint.load(out / rundir.LAST, map_location="cpu")
            except RunError as e:
                error = str(e)
        elif (out / rundir.BEST).is_file() and (out / rundir.RESULTS).is_file():
            # (a best.pt without last.pt or results.json is one whose last.pt write was cut
            # short, by a kill or a full disk: training from the start finds it again)
            error = (
                f"{out} has a {rundir.BEST} but no {rundir.LAST} to continue from "
                "(vaecf tune keeps only best.pt of finished and pruned trials); train a new "
                f"run with its settings: vaecf train --config "
                f"{out / rundir.CONFIG_TOML} --out NEW"
            )
    ck, error = ctx.from_main((ck, error))
    if error:
        raise RunError(error)
    return ck


def restore(ck: dict, run) -> None:
    """Load last.pt's `ck` into `run`: what `last_state` took from it."""
    run.model.load_state_dict(ck["model"])
    opt_state = ck["optimizer"]
    if "state" in opt_state:  # vaecf 0.1: one optimizer
        opt_state = {"all": opt_state}
    for k, o in run.opts.items():
        o.load_state_dict(opt_state[k])
        for g in o.param_groups:  # as saved by a run with CUDA graphs, which set it
            g["capturable"] = False
    run.scaler.load_state_dict(ck["scaler"])
    run.epoch, run.step = ck["epoch"], ck["step"]
    run.best, run.history = ck["best"], ck["history"]
    _set_rng_state(ck["rng"], run.gen)
