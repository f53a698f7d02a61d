"""What `--precision auto` makes of its timings: each copy tried (`Candidate`), the rule that
picks the copies to serve (`pick`) and the outcome (`PrecisionChoice`).

The rule: the fastest usable copy at the largest timed batch serves; where another copy answers
one history in at most MARGIN of its time (and MIN_GAIN_MS less: an EASE answers one in ~0.01 ms
in any copy, not worth a second copy of its n x n weights), that copy is kept beside it and
scores every batch of up to `small_rows` histories, the sizes at which it stays the faster of
the two (times interpolated linearly between the timed sizes). On the Intel AMX machine, for
one: bf16 scores a micro-batch of 256 in a third of fp32's time, fp32 one history in two thirds
of bf16's. A reduced copy displaces fp32 only when it takes at most MARGIN of fp32's time: a
short timing is noisy, and fp32 gives the scores the run was evaluated with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

AGREEMENT_K = 10  # rankings are compared on their top 10, the history excluded
MIN_AGREEMENT = 0.9  # the mean share of fp32's top 10 a serving copy must keep
MARGIN = 0.9  # a copy displaces another (or joins it) only at most this share of its time
MIN_GAIN_MS = 0.05  # ... and a second copy only when it saves this much on one history


@dataclass
class Candidate:
    """One copy tried: its ms per call at each timed batch size (the fastest call) and its top-10
    agreement with fp32, or why it was not used (`refused`)."""

    precision: str
    batch_ms: list[float] | None = None
    agreement: float | None = None
    refused: str | None = None


@dataclass
class PrecisionChoice:
    """What `auto_copy` chose, from what: `chosen` serves, but batches of at most `small_rows`
    histories go to `small` where that is set; `source` "measured" (timed by this load, taking
    `seconds`) or "cache" (read from `cache`, the file; `seconds` is the reading's)."""

    chosen: str
    batch_sizes: list[int]
    candidates: list[Candidate]
    source: str = "measured"
    seconds: float = 0.0
    cache: str | None = None
    min_agreement: float = MIN_AGREEMENT
    notes: list[str] = field(default_factory=list)
    small: str | None = None
    small_rows: int = 0

    def to_dict(self) -> dict:  # what /v1/model and `vaecf score --json` give
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PrecisionChoice:
        """A choice read back (ValueError, KeyError or TypeError for one that is not one)."""
        cands = [Candidate(**c) for c in d["candidates"]]
        got = cls(**{**d, "candidates": cands})
        ok = {c.precision: c for c in cands if c.refused is None and c.batch_ms}
        for p in (got.chosen, got.small or got.chosen):
            if p not in ok or len(ok[p].batch_ms) != len(got.batch_sizes):
                raise ValueError(f"{p!r} is not a timed candidate")
        if got.small is not None and not 1 <= got.small_rows < max(got.batch_sizes):
            raise ValueError(f"{got.small_rows} rows for {got.small!r}")
        return got

    def label(self) -> str:
        """The copies served, in words: "bf16", or "bf16, fp32 for batches of up to 8"."""
        if self.small is None:
            return self.chosen
        return f"{self.chosen}, {self.small} for batches of up to {self.small_rows}"

    def lines(self) -> list[str]:
        """What a person reads: the choice, then one line per candidate."""
        how = f"timings read from {self.cache}"
        if self.source == "measured":
            cached = f", cached in {self.cache}" if self.cache else ""
            how = f"measured in {self.seconds:.2f} s{cached}"
        sizes = ", ".join(map(str, self.batch_sizes))
        out = [f"precision auto: {self.label()} ({how}; ms per call at batch {sizes})"]
        marks = {self.chosen: "  <- chosen"}
        if self.small is not None:
            marks[self.small] = f"  <- chosen for batches of up to {self.small_rows}"
        for c in self.candidates:
            what = ""
            if c.batch_ms is not None:
                pairs = zip(self.batch_sizes, c.batch_ms)
                what = "  ".join(f"batch {b}: {ms:.3f} ms" for b, ms in pairs)
                what += f"  top-{AGREEMENT_K} agreement {c.agreement:.3f}"
            why = f"  refused: {c.refused}" if c.refused else ""
            out.append(f"  {c.precision:<5} {what}{why}{marks.get(c.precision, '')}".rstrip())
        return out + [f"  ({n})" for n in self.notes]


def fastest(usable: list[Candidate], i: int) -> Candidate:
    """The fastest of `usable` at the i-th timed size; a reduced copy only when at most MARGIN of
    fp32's time there."""
    best = min(usable, key=lambda c: c.batch_ms[i])
    fp32 = next((c for c in usable if c.precision == "fp32"), None)
    if fp32 is not None and best.batch_ms[i] > MARGIN * fp32.batch_ms[i]:
        return fp32
    return best


def faster_up_to(small: Candidate, large: Candidate, sizes: list[int]) -> int:
    """The most histories a batch may hold with `small` still the faster (its time interpolated
    linearly between the timed `sizes`), counting up from one."""
    rows = 1
    while rows + 1 < sizes[-1] and (
        np.interp(rows + 1, sizes, small.batch_ms) < np.interp(rows + 1, sizes, large.batch_ms)
    ):
        rows += 1
    return rows


def pick(cands: list[Candidate], sizes: list[int]) -> tuple[str, str | None, int]:
    """(the copy that serves, the copy for small batches or None, their most rows): see the
    module's docstring."""
    usable = [c for c in cands if c.refused is None and c.batch_ms]
    if not usable:
        return "fp32", None, 0
    large, small = fastest(usable, -1), fastest(usable, 0)
    gain = large.batch_ms[0] - small.batch_ms[0]
    if small is large or small.batch_ms[0] > MARGIN * large.batch_ms[0] or gain < MIN_GAIN_MS:
        return large.precision, None, 0
    return large.precision, small.precision, faster_up_to(small, large, sizes)
