"""The linear item-item family: EASE (Steck, WWW 2019) and EDLAE (Steck, NeurIPS 2020), one
closed form with options.

With G = X^T X and a dropout rate p (EDLAE's emphasized denoising; p = 0 is EASE exactly):
    P = (G + lambda I + p/(1-p) diagMat(diag G))^-1,   B = I - P diagMat(1 / diag P),
and scores = X B (diag B = 0, so an item never predicts itself). The solve is a Cholesky
factorisation and inverse on the run's device. A popularity penalty beta (EDLAE's default
0.1, EASE's 0) then divides column j of B by item j's count G_jj^beta, at every point the
search tries, so lambda and p are chosen with it.

Unset lambda (and p) are chosen on validation. The default `fast` search scores the whole grid
on the `coarse_items` most popular items (an n^3 solve there is ~(n_items / coarse_items)^3
cheaper), then solves the full catalogue twice: at the coarse best, and half a grid step from
it toward its better coarse neighbour (at a grid edge: outward); `grid` solves the full
catalogue at every grid point. Every tried point's validation
metrics are recorded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from vaecf import specs
from vaecf.data.matrix import CSR, SparseBatch
from vaecf.errors import ConfigError, RunError
from vaecf.memory import available_bytes, items_cut
from vaecf.models.base import Model
from vaecf.models.neighbourhood import (
    block_bytes,
    dense_block,
    gram_bytes,
    neighbour_weights,
    sparse_b_rows,
)
from vaecf.specs import DEFAULT_DROPOUT_GRID, DEFAULT_GRID, EASEConfig, EDLAEConfig  # noqa: F401

REFINE_STEP = 10**0.25  # the fast search's step around the coarse best: half a grid step


def _sparse_rows(table: torch.Tensor, batch: SparseBatch) -> torch.Tensor:
    """(B, d) sum over each history of value x the item's row of `table`."""
    return F.embedding_bag(
        batch.indices,
        table,
        batch.offsets,
        mode="sum",
        per_sample_weights=batch.values.to(table.dtype),
    )


def linear_bytes(n_items: int, dtype: torch.dtype, search: bool) -> int:
    """Peak bytes of a fit's n_items^2 arrays: the Gram and the array solved in place (in the
    solve's dtype), a float32 copy of B when solving in float64, and the best B kept while a
    search goes on."""
    elem = torch.empty((), dtype=dtype).element_size()
    return n_items * n_items * (2 * elem + (4 if elem != 4 else 0) + (4 if search else 0))


