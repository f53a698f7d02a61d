"""`--precision auto`: the serving copy that answers fastest on this machine, among those whose
rankings agree with fp32's; measured once, then read from a cache.

Which copy answers fastest is a property of the machine, not of the model: at batch 1 an
ML-20M-sized Mult-VAE answers in 0.62 ms in int8 against 2.33 in fp32 on a 2-core Zen 4 (VNNI),
while on the Intel AMX machine int8 and fp32 take about the same, and bf16 is fastest at batch
104 (benchmarks/README.md). So `auto_copy`:

1. lists the copies the device serves in (`candidates`): on a CPU fp32 and int8, and bf16 or
   fp16 where the CPU computes it natively (emulated, they are several times slower than fp32:
   recorded as not timed); on a GPU fp32, tf32, bf16, fp16 and int8;
2. builds each from the fp32 weights and scores a sample of histories (drawn from the training
   popularity, `sample_histories`) at each served batch size, timing every call: one history
   at a time for batch 1 (SINGLES of them), one batch of the first `size` histories for a
   larger size (cut to TIMED_SCORES scores, so that a large catalogue is timed in a fraction of
   a second; the time per history is the same beyond), for at least MIN_REPS calls and CELL_S
   seconds after a warm-up call; a time is the fastest call's, the copy's own speed rather than
   what else the machine ran meanwhile (on a shared machine others' work slows some calls
   tenfold);
3. refuses a copy whose top 10 (the history excluded) holds on average less than MIN_AGREEMENT
   of fp32's top 10 (the tolerance the serving tests hold every copy to), or whose scores are
   not finite where fp32's are, and one the model cannot have (int8 without an item layer);
4. keeps the copies `serving_pick.pick` picks from the timings: the fastest at the largest
   batch, and beside it the fastest at batch 1 where that one is at least 10% (and 0.05 ms)
   faster there, for the small batches it wins; a reduced copy displaces fp32 only when at
   least 10% faster.

The outcome is cached in $VAECF_HOME/serving (~/.cache/vaecf/serving), one JSON file per key:
the weights' SHA-256, the model and its size, the device (the CPU's model and flags, or the
GPU's name), torch's threads, torch's and vaecf's versions, the batch sizes, the candidates and
the tolerance. A later load with the same key builds the cached choice without timing
anything; a file that does not read back as a choice for its key is ignored and written again.
Measuring holds a second copy of the model; where that does not fit in free memory, fp32 is
served untimed (and not cached). Two serving copies hold no more than measuring did.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from vaecf import precision as prec
from vaecf import runtime
from vaecf.data.datasets import home
from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError, WriteError
from vaecf.memory import available_bytes, gib
from vaecf.models.base import Model, ScoreFn
from vaecf.models.serving import serving_copy
from vaecf.models.serving_pick import (
    AGREEMENT_K,
    MIN_AGREEMENT,
    Candidate,
    PrecisionChoice,
    pick,
)
from vaecf.storage.safewrite import write_json
from vaecf.version import __version__

DEFAULT_BATCH_SIZES = (1, 256)  # a server's: one request, and a full micro-batch
TIMED_SCORES = 1 << 21  # a timed batch holds at most this many scores (rows x items)
SINGLES = 16  # histories scored (and timed) one at a time, for batch 1
MIN_REPS = 3  # calls timed per copy and size, at least ...
CELL_S = 0.03  # ... and until this many seconds have passed,
MAX_REPS = 200  # ... but no more calls than this
CACHE_FORMAT = 2  # 2: a choice may keep a second copy for small batches


def candidates(model: Model) -> dict[str, str | None]:
    """{precision: None to try it, or why it is not tried} for `model`'s device."""
    device = model.device
    if device.type != "cpu":
        return dict.fromkeys(("fp32", "tf32", "bf16", "fp16", "int8"))
    flags = prec.cpu_flags()
    emulated = "not timed: this CPU has no {} arithmetic (emulated, several times slower)"
    return {
        "fp32": None,
        "bf16": None if prec.native_bf16(device) else emulated.format("native bf16"),
        "fp16": None if {"avx512_fp16", "amx_fp16"} & flags else emulated.format("native fp16"),
        "int8": None,
    }


