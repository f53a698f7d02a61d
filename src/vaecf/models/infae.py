"""inf-AE: the infinitely wide autoencoder in closed form (Sachdeva, Dhaliwal, Wu, McAuley,
"Infinite Recommendation Networks: A Data-Centric Approach", NeurIPS 2022).

An autoencoder x -> W2 relu(W1 x) with one hidden layer, trained to reconstruct its users' rows
by gradient descent on the squared error, becomes kernel ridge regression over users as the
hidden layer grows without bound, with the network's neural tangent kernel (Jacot et al. 2018):

    K(x, y) = |x| |y| (sin t + 2 (pi - t) cos t) / (2 pi),   t = the angle between x and y,

(the ReLU layer's arc-cosine kernels of order 0 and 1). Fitted on the users' rows X (U x n):
alpha = (K(X, X) + lambda m I)^-1 X, m the mean of K's diagonal (so lambda is scale-free); a
history x scores s(x) = K(x, X) alpha. One hyper-parameter, lambda, chosen on validation; one
Cholesky solve per tried lambda. Non-linear in x where EASE is linear, and fitted over users
where EASE is fitted over items: the exact fit costs U^2 memory and U^3 time.

Beyond `--max-users` (10,000) users a seeded sample of that many are the kernel's landmarks L
and every user is still a target (Nystrom's subset of regressors; Williams and Seeger, NIPS
2000): alpha = (K_UL^T K_UL + lambda m (U / L) K_LL)^-1 K_UL^T X, m the mean of K_LL's
diagonal; the same (L x n) alpha and the same scores s(x) = K(x, L) alpha, at L^2 U time and
L^2 memory, the rows formed in blocks. With L = U it is the exact fit; with L a uniform sample,
K_UL^T K_UL ~ (U / L) K_LL^2, so the factor U / L keeps lambda's meaning (and its grid) that of
the exact fit (without it, 55,000 rows over 10,000 landmarks chose the grid's top, 100, with
validation NDCG@100 still rising: 0.4302 at 30, 0.4451 at 100). Fitting the sample alone (the
other users dropped: `--beyond-max-users sample`) threw the model's advantage away at 45,000
users.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
import torch

from vaecf import memory
from vaecf.config import specs
from vaecf.config.modelconfigs import InfAEConfig
from vaecf.data.matrix import CSR, SparseBatch
from vaecf.errors import ConfigError, RunError
from vaecf.evaluate import evaluate_scores, metrics_with
from vaecf.models import first_layer
from vaecf.models.base import Model
from vaecf.models.linalg import NotPositiveDefinite, add_gram_, cholesky, cholesky_solve


def ntk(dot: torch.Tensor, norms_a: torch.Tensor, norms_b: torch.Tensor) -> torch.Tensor:
    """The one-hidden-layer ReLU network's neural tangent kernel from the inputs' dot products
    (A, B) and norms (A,), (B,); a zero row gives zeros. `dot` is overwritten with the answer:
    at its peak this holds three (A, B) arrays (`fit_bytes` counts on it), where the formula
    written out holds six."""
    scale = (norms_a[:, None] * norms_b[None, :]).clamp_min_(1e-12)
    cos = dot.div_(scale).clamp_(-1.0, 1.0)
    t = torch.arccos(cos).neg_().add_(math.pi)  # pi - theta
    k = cos.mul_(t).mul_(2.0).add_(t.sin_())  # sin(theta) + 2 (pi - theta) cos(theta)
    del t
    k.mul_(scale).div_(2.0 * math.pi)
    k[norms_a == 0] = 0.0
    k[:, norms_b == 0] = 0.0
    return k


BLOCK_ROWS = 4096  # users whose kernel rows to the landmarks are formed at once (Nystrom)
# validation users that choose lambda: a seeded sample beyond this many. Each tried lambda
# solves for their kernel rows: at 5,000 validation users and 10,000 landmarks those solves were
# 218 of a 614 s fit (Zen 3, 2026-11-27); the run's validation metrics still cover every user
SEARCH_USERS = 2000
# bisections of log lambda after the grid (half-decade steps): at 55,000 users the grid's best,
# 10, scored validation NDCG@100 0.4428 with 0.4319 at 30 and ~0.445 near 18
REFINE_STEPS = 2


def symmetrize_(a: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """a's lower triangle copied over its upper one, in place, a block of rows at a time."""
    for start in range(0, a.shape[0], block):
        stop = min(start + block, a.shape[0])
        a[:start, start:stop] = a[start:stop, :start].T
        rows = a[start:stop, start:stop]
        rows.copy_(rows.tril() + rows.tril(-1).T)
    return a


