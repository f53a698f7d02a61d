"""The linear models' search over (lambda, p, beta): what one point of it costs and scores.

Unset lambda (and p) are chosen on validation. The default `fast` search scores the whole grid
on the `coarse_items` most popular items (an n^3 solve there is ~(n_items / coarse_items)^3
cheaper), then solves the full catalogue twice: at the coarse best, and half a grid step from
it toward its better coarse neighbour (at a grid edge: outward); `grid` solves the full
catalogue at every grid point. Under `--selection cv` every point is also scored on folds of
the training users (`linear.cv_folds`), and the selection compares the pooled figure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import scipy.sparse as sp
import torch

from vaecf.config.modelconfigs import EDLAEConfig
from vaecf.config.specs import FORECAST_MARGIN
from vaecf.models import linalg
from vaecf.models.linear import beta_metrics, csr_on, linear_weights, pooled, restrict
from vaecf.models.neighbourhood import dense_block, neighbour_weights, sparse_b_rows

REFINE_STEP = 10**0.25  # the fast search's step around the coarse best: half a grid step


@dataclass
class Search:
    """What every point of one fit's search shares: the rows B is fitted on `x`, their sparse
    Gram (and its dense copy for the dense solver), the validation split, the folds, the
    penalties to try, and how each B is solved."""

    x: sp.csr_matrix
    gram_sp: sp.csr_matrix
    gram: torch.Tensor | None
    validation: tuple[sp.csr_matrix, sp.csr_matrix] | None
    folds: list
    betas: list[float]
    metrics: tuple[str, ...]
    select_metric: str
    device: torch.device
    dtype: torch.dtype
    emphasis: str
    sparse_opts: tuple  # neighbours, popular_share, popular_neighbours, neighbour_rank
    log: Callable[[str], None] | None = None
    title: str = ""
    deadline: float | None = None  # a time.perf_counter() value: no point that would end past it
    stopped: bool = False  # a point was left untried for the deadline
    tried: list[dict] = field(default_factory=list)
    kept: list = field(default_factory=list)  # the sparse solver's B of the point last scored
    scores: dict = field(default_factory=dict)  # (lambda, p) -> its best value in this stage
    settled: bool = False  # the coarse stage chose: the full catalogue's point skips the folds

    def __post_init__(self) -> None:
        self.diag = torch.from_numpy(self.gram_sp.diagonal())  # each item's count

    def late(self, seconds: float, then: float = 0.0) -> bool:
        """Whether a point that takes `seconds` (the last one's, with a margin for a machine
        whose speed drifts), and `then` seconds of what must follow it, would end past the
        deadline; then the search stops (and says so)."""
        need = FORECAST_MARGIN * seconds + then
        if self.deadline is not None and time.perf_counter() + need > self.deadline:
            self.stopped = True
        return self.stopped

    def view(self, cols=None):
        """What scoring on the items `cols` (None: all) needs, made once per stage: their
        counts, the validation split and (unless `settled`) each fold's (Gram correction,
        counts, fold-in, target) restricted to them."""
        d = self.diag if cols is None else self.diag[cols]
        val = [csr_on(m, cols, self.device) for m in self.validation]
        views = []
        for delta, f_in, f_te in [] if self.settled else self.folds:
            part = restrict(delta, cols)
            df = d + torch.from_numpy(part.diagonal()).to(d)
            views.append((part, df, *(csr_on(m, cols, self.device) for m in (f_in, f_te))))
        return d, val, views

    def dense_solve(self, g: torch.Tensor, l2: float, p: float):
        """B (dense) from Gram `g` with a fold's correction `part` (None: as it is)."""
        return lambda part: linear_weights(g, l2, p, self.emphasis, part).float()

    def sparse_b(self, l2: float, p: float, g: sp.csr_matrix | None = None):
        """The sparse solver's B (CSR parts) on the Gram `g` (None: the fit's own)."""
        k, *opts = self.sparse_opts
        g = self.gram_sp if g is None else g
        return neighbour_weights(self.x, l2, p, k, self.device, self.dtype, g, *opts)

    def sparse_solve(self, l2: float, p: float):
        """X B's rows from the sparse solver's B on the Gram with a fold's correction (None:
        as it is, and that B kept)."""
        n_items = self.gram_sp.shape[0]

        def solve(part):
            parts = self.sparse_b(l2, p, None if part is None else (self.gram_sp + part).tocsr())
            if part is None:
                self.kept[:] = [parts]
            return lambda t: sparse_b_rows(*parts, t, n_items)

        return solve

    def point(self, solve, view, l2: float, p: float) -> list[dict]:
        """Per beta: the validation (and cv) metrics of (lambda, p), B made by
        `solve(fold correction)`, on its stage's `view`, and the value the selection compares.
        One B at a time."""
        d, val, views = view
        got = beta_metrics(solve(None), d, self.betas, *val, self.metrics)
        rows = [{"validation": m} for m in got]
        per_fold = [
            beta_metrics(solve(part), df, self.betas, f_in, f_te, self.metrics)
            for part, df, f_in, f_te in views
        ]
        for i, (beta, row) in enumerate(zip(self.betas, rows)):
            row.update(l2=l2, dropout=p, popularity_exponent=beta)
            parts = [row["validation"]]
            if per_fold:
                row["cv"] = pooled([f[i] for f in per_fold])
                parts.append(row["cv"])
            row["value"] = pooled(parts)[self.select_metric]
        return rows

    def note(self, row: dict) -> None:
        if self.tried and self.tried[-1]["stage"] != row["stage"]:  # a stage's own scores
            self.scores.clear()
        self.tried.append(row)
        if "value" in row:
            at = (row["l2"], row["dropout"])
            self.scores[at] = max(row["value"], self.scores.get(at, -math.inf))
        if self.log and "validation" in row:
            metric = self.select_metric
            cvm = f", cv {row['cv'][metric]:.4f}" if "cv" in row else ""
            self.log(
                f"{self.title} {row['stage']} ({row['n_items']:,} items) lambda "
                f"{row['l2']:g} p {row['dropout']:g} beta {row['popularity_exponent']:g}: "
                f"{metric} {row['validation'][metric]:.4f}{cvm}"
            )

    def order(self, l2s: list[float], dropouts: list[float]):
        """The (lambda, p) points in the order they are tried (read as they are scored): every
        lambda for each p in turn; under a deadline, which may cut the search after a few
        points, a climb: the grids' middle, then the untried neighbours (one grid step in
        lambda or p) of the best point so far until it has none left, then the rest from the
        middle outward. (Walked from lambda 1 up, a search cut after one point kept its worst
        region; walked from the middle outward, it spent its points on both sides alike.)"""
        pairs = [(l2, p) for p in dropouts for l2 in l2s]
        if self.deadline is None:
            yield from pairs
            return

        def off(grid: list[float], v: float) -> float:  # steps from the grid's middle
            return abs(grid.index(v) - (len(grid) - 1) / 2)

        todo = sorted(
            pairs, key=lambda lp: (off(l2s, lp[0]) + off(dropouts, lp[1]), off(l2s, lp[0]))
        )
        while todo:
            nxt = todo[0]
            if self.scores:  # this stage's
                l2, p = max(self.scores, key=self.scores.get)
                i, j = l2s.index(l2), dropouts.index(p)
                steps = [(i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)]
                near = [
                    (l2s[a], dropouts[b])
                    for a, b in steps
                    if 0 <= a < len(l2s) and 0 <= b < len(dropouts)
                ]
                nxt = next((lp for lp in near if lp in todo), nxt)
            todo.remove(nxt)
            yield nxt

    def coarse(self, l2s: list[float], dropouts: list[float], n_coarse: int, refine: bool):
        """The whole grid on the `n_coarse` most popular items (their own sub-problem); the
        (lambda, p) points the full catalogue then solves: the coarse best and, with `refine`,
        half a grid step toward its better coarse neighbour; under a deadline the coarse best
        alone, with its beta and without folds."""
        cols = torch.topk(self.diag, n_coarse).indices.sort().values.numpy()
        sub = torch.from_numpy(dense_block(self.gram_sp, cols))
        sub = sub.to(device=self.device, dtype=self.dtype)
        view = self.view(cols)
        curve: dict[tuple[float, float, float], float] = {}
        last = 0.0
        # under a deadline the full catalogue's one solve must follow: a coarse point's time
        # per solve (it solves once per fold too) scaled as n^3
        full = (self.diag.numel() / len(cols)) ** 3 / (1 + len(self.folds))
        for l2, p in self.order(l2s, dropouts):
            if curve and self.late(last, FORECAST_MARGIN * full * last):
                break
            t1 = time.perf_counter()
            rows = self.point(self.dense_solve(sub, l2, p), view, l2, p)
            last = time.perf_counter() - t1
            for row in rows:
                seconds = round(last / len(rows), 3)
                self.note({"stage": "coarse", "n_items": len(cols), **row, "seconds": seconds})
                curve[(l2, p, row["popularity_exponent"])] = row["value"]
        del sub
        # the first of equals: the smaller lambda, p and beta
        l2, p, beta = max(curve, key=curve.get)
        full = [(l2, p)]
        if self.deadline is not None:
            # the coarse choice is final: the full catalogue solved once, at its lambda, p and
            # beta, and scored on validation alone (with its folds, each full point costs one
            # solve per fold more: on ml-latest-small, 32 s of a 60 s fit, which left the coarse
            # stage one point)
            self.settled, self.betas = True, [beta]
            return full
        if refine:  # half a grid step toward the better coarse neighbour
            i = l2s.index(l2)

            def worth(j: int) -> float:
                """Coarse lambda j's value at its best beta (the full stage chooses beta again
                at each lambda: on a Pinterest-shaped set the coarse best's beta, 0, pointed
                the refinement down where beta 0.1, the full catalogue's choice, gained up:
                validation NDCG@100 0.4409 -> 0.4419); a neighbour the deadline left untried
                counts as worse than any tried, a missing one (the grid's edge) as better."""
                if not 0 <= j < len(l2s):
                    return math.inf
                return max(curve.get((l2s[j], p, b), -math.inf) for b in self.betas)

            down, up = worth(i - 1), worth(i + 1)
            full.append((l2 / REFINE_STEP if down >= up else l2 * REFINE_STEP, p))
        return full

    def scored(self, full: list[tuple[float, float]], n_items: int, sparse: bool):
        """The full catalogue's points scored by the search itself (several betas, or folds):
        (value, lambda, p, beta, the sparse B kept unpenalised or None: a dense B is solved
        again) of the best."""
        view, best, last = self.view(None), None, 0.0
        for l2, p in full:
            if best is not None and self.late(last):
                break
            t1 = time.perf_counter()
            row = {"stage": "full", "n_items": n_items, "l2": l2, "dropout": p}
            solve = self.sparse_solve(l2, p) if sparse else self.dense_solve(self.gram, l2, p)
            rows = self.point(solve, view, l2, p)
            last = time.perf_counter() - t1
            for r in rows:
                self.note({**row, **r, "seconds": round(last, 3)})
                if best is None or r["value"] > best[0]:
                    best = (r["value"], l2, p, r["popularity_exponent"], self.kept[:1] or None)
        self.kept.clear()
        return best

    def record(self, model, solver: str, single: bool, l2, p, beta) -> dict:
        """What `model`'s fit records: the choice, the points tried, the solver and its inputs."""
        cfg, folds = model.config, self.folds
        out = {
            "l2": l2,
            **({"dropout": p} if isinstance(cfg, EDLAEConfig) else {}),
            "grid": self.tried if not single else None,
            "search": None if single else cfg.search,
            "selection": None if single else ("cv" if folds else "validation"),
            "solver": solver,
            "lapack": None
            if model.sparse
            else linalg.solver(model.n_items, self.dtype, self.device),
            "popularity_exponent": beta,
            "gram_rows": self.x.shape[0],
            "solve_dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
        }
        if folds:
            out.update(cv_folds=len(folds), cv_users=sum(f[2].shape[0] for f in folds))
        if model.sparse:
            names = ("neighbours", "popular_share", "popular_neighbours", "neighbour_rank")
            out.update({n: getattr(cfg, n) for n in names}, nnz=int(model.b_values.numel()))
        return out