def check_memory(
    n_items: int,
    dtype: torch.dtype,
    device: torch.device,
    search: bool,
    item_users: np.ndarray | None = None,
) -> int:
    """Refuse, before anything large is allocated, with the figures and only the advice that
    would make the fit go through. `item_users`: each item's number of users (rows)."""
    need = linear_bytes(n_items, dtype, search)
    free = available_bytes(device)
    if need <= free:
        return need
    advice = []
    fits = math.isqrt(free * n_items * n_items // need)  # items whose arrays would fit
    kept = 0
    if item_users is not None and 0 < fits < n_items:
        cut, kept = items_cut(item_users, fits)
    if kept:
        advice.append(
            f"keep the {kept:,} items with at least {cut} users (prepare again with "
            f"--min-item-users {cut}; counted there over every user, a few more may stay)"
        )
    else:
        advice.append("drop rare items when preparing (--min-item-users)")
    if dtype != torch.float32:
        advice.append("solve in float32 (--solve-dtype float32)")
    if search:
        one = linear_bytes(n_items, dtype, False)
        if one <= free:
            advice.append(f"give --l2 (one solve needs {one / 2**30:.1f} GiB, no search)")
    advice.append(
        "use a device with more memory, or an autoencoder (its memory grows with "
        "the items, not their square)"
    )
    raise RunError(
        f"EASE on {n_items:,} items needs about {need / 2**30:.1f} GiB for its "
        f"{n_items:,} x {n_items:,} arrays but {device} has {free / 2**30:.1f} GiB free; "
        + "; or ".join(advice)
    )


def _spd_inverse(a: torch.Tensor, l2: float) -> torch.Tensor:
    """The inverse of the symmetric positive definite `a`, by Cholesky. On the CPU through
    scipy's LAPACK (OpenBLAS), overwriting `a`: faster than torch's MKL potrf + potri on an AMD
    EPYC (`benchmarks/linear_search.py --solve-only`); elsewhere torch's."""
    bad = RunError(f"X^T X + {l2} I is not positive definite here; use a larger --l2")
    if a.device.type != "cpu":
        chol, info = torch.linalg.cholesky_ex(a)
        if int(info):
            raise bad
        return torch.cholesky_inverse(chol, out=a)
    from scipy.linalg import lapack

    f = a.numpy().T  # the same symmetric matrix, Fortran-ordered: LAPACK works in place
    potrf, potri = (
        (lapack.dpotrf, lapack.dpotri) if f.dtype == np.float64 else (lapack.spotrf, lapack.spotri)
    )
    c, info = potrf(f, lower=1, overwrite_a=1, clean=0)
    if info:
        raise bad
    c, info = potri(c, lower=1, overwrite_c=1)
    if info:
        raise bad
    out = torch.from_numpy(c.T)  # the inverse's upper triangle (row-major view), junk below
    _mirror_upper(out)
    return out


def _mirror_upper(m: torch.Tensor, tile: int = 512) -> None:
    """Copy the upper triangle of square `m` onto its lower one, tile by tile (cache-sized
    copies, no n_items^2 temporaries)."""
    n = m.shape[0]
    for i in range(0, n, tile):
        d = m[i : i + tile, i : i + tile]
        d.copy_(d.triu() + d.triu(1).T)
        for j in range(0, i, tile):
            m[i : i + tile, j : j + tile].copy_(m[j : j + tile, i : i + tile].T)


def linear_weights(
    gram: torch.Tensor,
    l2: float,
    dropout: float = 0.0,
    emphasis: str = "full",
    delta: sp.spmatrix | None = None,
) -> torch.Tensor:
    """B for one (lambda, p) from the Gram matrix X^T X (not modified; `delta`, a sparse
    correction, added to its copy first): EASE at p = 0 with full emphasis (EDLAE); with none,
    DLAE's B = I - P Lambda (its diagonal then set to 0: a history's own items are never
    ranked, so it changes no recommendation)."""
    a = gram.clone()
    if delta is not None and delta.nnz:
        c = delta.tocoo()
        at = [torch.from_numpy(v.astype(np.int64)).to(a.device) for v in (c.row, c.col)]
        a.index_put_(tuple(at), torch.from_numpy(c.data).to(a), accumulate=True)
    d = a.diagonal()
    base = d.clone() if emphasis == "none" else None
    if dropout:
        d.div_(1.0 - dropout)  # G_ii + p/(1-p) G_ii
    d.add_(l2)
    lam = d - base if base is not None else None  # Lambda: l2 + p/(1-p) G_ii
    p = _spd_inverse(a, l2)  # (n_items, n_items), in a's memory where it can
    if lam is not None:
        b = p.mul_(-lam)  # -P Lambda, column-wise
    else:
        b = p.div_(-p.diagonal().clone())  # -P / diag(P), column-wise
    b.diagonal().zero_()  # with full emphasis, I - P diag(1/diag P) cancels exactly
    return b


def _metrics_of(weight: torch.Tensor, fold_in: CSR, target: CSR) -> dict:
    from vaecf.evaluate import evaluate_scores

    return evaluate_scores(lambda batch: _sparse_rows(weight, batch), fold_in, target)


def _penalty(diag: torch.Tensor, beta: float) -> torch.Tensor:
    """The popularity penalty's column scales: count_j^-beta (1 for beta 0)."""
    return diag.double().clamp(min=1.0).pow(-beta).float()


def _beta_metrics(
    b: torch.Tensor | Callable[[SparseBatch], torch.Tensor],
    diag: torch.Tensor,
    betas: list[float],
    fold_in: CSR,
    target: CSR,
    metrics: tuple[str, ...] | None = None,
) -> list[dict]:
    """Metrics of the unpenalised B (a dense table, or a function of a batch giving its rows of
    X B) under each penalty beta: X B's columns rescaled, which is X (B's columns rescaled),
    without a copy of B."""
    from vaecf.evaluate import DEFAULT_METRICS, evaluate_scores

    metrics = metrics or DEFAULT_METRICS
    rows = b if callable(b) else (lambda t: _sparse_rows(b, t))
    out = []
    for beta in betas:
        scale = _penalty(diag, beta).to(target.device)
        out.append(evaluate_scores(lambda t, s=scale: rows(t) * s, fold_in, target, metrics))
    return out


def _pooled(parts: list[dict]) -> dict:
    """Metrics over the union of several user sets (means weighted by their users; a set
    without users counts for nothing)."""
    keys = [k for k in parts[0] if k not in ("n_users", "n_skipped")]
    parts = [m for m in parts if m["n_users"]]
    n = sum(m["n_users"] for m in parts)
    out = {k: sum(m[k] * m["n_users"] for m in parts) / n if n else math.nan for k in keys}
    return {**out, "n_users": n}


def _restrict(m: sp.csr_matrix, cols: np.ndarray | None) -> sp.csr_matrix:
    return m if cols is None else m[cols][:, cols]


def _csr_on(m: sp.spmatrix, cols: np.ndarray | None, device: torch.device) -> CSR:
    m = m.tocsr()
    return CSR.from_scipy(m if cols is None else m[:, cols], device)


def cv_folds(
    train: sp.csr_matrix, k: int, dtype, seed: int = 0
) -> list[tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]]:
    """K folds of the training users with 5 or more items, as held-out users: each fold's
    (Gram correction, fold-in, target), the correction taking its users' rows out of X^T X
    and putting their fold-in rows back (their 80 percent, drawn as the held-out users' are)."""
    from vaecf.data.splits import fold_in_mask

    x = train.tocsr().astype(dtype)
    x.sort_indices()
    users = np.flatnonzero(np.diff(x.indptr) >= 5)
    fold_of = np.random.default_rng(seed).permutation(len(users)) % k
    out = []
    for f in range(min(k, len(users))):  # no empty fold where fewer users than folds
        xf = x[users[fold_of == f]]
        held = fold_in_mask(np.diff(xf.indptr), seed + f)
        f_te = xf.copy()
        f_te.data = np.where(held, f_te.data, 0).astype(dtype)
        f_te.eliminate_zeros()
        f_in = (xf - f_te).tocsr()
        f_in.eliminate_zeros()
        delta = (f_in.T @ f_in - xf.T @ xf).tocsr()
        delta.eliminate_zeros()
        out.append((delta, f_in, f_te))
    return out