def fit_bytes(n_users: int, n_items: int, dtype: torch.dtype, rows: int | None = None) -> int:
    """What a fit holds at its peak (7.45 GiB against a measured 7.97 GiB peak RSS, the
    interpreter and data included, at 10,000 users x 20,000 items;
    `benchmarks/infae_scale.py`): the kernel, its shifted copy and their Cholesky factor
    (dtype); the users' rows as the right-hand side and its solution (dtype); the rows
    transposed, the tried alpha and the best so far (float32). With `rows` beyond the
    `n_users` landmarks (Nystrom): a fourth (landmarks x landmarks) array, K_UL^T K_UL; the
    right-hand side's float32 copy; a block's kernel rows and its (items x landmarks) product."""
    size = torch.tensor([], dtype=dtype).element_size()
    if rows is None or rows <= n_users:
        return 3 * n_users * n_users * size + n_users * n_items * (2 * size + 12)
    per_user = n_items * (3 * size + 16) + 3 * min(rows, BLOCK_ROWS) * size
    return 4 * n_users * n_users * size + n_users * per_user


def users_that_fit(free: int, n_items: int, dtype: torch.dtype, rows: int | None = None) -> int:
    """The most users whose fit (`fit_bytes`; landmarks of a Nystrom fit over `rows`) fits in
    `free` bytes, with 5% to spare for what else the process allocates meanwhile: the positive
    root of a U^2 + b U = free."""
    size = torch.tensor([], dtype=dtype).element_size()
    a, b = 3 * size, n_items * (2 * size + 12)
    if rows is not None:
        a, b = 4 * size, n_items * (3 * size + 16) + 3 * min(rows, BLOCK_ROWS) * size
    u = max(1, int((-b + math.sqrt(b * b + 4 * a * 0.95 * free)) / (2 * a)))
    return u if rows is None else min(u, rows)


class Landmarks:
    """The users a fit keeps (all of them, or Nystrom's landmarks) and the kernel between
    them and any rows, through a sparse product: users share few items, so the dot products
    cost the shared items' pairs, where a product with the dense (items, U) copy reads U values
    per rated item (at 10,000 landmarks: 335 of 434 s of a 55,000-user fit's kernel rows)."""

    def __init__(self, kept: sp.csr_matrix, dtype: torch.dtype, device: torch.device):
        kept = kept.astype(np.float64)
        self.kept_t, self.dtype, self.device = kept.T.tocsr(), dtype, device
        self.norms = self.row_norms(kept)

    def row_norms(self, rows: sp.csr_matrix) -> torch.Tensor:
        squares = np.asarray(rows.multiply(rows).sum(1), dtype=np.float64).ravel()
        return torch.from_numpy(np.sqrt(squares)).to(self.device, self.dtype)

    def kernel(self, rows: sp.csr_matrix, out: torch.Tensor | None = None) -> torch.Tensor:
        """(R, U) the kernel between `rows` and the kept users, written into `out` if given."""
        rows = rows.astype(np.float64)
        dot = torch.from_numpy((rows @ self.kept_t).toarray()).to(self.device, self.dtype)
        k = ntk(dot, self.row_norms(rows), self.norms)
        return k if out is None else out.copy_(k)