def timed_sizes(batch_sizes, n_items: int) -> list[int]:
    """The served batch sizes as timed: each cut to TIMED_SCORES scores, duplicates dropped."""
    cap = max(1, TIMED_SCORES // max(n_items, 1))
    return sorted({max(1, min(int(b), cap)) for b in batch_sizes} or {1})


def sample_histories(n_items: int, n: int, popularity=None, seed: int = 0) -> list[list[int]]:
    """`n` histories of 1 to 50 items (sorted, distinct; fewer where the catalogue is small),
    their items drawn by training popularity (uniformly without counts), their lengths
    log-uniformly: what real histories look like, short ones the most often."""
    rng = np.random.default_rng(seed)
    p = None
    if popularity is not None and len(popularity) == n_items:
        w = np.asarray(popularity, dtype=np.float64) + 1.0  # every item may be drawn
        p = w / w.sum()
    longest = max(1, min(50, n_items - 1))
    lengths = np.exp(rng.uniform(0, np.log(longest + 1), n)).astype(int).clip(1, longest)
    return [sorted(rng.choice(n_items, size=int(m), replace=False, p=p).tolist()) for m in lengths]


def weights_digest(model: Model) -> str:
    """SHA-256 of the model's tensors (names, shapes, dtypes and bytes)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def cache_key(model: Model, sizes: list[int], tried: dict, min_agreement: float) -> dict:
    """What the timings and the agreement depend on."""
    device = model.device
    if device.type == "cuda":
        where = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        info = runtime.cpuinfo()
        flags = hashlib.sha256(" ".join(sorted(prec.cpu_flags())).encode()).hexdigest()[:16]
        where = f"cpu: {info.get('model name', 'unknown')} (flags {flags})"
    return {
        "format": CACHE_FORMAT,
        "weights": weights_digest(model),
        "model": f"{type(model).__name__} ({model.n_items} items)",
        "device": where,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "vaecf": __version__,
        "batch_sizes": sizes,
        "candidates": dict(tried),
        "min_agreement": min_agreement,
    }


def cache_path(key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return home() / "serving" / f"precision-{name}.json"


def read_cache(path: Path, key: dict) -> PrecisionChoice | None:
    """The choice cached at `path` for `key`, or None (none there, another key's, unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            got = json.load(f)
        if got["key"] != key:
            return None
        return PrecisionChoice.from_dict(got["choice"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def top_sets(scores: torch.Tensor, histories: list[list[int]]) -> list[tuple[set, bool]]:
    """(each row's top-k items among those not in its history, whether the row is finite)."""
    s = scores.detach().float().cpu()
    finite = torch.isfinite(s).all(dim=1).tolist()
    for r, h in enumerate(histories):
        s[r, h] = -torch.inf
    top = s.topk(min(AGREEMENT_K, s.shape[1]), dim=1)
    keep = torch.isfinite(top.values)  # a row with nothing finite: an empty set
    return [(set(i[k].tolist()), f) for i, k, f in zip(top.indices, keep, finite)]


def time_calls(fn: ScoreFn, batches: list, device) -> tuple[float, list[torch.Tensor]]:
    """(ms of the fastest call of `fn`, each batch's scores): a warm-up call, then every batch in
    turn for at least MIN_REPS calls and CELL_S seconds (MAX_REPS calls at most)."""
    fn(batches[0])
    prec.synchronize(device)
    times, outs = [], []
    start = time.perf_counter()
    i = 0
    while i < max(MIN_REPS, len(batches)) or (
        time.perf_counter() - start < CELL_S and i < MAX_REPS
    ):
        t0 = time.perf_counter()
        out = fn(batches[i % len(batches)])
        prec.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
        if i < len(batches):
            outs.append(out)
        i += 1
    return min(times), outs


@torch.no_grad()
def measure(model: Model, precision: str, sizes: list[int], histories) -> tuple[list, list]:
    """([ms per call at each size], [(top set, finite) of every history scored]) of a
    copy of `model` in `precision`."""
    fn, device = serving_copy(copy.deepcopy(model), precision)[1], model.device
    ms, tops = [], []
    for size in sizes:
        groups = [[h] for h in histories[:SINGLES]] if size == 1 else [histories[:size]]
        t, outs = time_calls(fn, [SparseBatch.of_rows(g, device) for g in groups], device)
        ms.append(round(t, 4))
        for g, out in zip(groups, outs):
            tops += top_sets(out, g)
    return ms, tops


def agreement(ref: list, got: list) -> tuple[float, bool]:
    """(mean share of each reference top set held by the copy's, whether the copy's scores are
    finite wherever the reference's are)."""
    shares = [len(a & b) / len(a) for (a, _), (b, _) in zip(ref, got) if a]
    finite = all(f or not rf for (_, rf), (_, f) in zip(ref, got))
    return (float(np.mean(shares)) if shares else 1.0), finite


def try_candidate(model, precision, sizes, histories, ref, min_agreement) -> tuple[Candidate, list]:
    """The Candidate of one copy (timed, checked against `ref`; None: it is the reference),
    and its top sets."""
    try:
        ms, tops = measure(model, precision, sizes, histories)
    except (ConfigError, RuntimeError, NotImplementedError) as e:
        return Candidate(precision, refused=f"cannot be built: {str(e)[:160]}"), []
    agree, finite = agreement(ref if ref is not None else tops, tops)
    c = Candidate(precision, ms, round(agree, 4))
    if ref is None:  # fp32, the reference
        return c, tops
    if not finite:
        c.refused = "non-finite scores where fp32's are finite (overflow)"
    elif agree < min_agreement:
        c.refused = f"top-{AGREEMENT_K} agreement {agree:.3f} < {min_agreement:g}"
    return c, tops


def room_for_copies(model: Model) -> str | None:
    """Why a second copy of the model (what measuring holds, and building a second serving
    copy) does not fit, or None if it does."""
    need = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    free = available_bytes(model.device)
    if 2 * need > free:
        return (
            f"a second copy of the model ({gib(need)}) does not fit with room to spare in the "
            f"free memory ({gib(free)})"
        )
    return None


def busy_note() -> list[str]:
    """A note when the machine is busier than its cores (1-minute load average): timings then
    say as much about the other work as about the copies."""
    load, cores = (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0), os.cpu_count() or 1
    if load <= cores:
        return []
    return [f"the machine was busy while timing (load {load:.1f} on {cores} cores): to time "
            "again when it is quiet, delete the cache file"]  # fmt: skip


def choose(model, sizes, popularity, tried: dict, min_agreement: float) -> PrecisionChoice:
    """Time and check every candidate of `tried` ({precision: None or why not})."""
    start = time.perf_counter()
    histories = sample_histories(model.n_items, max(max(sizes), SINGLES), popularity)
    cands, ref = [], None
    for p in ["fp32", *(p for p in tried if p != "fp32")]:
        if tried.get(p) is not None:
            cands.append(Candidate(p, refused=tried[p]))
            continue
        c, tops = try_candidate(model, p, sizes, histories, ref, min_agreement)
        if p == "fp32":
            ref = tops
        cands.append(c)
    seconds = time.perf_counter() - start
    notes = busy_note()
    chosen, small, rows = pick(cands, sizes)
    return PrecisionChoice(
        chosen, sizes, cands, "measured", seconds, None, min_agreement, notes, small, rows
    )


def auto_copy(
    model: Model,
    batch_sizes=DEFAULT_BATCH_SIZES,
    popularity=None,
    precisions: list[str] | None = None,
    min_agreement: float = MIN_AGREEMENT,
    cache: bool = True,
) -> tuple[Model, ScoreFn, PrecisionChoice]:
    """`model` served in the copy `--precision auto` chooses (see the module's docstring; the
    model is converted in place, as `serving_copy` does), its score function and the choice.
    `precisions`: the candidates (default: `candidates(model)`); `popularity`: the training
    counts the sample of histories is drawn by; `cache`: read and write the cache."""
    model.eval()
    tried = candidates(model)
    if precisions is not None:
        tried = {p: tried.get(p) for p in precisions}
    sizes = timed_sizes(batch_sizes, model.n_items)
    start = time.perf_counter()
    key = cache_key(model, sizes, tried, min_agreement) if cache else None
    path = cache_path(key) if key else None
    choice = read_cache(path, key) if path else None
    if choice is not None:
        choice.source, choice.cache = "cache", str(path)
        choice.seconds = time.perf_counter() - start
    elif (why := room_for_copies(model)) is not None:
        choice = PrecisionChoice("fp32", sizes, [], notes=[f"not measured: {why}; serving fp32"])
    else:
        choice = choose(model, sizes, popularity, tried, min_agreement)
        choice.seconds = time.perf_counter() - start
        if path is not None:
            try:
                write_json(path, {"key": key, "choice": choice.to_dict()})
                choice.cache = str(path)
            except (OSError, WriteError) as e:  # a read-only home: choose again next time
                why = getattr(e, "strerror", None) or type(e).__name__
                choice.notes.append(f"the choice was not cached: {why}")
    return (*served_copies(model, choice), choice)


def served_copies(model: Model, choice: PrecisionChoice) -> tuple[Model, ScoreFn]:
    """`model` in `choice.chosen` and the score function of the copies chosen (with
    `choice.small` for small batches only where a second copy fits now: a choice read from the
    cache was measured with other free memory; else a note says so, and the choice drops it)."""
    small = None
    if choice.small is not None and (why := room_for_copies(model)) is not None:
        choice.notes.append(f"{choice.small} not kept for small batches: {why}")
        choice.small, choice.small_rows = None, 0
    elif choice.small is not None:
        small = serving_copy(copy.deepcopy(model), choice.small)[1]
    served, fn = serving_copy(model, choice.chosen)
    return served, ByRows(small, fn, choice.small_rows) if small else fn


class ByRows:
    """A score function calling `small` for batches of at most `rows` histories, else `large`.
    What must come from one copy throughout (an explanation's leave-one-out rows, compared with
    their history's own row, in chunks of any size) takes `large` alone."""

    def __init__(self, small: ScoreFn, large: ScoreFn, rows: int):
        self.small, self.large, self.rows = small, large, rows

    def __call__(self, batch: SparseBatch) -> torch.Tensor:
        return (self.small if batch.batch_size <= self.rows else self.large)(batch)


def one_copy(fn: ScoreFn) -> ScoreFn:
    """`fn`, or the one copy that scores a ByRows' large batches."""
    return fn.large if isinstance(fn, ByRows) else fn


def copy_to_serve(
    model: Model, precision: str, batch_sizes=DEFAULT_BATCH_SIZES, popularity=None
) -> tuple[Model, ScoreFn, PrecisionChoice | None]:
    """`model` served in `precision`, its score function, and with "auto" the choice (else
    None): `auto_copy` for "auto", `serving_copy` for any other."""
    if precision == "auto":
        return auto_copy(model, batch_sizes, popularity)
    return (*serving_copy(model, precision), None)