class EASE(Model):
    spec = specs.EASE

    @classmethod
    def search_space(cls, trial, n_train_users: int) -> dict[str, dict]:
        """lambda, log-uniform over 1 to 30,000 (one solve per trial)."""
        return {"train": {}, "model": {"l2": trial.suggest_float("l2", 1.0, 3e4, log=True)}}

    def __init__(self, n_items: int, config: EASEConfig | None = None):
        super().__init__(n_items, config)
        # B: dense (n_items, n_items) `weight`, or from the sparse solver CSR rows (b_indptr,
        # b_indices, b_values) with `weight` empty. Fit (or a checkpoint) sets them; until
        # then they are empty, so that building a model allocates nothing n_items^2.
        self.register_buffer("weight", torch.empty(0))
        self.register_buffer("b_indptr", torch.empty(0, dtype=torch.int64))
        self.register_buffer("b_indices", torch.empty(0, dtype=torch.int64))
        self.register_buffer("b_values", torch.empty(0))
        self.register_buffer("l2", torch.tensor(float("nan"), dtype=torch.float64))

    _B = ("weight", "b_indptr", "b_indices", "b_values")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """B's tensors are taken as they come (their shapes depend on the solver), without a
        copy; a checkpoint from before the sparse solver has no CSR parts."""
        if prefix + "weight" in state_dict:
            for name in self._B:
                value = state_dict.setdefault(prefix + name, getattr(self, name)[:0])
                setattr(self, name, value)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def sparse(self) -> bool:
        return self.b_indptr.numel() > 0

    def _set_sparse(self, parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        self.b_indptr, self.b_indices, self.b_values = parts
        self.weight = self.b_values.new_empty(0)

    def _b_coo(self) -> torch.Tensor:
        """B as a sparse COO tensor (rows: history items)."""
        rows = torch.repeat_interleave(
            torch.arange(self.n_items, device=self.b_indptr.device), self.b_indptr.diff()
        )
        return torch.sparse_coo_tensor(
            torch.stack([rows, self.b_indices]),
            self.b_values,
            (self.n_items, self.n_items),
            check_invariants=False,  # built from a valid CSR
        ).coalesce()

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        if not self.weight.numel() and not self.sparse:  # not fitted: B = 0
            return self.b_values.new_zeros(batch.batch_size, self.n_items)
        if self.sparse:
            return sparse_b_rows(self.b_indptr, self.b_indices, self.b_values, batch, self.n_items)
        return _sparse_rows(self.weight, batch)  # (B, n_items) = X_batch B

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        if not self.weight.numel() and not self.sparse:  # not fitted: B = 0
            return x * 0.0
        if self.sparse:
            if torch.onnx.is_in_onnx_export():  # ONNX has no sparse product: B goes dense
                size = self.n_items**2 * 4
                if size > 2e9:
                    raise ConfigError(
                        f"the sparse solver's B exports to ONNX as a dense matrix of "
                        f"{size / 1e9:.1f} GB, more than one ONNX file holds (2 GB); serve "
                        "it with vaecf serve or vaecf score instead"
                    )
                csr = [t.detach().cpu().numpy() for t in (self.b_values, self.b_indices)]
                csr.append(self.b_indptr.detach().cpu().numpy())
                b = sp.csr_matrix(tuple(csr), shape=(self.n_items, self.n_items)).toarray()
                return x @ torch.from_numpy(b).to(x.dtype)  # through numpy: a graph constant
            return torch.sparse.mm(self._b_coo().t(), x.t().to(self.b_values.dtype)).t()
        return x @ self.weight

    def item_vectors(self) -> torch.Tensor:
        """Rows of B: item j's weights for predicting every other item (a sparse tensor
        from the sparse solver)."""
        return self._b_coo() if self.sparse else self.weight

    def _dropouts(self) -> list[float]:
        return [0.0]

    def _emphasis(self) -> str:
        return getattr(self.config, "emphasis", "full")

    def _keep(self, l2: float, dropout: float) -> None:
        self.l2 = torch.tensor(l2, dtype=torch.float64)

    def fit(
        self,
        train: sp.csr_matrix,
        validate: Callable[[Model], dict] | None = None,
        select_metric: str = "ndcg@100",
        log: Callable[[str], None] | None = None,
        validation: tuple[sp.csr_matrix, sp.csr_matrix] | None = None,
        fold_in: sp.csr_matrix | None = None,
    ) -> dict:
        """Fit B on the training matrix; with lambda (or p, or beta) unset, search them on
        validation (`validation` (fold-in, target), `validate(model)` for the full catalogue
        where the choice is on the validation users alone) and keep the best. Returns what to
        record: the choice, every tried point with its metrics, seconds, the solve's dtype."""
        cfg, device = self.config, self.weight.device
        dtype = getattr(torch, cfg.solve_dtype)
        l2s = [cfg.l2] if cfg.l2 is not None else sorted(cfg.l2_grid)
        dropouts = self._dropouts()
        betas = sorted(cfg.popularity_grid) if cfg.popularity_grid else [cfg.popularity_exponent]
        single = len(l2s) == 1 and len(dropouts) == 1 and len(betas) == 1
        if not single and validate is None:
            raise ConfigError(f"{self.name} needs validation data to choose lambda; give --l2")
        t0 = time.perf_counter()
        x = train.tocsr()
        if cfg.fold_in_rows and fold_in is not None and fold_in.nnz:
            x = sp.vstack([x, fold_in.tocsr()]).tocsr()
        cv = cfg.selection == "cv" and not single
        solver, plan = self._solver(x, dtype, device, single, cv)
        if log:
            log(f"{self.title}: {plan}")
        x = x.astype(np.float64 if dtype == torch.float64 else np.float32)
        gram_sp = (x.T @ x).tocsr()  # sparse: at most the sum of squared history lengths
        gram_sp.sort_indices()
        diag = torch.from_numpy(gram_sp.diagonal())
        # the selection's own scoring (several betas, or folds): anything but one B on the
        # validation users alone, which the caller's `validate` scores
        own = cv or len(betas) > 1
        if own and validation is None:
            raise ConfigError(f"{self.name}'s search needs the validation split")
        folds = (
            [
                f
                for r in range(cfg.cv_repeats)
                for f in cv_folds(train, cfg.cv_folds, x.dtype, 1000 * r)
            ]
            if cv
            else []
        )
        cv = bool(folds)  # no training user with 5 items: the validation users alone
        gram = torch.from_numpy(gram_sp.toarray()).to(device) if solver == "dense" else None
        t_gram = time.perf_counter() - t0
        tried: list[dict] = []

        def stage_view(cols):
            """What scoring on the items `cols` (None: all) needs, made once per stage: their
            counts, the validation split and each fold's (Gram correction, counts, fold-in,
            target) restricted to them."""
            d = diag if cols is None else diag[cols]
            val = [_csr_on(m, cols, device) for m in validation]
            views = []
            for delta, f_in, f_te in folds:
                part = _restrict(delta, cols)
                df = d + torch.from_numpy(part.diagonal()).to(d)
                views.append((part, df, *(_csr_on(m, cols, device) for m in (f_in, f_te))))
            return d, val, views

        from vaecf.evaluate import metrics_with

        metrics = metrics_with(select_metric)

        k = cfg.neighbours
        opts = (cfg.popular_share, cfg.popular_neighbours, cfg.neighbour_rank)
        kept: list = []  # the sparse solver's B of the point last scored

        def dense_solve(g, l2: float, p: float):
            """B (dense) from Gram `g` with a fold's correction `part` (None: as it is)."""
            return lambda part: linear_weights(g, l2, p, self._emphasis(), part).float()

        def sparse_solve(g0: sp.csr_matrix, l2: float, p: float):
            """X B's rows from the sparse solver's B on the Gram `g0` with a fold's correction
            (None: as it is, and that B kept)."""

            def solve(part):
                g = g0 if part is None else (g0 + part).tocsr()
                parts = neighbour_weights(x, l2, p, k, device, dtype, g, *opts)
                if part is None:
                    kept[:] = [parts]
                return lambda t: sparse_b_rows(*parts, t, self.n_items)

            return solve

        def point(solve, view, l2: float, p: float) -> list[dict]:
            """Per beta: the validation (and cv) metrics of (lambda, p), B made by
            `solve(fold correction)`, on its stage's `view`, and the value the selection
            compares. One B at a time."""
            d, val, views = view
            rows = [{"validation": m} for m in _beta_metrics(solve(None), d, betas, *val, metrics)]
            per_fold = [
                _beta_metrics(solve(part), df, betas, f_in, f_te, metrics)
                for part, df, f_in, f_te in views
            ]
            for i, (beta, row) in enumerate(zip(betas, rows)):
                row.update(l2=l2, dropout=p, popularity_exponent=beta)
                parts = [row["validation"]]
                if per_fold:
                    row["cv"] = _pooled([f[i] for f in per_fold])
                    parts.append(row["cv"])
                row["value"] = _pooled(parts)[select_metric]
            return rows

        def note(row: dict) -> None:
            tried.append(row)
            if log and "validation" in row:
                cvm = f", cv {row['cv'][select_metric]:.4f}" if "cv" in row else ""
                log(
                    f"{self.title} {row['stage']} ({row['n_items']:,} items) lambda "
                    f"{row['l2']:g} p {row['dropout']:g} beta {row['popularity_exponent']:g}: "
                    f"{select_metric} {row['validation'][select_metric]:.4f}{cvm}"
                )

        full = [(l2, p) for p in dropouts for l2 in l2s]
        if (
            not single
            and cfg.search == "fast"
            and validation is not None
            and self.n_items > cfg.coarse_items
        ):
            # coarse: the whole grid on the most popular items (their own sub-problem)
            keep = torch.topk(diag, cfg.coarse_items).indices.sort().values
            cols = keep.numpy()
            sub = torch.from_numpy(dense_block(gram_sp, cols)).to(device=device, dtype=dtype)
            view = stage_view(cols)
            curve: dict[tuple[float, float, float], float] = {}
            for l2, p in full:
                t1 = time.perf_counter()
                rows = point(dense_solve(sub, l2, p), view, l2, p)
                for row in rows:
                    seconds = round((time.perf_counter() - t1) / len(rows), 3)
                    note({"stage": "coarse", "n_items": len(cols), **row, "seconds": seconds})
                    curve[(l2, p, row["popularity_exponent"])] = row["value"]
            del sub
            # the first of equals: the smaller lambda, p and beta
            l2, p, beta = max(curve, key=curve.get)
            full = [(l2, p)]
            if cfg.l2 is None:  # half a grid step toward the better coarse neighbour
                i = l2s.index(l2)
                down = curve[(l2s[i - 1], p, beta)] if i > 0 else math.inf
                up = curve[(l2s[i + 1], p, beta)] if i + 1 < len(l2s) else math.inf
                full.append((l2 / REFINE_STEP if down >= up else l2 * REFINE_STEP, p))
        view = stage_view(None) if own else None
        best = None
        for l2, p in full:
            t1 = time.perf_counter()
            row = {"stage": "full", "n_items": self.n_items, "l2": l2, "dropout": p}
            if own:
                self.weight = torch.empty(0, device=device)
                if solver == "sparse":
                    solve = sparse_solve(gram_sp, l2, p)
                else:
                    solve = dense_solve(gram, l2, p)
                for r in point(solve, view, l2, p):
                    note({**row, **r, "seconds": round(time.perf_counter() - t1, 3)})
                    if best is None or r["value"] > best[0]:
                        # the sparse B is kept unpenalised; a dense one is solved again
                        best = (r["value"], l2, p, r["popularity_exponent"], kept[:1] or None)
                continue
            if solver == "sparse":
                self._set_sparse(neighbour_weights(x, l2, p, k, device, dtype, gram_sp, *opts))
                self.b_values.mul_(_penalty(diag, betas[0]).to(device)[self.b_indices])
            else:
                self.weight = torch.empty(0, device=device)  # the last B goes before the next
                self.weight = linear_weights(gram, l2, p, self._emphasis()).to(torch.float32)
                self.weight.mul_(_penalty(diag, betas[0]).to(device))
            row["popularity_exponent"] = betas[0]
            value = 0.0
            if not single:
                row["validation"] = validate(self)
                value = row["validation"][select_metric]
            note({**row, "seconds": round(time.perf_counter() - t1, 3)})
            if best is None or value > best[0]:
                best = (value, l2, p, betas[0], [getattr(self, n) for n in self._B])
        _, l2, p, beta, b = best
        kept.clear()
        if b is None:  # chosen by the selection's own scoring: solve the winner once more
            self.weight = linear_weights(gram, l2, p, self._emphasis()).to(torch.float32)
            self.weight.mul_(_penalty(diag, beta).to(device))
        elif len(b) == 1:  # the sparse B the selection's own scoring kept, penalised now
            self._set_sparse(b[0])
            self.b_values.mul_(_penalty(diag, beta).to(device)[self.b_indices])
        else:
            for name, t in zip(self._B, b):
                setattr(self, name, t)
        del gram, gram_sp
        self._keep(l2, p)
        return {
            "l2": l2,
            **({"dropout": p} if isinstance(cfg, EDLAEConfig) else {}),
            "grid": tried if not single else None,
            "search": None if single else cfg.search,
            "selection": None if single else ("cv" if cv else "validation"),
            **(
                {"cv_folds": len(folds), "cv_users": sum(f[2].shape[0] for f in folds)}
                if cv
                else {}
            ),
            "solver": solver,
            **(
                {
                    "neighbours": cfg.neighbours,
                    "popular_share": cfg.popular_share,
                    "popular_neighbours": cfg.popular_neighbours,
                    "neighbour_rank": cfg.neighbour_rank,
                    "nnz": int(self.b_values.numel()),
                }
                if self.sparse
                else {}
            ),
            "popularity_exponent": beta,
            "gram_rows": x.shape[0],
            "gram_seconds": round(t_gram, 3),
            "seconds": round(time.perf_counter() - t0, 3),
            "solve_dtype": str(dtype).removeprefix("torch."),
            "device": str(device),
        }

    def _solver(
        self, x: sp.csr_matrix, dtype: torch.dtype, device: torch.device, single: bool, cv: bool
    ):
        """The solver to use ("dense" or "sparse") and a line on what it will need, after
        checking that it fits in memory (with `cv`, the sparse solver's fold Gram and B as
        well); before anything large is allocated."""
        cfg, n = self.config, self.n_items
        self.weight = torch.empty(0, device=device)  # a previous B's memory back first
        if device.type == "cuda":
            torch.cuda.empty_cache()
        solver = cfg.solver
        dense, free = linear_bytes(n, dtype, not single), available_bytes(device)
        if solver == "auto":
            solver = "dense" if dense <= free or self._emphasis() == "none" else "sparse"
        if solver == "dense":
            check_memory(n, dtype, device, not single, x.getnnz(axis=0))
            gib = f"{dense / 2**30:.1f} GiB of {free / 2**30:.1f} GiB free on {device}"
            return solver, f"dense solve, {n:,} x {n:,} arrays: about {gib}"
        if self._emphasis() == "none":
            raise ConfigError("the sparse solver fits EASE and EDLAE, not --emphasis none")
        k = min(cfg.neighbours, n)
        # the sparse Gram (and its copy while built), B twice (the best kept while searching),
        # and a block's work: its dense part of G, its systems, their factors and copies; cv
        # adds a fold's Gram (the Gram with the fold's rows swapped) and that fold's B
        wide, big = int(cfg.popular_share * n), min(cfg.popular_neighbours, n)
        extra = wide * max(0, big - k)  # the popular items' longer columns
        b_bytes, g_bytes = (n * k + extra) * 16, gram_bytes(x)  # gram_bytes: two copies
        plain = g_bytes + 2 * b_bytes + block_bytes(n, max(k, big if wide else k))
        need = plain + (g_bytes // 2 + b_bytes if cv else 0)
        host = available_bytes(torch.device("cpu"))
        if need > host:
            other = (
                f"; or choose with --selection validation (--linear-cv false under --model "
                f"auto): no fold Gram and B, about {plain / 2**30:.1f} GiB"
                if cv and plain <= host
                else ""
            )
            raise RunError(
                f"{self.title}'s sparse solver on {n:,} items needs about {need / 2**30:.1f} GiB "
                f"(the sparse X^T X and B with {k} neighbours per item) but the host has "
                f"{host / 2**30:.1f} GiB free; drop rare items when preparing "
                f"(--min-item-users) or lower --neighbours{other}"
            )
        why = (
            f" (the dense arrays would need {dense / 2**30:.1f} GiB)"
            if cfg.solver == "auto"
            else ""
        )
        more = f" ({big} for the {wide:,} most popular)" if wide else ""
        plan = f"sparse solver, {k} neighbours per item{more}{why}: about {need / 2**30:.1f} GiB"
        plan += f" of {host / 2**30:.1f} GiB free on the host"
        if cv:
            plan += f"; cv: {cfg.cv_folds * cfg.cv_repeats + 1} sparse solves per point tried"
        return solver, plan


class EDLAE(EASE):
    """EASE with emphasized denoising: a dropout rate p adds p/(1-p) diag(G) to the ridge,
    shrinking popular items' weights more; p = 0 is EASE."""

    spec = specs.EDLAE

    @classmethod
    def search_space(cls, trial, n_train_users: int) -> dict[str, dict]:
        """lambda log-uniform over 1 to 30,000, p uniform over 0 to 0.6 and the popularity
        penalty beta over 0 to 0.5."""
        space = super().search_space(trial, n_train_users)
        space["model"]["dropout"] = trial.suggest_float("dropout", 0.0, 0.6)
        beta = trial.suggest_float("popularity_exponent", 0.0, 0.5)
        space["model"]["popularity_exponent"] = beta
        return space

    def __init__(self, n_items: int, config: EDLAEConfig | None = None):
        super().__init__(n_items, config)
        self.register_buffer("dropout", torch.tensor(float("nan"), dtype=torch.float64))

    def _dropouts(self) -> list[float]:
        cfg = self.config
        return [cfg.dropout] if cfg.dropout is not None else sorted(cfg.dropout_grid)

    def _keep(self, l2: float, dropout: float) -> None:
        super()._keep(l2, dropout)
        self.dropout = torch.tensor(dropout, dtype=torch.float64)