@dataclass
class System:
    """The regression to solve for alpha at each lambda: (base + lambda m share ridge) alpha =
    rhs, `ridge` None for the identity; m the mean of the kernel's diagonal. Exact: base = K,
    rhs = X. Nystrom over landmarks L: base = K_UL^T K_UL, ridge = K_LL, rhs = K_UL^T X (the
    subset of regressors: every user's row a target, the landmarks' kernel the function
    space), share = U / L, the rows each landmark stands for."""

    base: torch.Tensor
    ridge: torch.Tensor | None
    rhs: torch.Tensor  # (landmarks, n_items), dtype
    rhs_t: torch.Tensor  # (n_items, landmarks), float32: for the validation users' scores
    mean_diag: float
    landmarks: Landmarks
    share: float = 1.0

    def factor(self, l2: float) -> torch.Tensor:
        a = self.base.clone()
        shift = l2 * self.mean_diag * self.share
        if self.ridge is None:
            a.diagonal().add_(shift)
        else:  # a landmark twice (the same history) would leave it singular: a hair of I
            a.add_(self.ridge, alpha=shift).diagonal().add_(1e-7 * shift * self.mean_diag)
        try:
            return cholesky(a)
        except NotPositiveDefinite:
            raise RunError(
                f"the kernel plus {l2} x its mean diagonal is singular: raise --ridge"
            ) from None


