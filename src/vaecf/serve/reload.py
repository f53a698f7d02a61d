"""The model that answers: loaded from a run directory, checked, and swapped atomically.

`ModelHolder.current` is one `LoadedModel` (a Recommender and the version that names it). A
request takes `current` once, when it arrives, and is scored by that model whatever happens
next; a reload builds the new model beside the old one, checks it, and only then replaces the
reference, so requests in flight finish on the model they started with and a model that fails
to load or check leaves the old one serving. A run's files must be regular files (a FIFO would
block the read forever), and a reload given a deadline reads on a daemon thread that it leaves
behind when the deadline passes: the old model keeps serving, what that thread loads later is
never swapped in, and the process can still exit.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vaecf import rundir
from vaecf.errors import RunError
from vaecf.models.serving_choice import DEFAULT_BATCH_SIZES
from vaecf.recommender import Recommender


class RunForbidden(RunError):
    """A run directory outside the one reloads may come from."""


class RunNotFound(RunError):
    """A run directory that does not exist."""


class ReloadTimeout(RunError):
    """A reload that did not finish within its deadline (or one that passed it still runs)."""


@dataclass
class LoadedModel:
    recommender: Recommender
    version: dict[str, Any] = field(default_factory=dict)  # the response's `model` field


def _version(run_dir: Path, rec: Recommender) -> dict[str, Any]:
    ck = run_dir / rundir.BEST
    stat = ck.stat()
    mtime = dt.datetime.fromtimestamp(stat.st_mtime, dt.UTC)
    # read once, by Recommender.load; None for a closed form (fitted once, no epochs)
    best_epoch = rundir.card(rec.info or {}, rec.results)["best_epoch"]
    ident = f"{run_dir.resolve()}|{stat.st_mtime_ns}|{stat.st_size}"
    return {
        "id": hashlib.sha256(ident.encode()).hexdigest()[:12],
        "run": str(run_dir.resolve()),
        "name": rec.info.get("model", {}).get("name"),
        "n_items": len(rec.items),
        "checkpoint": rundir.BEST,
        "checkpoint_mtime": mtime.isoformat(timespec="seconds"),
        "best_epoch": best_epoch,
        "loaded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def load_checked(
    run_dir: str | os.PathLike,
    device: str = "cpu",
    precision: str = "fp32",
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
):
    """A LoadedModel of the run's best model, after a check that it scores: one history of its
    first item must give finite scores for every item. RunError if it does not load or check.
    precision "auto" chooses for this run (or reads its choice from the cache) at
    `batch_sizes`: a reload chooses again."""
    run_dir = Path(run_dir)
    for name in rundir.RUN_FILES:
        path = run_dir / name
        if path.exists() and not path.is_file():  # links followed: what is read
            raise RunError(
                f"{run_dir}: {name} is not a regular file (a FIFO, a device or a directory); "
                "a run directory holds regular files only"
            )
    rec = Recommender.load(run_dir, device, precision=precision, batch_sizes=batch_sizes)
    scores, _ = rec.scores([[0]])
    if scores.shape != (1, len(rec.items)) or not bool(scores.isfinite().all()):
        raise RunError(
            f"the model in {run_dir} gives non-finite scores for a one-item history; it is "
            "not served: check its training run (metrics.jsonl) or serve another run"
        )
    return LoadedModel(rec, _version(run_dir, rec))


@dataclass(eq=False)
class PendingReload:
    """A reload under way on its own thread: `finished` is set when it ends, with `model`
    (swapped in) or `error`; `abandoned` once its caller stopped waiting."""

    target: Path
    thread: threading.Thread | None = None
    finished: futures.Future = field(default_factory=futures.Future)
    model: LoadedModel | None = None
    error: BaseException | None = None
    abandoned: bool = False


class ModelHolder:
    """The current model; `reload` replaces it only with one that loaded and checked, from a
    run directory under `root` (default: the directory holding the first run, so that a
    client can swap in a sibling run but not make the server read anywhere it may)."""

    def __init__(
        self,
        current: LoadedModel,
        device: str = "cpu",
        precision: str = "fp32",
        root: str | os.PathLike | None = None,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    ):
        self.current = current
        self.device = device
        self.precision = precision  # as asked: "auto" chooses again for each run loaded
        self.batch_sizes = tuple(batch_sizes)
        self.root = Path(root or Path(current.version["run"]).parent).resolve()
        self._lock = threading.Lock()  # the swap, and the state of reloads
        self._one = threading.Lock()  # one load at a time
        self._late: PendingReload | None = None  # the last reload that passed its deadline

    @classmethod
    def load(
        cls,
        run_dir: str | os.PathLike,
        device: str = "cpu",
        precision: str = "fp32",
        root: str | os.PathLike | None = None,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    ):
        # on a thread that ends with the load, as a reload's does: once the main thread runs an
        # OpenMP region, libgomp keeps its helper thread for good, the process then has more
        # OpenMP threads than cores, and libgomp stops spinning: the scoring thread's helper
        # slept between calls and each answer waited for its wake-up (+0.15-0.3 ms at batch 1;
        # benchmarks/README.md, "What serving adds at concurrency 1"). A daemon's, joined: a
        # Ctrl-C during the load stops the server at once.
        out: futures.Future = futures.Future()

        def load() -> None:
            try:
                out.set_result(load_checked(run_dir, device, precision, batch_sizes))
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
                out.set_exception(e)

        thread = threading.Thread(target=load, name="vaecf-load", daemon=True)
        thread.start()
        thread.join()
        return cls(out.result(), device, precision, root, batch_sizes)

    def reload(
        self, run_dir: str | os.PathLike | None = None, timeout_s: float | None = None
    ) -> LoadedModel:
        """Load `run_dir` (default: the current run again), check it, swap it in; returns it.
        Raises RunError (and keeps the old model) when it fails, or when `run_dir` is given and
        lies outside `root`; ReloadTimeout when `timeout_s` passes first."""
        pending = self.start_reload(run_dir)
        futures.wait([pending.finished], timeout_s)
        return self.finish(pending, timeout_s)

    def start_reload(self, run_dir: str | os.PathLike | None = None) -> PendingReload:
        """The reload of `run_dir` (`reload`'s rules), started on a daemon thread; `finish`
        gives its outcome. ReloadTimeout while an earlier one that passed its deadline runs."""
        with self._lock:
            late = self._late
            if late is not None and late.thread.is_alive():
                raise ReloadTimeout(
                    f"an earlier reload (of {late.target}) passed its deadline and is still "
                    "reading its files; retry once it ends"
                )
            pending = PendingReload(self._target(run_dir))
            pending.thread = threading.Thread(
                target=self._load, args=(pending,), name="vaecf-reload", daemon=True
            )
            pending.thread.start()
            return pending

    def finish(self, pending: PendingReload, timeout_s: float | None = None) -> LoadedModel:
        """The model `pending` swapped in, or its error; if it has not finished, it is
        abandoned (ReloadTimeout): the old model stays, and what it loads is dropped."""
        with self._lock:
            if pending.model is None and pending.error is None:
                pending.abandoned = True
                self._late = pending
                within = "" if timeout_s is None else f" within {timeout_s:g} s"
                raise ReloadTimeout(
                    f"the reload of {pending.target} did not finish{within} (reload_timeout_s); "
                    "still serving the previous model"
                )
        if pending.error is not None:
            raise pending.error
        return pending.model

    def _target(self, run_dir) -> Path:
        given = run_dir if run_dir else self.current.version["run"]
        target = Path(given).resolve()  # what is checked is what is loaded
        if run_dir and not target.is_relative_to(self.root):
            raise RunForbidden(
                f"{given} is outside the directory runs may be reloaded from "
                f"({self.root}); restart the server with --reload-root to allow another"
            )
        if not target.is_dir():
            raise RunNotFound(f"{given} is not a directory; give a run directory")
        if run_dir:
            self._check_files(target, given)
        return target

    def _load(self, pending: PendingReload) -> None:
        """On the reload's thread: load and check, then swap in unless abandoned."""
        try:
            with self._one:
                new = load_checked(pending.target, self.device, self.precision, self.batch_sizes)
            with self._lock:
                if not pending.abandoned:
                    self.current = new  # one reference assignment: atomic for readers
                    pending.model = new
        except BaseException as e:  # noqa: BLE001 - the caller's to raise
            pending.error = e
        finally:
            pending.finished.set_result(None)

    def _check_files(self, target: Path, given) -> None:
        """Every file the load reads lies inside `root` once links are followed (a link in an
        allowed run directory must not make the server read elsewhere)."""
        for name in rundir.RUN_FILES:
            path = target / name
            if path.is_symlink() or path.exists():
                if not path.resolve().is_relative_to(self.root):
                    raise RunForbidden(
                        f"{given}: {name} links outside the directory runs may be reloaded "
                        f"from ({self.root}); copy the file in instead"
                    )