class InfAE(Model):
    spec = specs.INFAE

    @classmethod
    def search_space(cls, trial, n_train_users: int) -> dict[str, dict]:
        """lambda, log-uniform over 0.003 to 300 (in units of the kernel's mean diagonal)."""
        return {
            "train": {},
            "model": {"ridge": trial.suggest_float("ridge", 3e-3, 300.0, log=True)},
        }

    def __init__(self, n_items: int, config: InfAEConfig | None = None):
        super().__init__(n_items, config)
        # the fitted users' rows transposed (n_items, U), their norms (U,) and the dual
        # weights alpha (U, n_items); empty until fitted (or loaded)
        self.register_buffer("users_t", torch.empty(n_items, 0))
        self.register_buffer("user_norms", torch.empty(0))
        self.register_buffer("alpha", torch.empty(0, n_items))
        self.register_buffer("l2", torch.tensor(float("nan"), dtype=torch.float64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """The buffers' shapes depend on the fitted users: taken as they come, row-major (runs
        saved before users_t was made row-major hold it column-major)."""
        for name in ("users_t", "user_norms", "alpha"):
            if prefix + name in state_dict:
                setattr(self, name, state_dict[prefix + name].contiguous())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- scoring ------------------------------------------------------------------------------
    def _kernel_rows(self, batch: SparseBatch, dtype: torch.dtype) -> torch.Tensor:
        """(B, U) the kernel between the batch's histories and the fitted users, in dtype."""
        dot = first_layer.product(batch, self.users_t, batch.values.float()).to(dtype)
        v = batch.values.to(dtype)
        return ntk(dot, batch.row_sums(v * v).sqrt(), self.user_norms.to(dtype))

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        # the angles in float64: arccos is ill-conditioned near cos = 1 (similar users)
        k = self._kernel_rows(batch, torch.float64).to(self.alpha.dtype)
        # and the sum over users at alpha's width, never autocast's: alpha's terms cancel
        # (bf16 products cost 0.004 test NDCG@100 on ml-latest-small and FilmTrust)
        with torch.autocast(k.device.type, enabled=False):
            return k @ self.alpha

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        norms = (x * x).sum(1).sqrt()
        return ntk(x @ self.users_t, norms, self.user_norms) @ self.alpha

    def item_vectors(self) -> torch.Tensor:
        """Each item's column of the fitted users' rows: items are similar when the same
        users hold them."""
        return self.users_t

    # -- fitting ------------------------------------------------------------------------------
    def fit(
        self,
        train: sp.csr_matrix,
        validate: Callable[[Model], dict] | None = None,
        select_metric: str = "ndcg@100",
        log: Callable[[str], None] | None = None,
        validation=None,
        fold_in: sp.csr_matrix | None = None,
        deadline: float | None = None,
    ) -> dict:
        cfg, device = self.config, self.users_t.device
        dtype = getattr(torch, cfg.kernel_dtype)
        l2s = [cfg.ridge] if cfg.ridge is not None else sorted(cfg.ridge_grid)
        if len(l2s) > 1 and validate is None and validation is None:
            raise ConfigError(f"{self.name} needs validation data to choose lambda; give --ridge")
        t0 = time.perf_counter()
        x = train.tocsr()
        if cfg.fold_in_rows and fold_in is not None and fold_in.nnz:
            x = sp.vstack([x, fold_in.tocsr()]).tocsr()
        x = x[np.diff(x.indptr) > 0]  # an empty row adds nothing but a zero kernel row
        n_rows = x.shape[0]
        if n_rows == 0:
            raise RunError(f"{self.title} has no training user with an item to fit on")
        sample = None
        if n_rows > cfg.max_users:
            rng = np.random.default_rng(cfg.sample_seed)
            sample = np.sort(rng.choice(n_rows, cfg.max_users, replace=False))
        how = "exact" if sample is None else cfg.beyond_max_users
        plan = self._check_memory(x, sample, how, dtype, device)
        if log:
            log(plan)
        system = self._system(x, sample, how, dtype, device)
        t_system = time.perf_counter() - t0
        if validation is not None and validation[0].shape[0] > SEARCH_USERS:
            rng = np.random.default_rng(cfg.sample_seed)
            keep = np.sort(rng.choice(validation[0].shape[0], SEARCH_USERS, replace=False))
            validation = tuple(m.tocsr()[keep] for m in validation)
        l2, alpha, tried = self._choose(system, l2s, validate, validation, select_metric, log)
        self.alpha = alpha
        self.l2 = torch.tensor(l2, dtype=torch.float64)
        self.config = replace(cfg, ridge=float(l2))  # the choice, as the run records it
        return {
            "ridge": l2,
            "grid": tried if len(l2s) > 1 else None,
            "users": self.users_t.shape[1],
            "rows": n_rows,
            "approximation": how,
            "kernel_mean_diagonal": system.mean_diag,
            "seconds": round(time.perf_counter() - t0, 3),
            "system_seconds": round(t_system, 3),  # the kernel (Nystrom: and its products)
            "search_users": None if validation is None else validation[0].shape[0],
            "kernel_dtype": cfg.kernel_dtype,
            "device": str(device),
        }

    def _check_memory(self, x, sample, how: str, dtype, device) -> str:
        """The plan's line; refused (RunError) with advice that fits when it does not."""
        n_rows = x.shape[0]
        u = n_rows if sample is None else len(sample)
        rows = n_rows if how == "nystrom" else u
        need, free = fit_bytes(u, self.n_items, dtype, rows), memory.free_memory(device)
        what = f"{self.title} on {u:,} users" + (
            f" (a sample of {n_rows:,}; --max-users)" if how == "sample" else ""
        )
        if how == "nystrom":
            what = (
                f"{self.title} on {n_rows:,} users through {u:,} landmark users (Nystrom; "
                "--max-users)"
            )
        if need > free.bytes:
            # the fit that a smaller --max-users makes: a Nystrom one over every row, or a sample's
            nystrom = self.config.beyond_max_users == "nystrom"
            fits = users_that_fit(free.bytes, self.n_items, dtype, n_rows if nystrom else None)
            advice = [f"give --max-users {fits:,} or less"]
            if dtype == torch.float64:
                advice.append("--kernel-dtype float32")
            raise RunError(memory.refusal(what, need, free, device, advice))
        return memory.statement(what, need, free, device)

    def _system(self, x: sp.csr_matrix, sample, how: str, dtype, device) -> System:
        """The fitted users' rows kept (the landmarks, for Nystrom) and the system to solve."""
        kept = x if sample is None else x[sample]
        marks = Landmarks(kept, dtype, device)
        # (n_items, U) row-major, from the CSR transpose the kernel uses: the sparse first
        # layer gathers its rows (a column-major copy made it 50x slower at 10,000 users)
        self.users_t = torch.from_numpy(marks.kept_t.astype(np.float32).toarray()).to(device)
        self.user_norms = marks.norms.float()
        u = kept.shape[0]
        kernel = torch.empty(u, u, dtype=dtype, device=device)  # (U, U)
        for start in range(0, u, BLOCK_ROWS):
            stop = min(start + BLOCK_ROWS, u)
            marks.kernel(kept[start:stop], out=kernel[start:stop])
        mean_diag = float(kernel.diagonal().mean())
        if how != "nystrom":
            xd = self.users_t.T.to(dtype, memory_format=torch.contiguous_format)  # (U, n_items)
            return System(kernel, None, xd, self.users_t, mean_diag, marks)
        gram = torch.zeros(u, u, dtype=dtype, device=device)
        rhs_t = torch.zeros(self.n_items, u, dtype=dtype, device=device)  # K_UL^T X, transposed
        for start in range(0, x.shape[0], BLOCK_ROWS):
            stop = min(start + BLOCK_ROWS, x.shape[0])
            k = marks.kernel(x[start:stop])
            add_gram_(gram, k)
            k_host = k.cpu().numpy()
            block = x[start:stop].T.astype(k_host.dtype)  # (n_items, B) sparse
            rhs_t += torch.from_numpy(np.asarray(block @ k_host)).to(device)
        symmetrize_(gram)
        share = x.shape[0] / u
        return System(gram, kernel, rhs_t.T.contiguous(), rhs_t.float(), mean_diag, marks, share)

    def _choose(self, system: System, l2s, validate, validation, select_metric, log):
        """(lambda, alpha, the tried lambdas' records): the best lambda on validation, over
        the grid and then REFINE_STEPS bisections (in log lambda) between the best and its
        better neighbour. With the validation split at hand a tried lambda costs its factor
        and a solve for the validation users' kernel rows (formed once), not one for every
        item (alpha): solved once, for the winner (at 10,000 users x 20,000 items the solve
        is ~90% of a lambda)."""
        own = len(l2s) > 1 and validation is not None
        if own:
            device = self.users_t.device
            fold_in, target = (CSR.from_scipy(m.astype(np.float32), device) for m in validation)
            k_t = system.landmarks.kernel(validation[0].tocsr()).T.contiguous()  # (U, V)
        tried, values, best = [], {}, None
        for l2 in self._lambdas(l2s, values):
            t1 = time.perf_counter()
            chol = system.factor(l2)
            row = {"ridge": l2}
            if own:  # the validation users' scores k (base + lambda ridge)^-1 rhs, one batch
                scores = (system.rhs_t @ cholesky_solve(k_t, chol).float()).T
                row["validation"] = evaluate_scores(
                    lambda _, s=scores: s,
                    fold_in,
                    target,
                    metrics_with(select_metric),
                    batch_size=max(1, fold_in.n_rows),
                )
                del scores
            else:
                self.alpha = cholesky_solve(system.rhs, chol).float()
                if len(l2s) > 1:
                    row["validation"] = validate(self)
            del chol
            values[l2] = row["validation"][select_metric] if "validation" in row else 0.0
            tried.append({**row, "seconds": round(time.perf_counter() - t1, 3)})
            if log and len(l2s) > 1:
                log(f"{self.title}: lambda {l2:g}, validation {select_metric} {values[l2]:.4f}")
            if best is None or values[l2] > best[0]:
                best = (values[l2], l2, None if own else self.alpha)
        _, l2, alpha = best
        if alpha is None:
            alpha = cholesky_solve(system.rhs, system.factor(l2)).float()
        return l2, alpha, tried

    @staticmethod
    def _lambdas(grid: list[float], values: dict[float, float]):
        """The lambdas to try: the grid, then (with more than one) REFINE_STEPS geometric
        midpoints, each between the best so far and its better tried neighbour. `values`
        (lambda -> validation value) is filled by the caller between steps."""
        yield from grid
        for _ in range(REFINE_STEPS if len(grid) > 1 else 0):
            tried = sorted(values)
            i = tried.index(max(tried, key=lambda v: values[v]))  # the first of equals
            near = [tried[j] for j in (i - 1, i + 1) if 0 <= j < len(tried)]
            yield math.sqrt(tried[i] * max(near, key=lambda v: values[v]))
