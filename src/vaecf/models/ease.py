"""The linear item-item family: EASE (Steck, WWW 2019) and EDLAE (Steck, NeurIPS 2020), one
closed form with options (vaecf.models.linear) and its search (vaecf.models.linear_search).

The solve is a Cholesky factorisation and inverse on the run's device, or the sparse solver
(vaecf.models.neighbourhood) where the dense arrays do not fit. A popularity penalty beta
(EDLAE's default 0.1, EASE's 0) then divides column j of B by item j's count G_jj^beta, at every
point the search tries, so lambda and p are chosen with it. Every tried point's validation
metrics are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
import torch

from vaecf import memory
from vaecf.config import specs
from vaecf.config.modelconfigs import EASEConfig, EDLAEConfig
from vaecf.data.matrix import SparseBatch
from vaecf.errors import ConfigError, RunError
from vaecf.models import linalg
from vaecf.models.base import Model
from vaecf.models.linear import check_memory, cv_folds, linear_bytes, penalty, sparse_rows
from vaecf.models.linear_search import Search
from vaecf.models.linear_update import Inverse, inverse_diag
from vaecf.models.neighbourhood import block_bytes, gram_bytes, sparse_b_rows


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
        # diag P beside a dense EASE B (p = 0, full emphasis), from which an update recovers P
        # (vaecf.models.linear_update); empty otherwise, and in runs from before it
        self.register_buffer("p_diag", torch.empty(0))
        self.register_buffer("l2", torch.tensor(float("nan"), dtype=torch.float64))
        # an EASE update's start: the run's inverse, updated by the rows that changed; and the
        # rows whose X^T X a fit with diag P solved, which its run keeps for the next update
        self.start: Inverse | None = None
        self.gram_rows: sp.csr_matrix | None = None

    _B = ("weight", "b_indptr", "b_indices", "b_values", "p_diag")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """B's tensors are taken as they come (their shapes depend on the solver), without a
        copy; a checkpoint from before the sparse solver has no CSR parts (nor diag P)."""
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
        return sparse_rows(self.weight, batch)  # (B, n_items) = X_batch B

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

    def contributions(self, history: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """B[history][:, items]: a score is X B, the sum of B's rows over the history (the
        popularity penalty is in B's columns), so each row is its item's exact share."""
        if not self.weight.numel() and not self.sparse:  # not fitted: B = 0
            return torch.zeros(len(history), len(items))
        if not self.sparse:
            return self.weight[history][:, items].float()
        n = len(history)
        one_each = SparseBatch(  # one row per history item: its row of B
            indices=history, offsets=torch.arange(n, device=history.device),
            values=torch.ones(n, device=history.device),
            row_ids=torch.arange(n, device=history.device), batch_size=n,
        )  # fmt: skip
        rows = sparse_b_rows(self.b_indptr, self.b_indices, self.b_values, one_each, self.n_items)
        return rows[:, items].float()

    def item_vectors(self) -> torch.Tensor:
        """Rows of B: item j's weights for predicting every other item (a sparse tensor
        from the sparse solver)."""
        return self._b_coo() if self.sparse else self.weight

    def _dropouts(self) -> list[float]:
        return [0.0]

    def _emphasis(self) -> str:
        return getattr(self.config, "emphasis", "full")

    def _keep(self, l2: float, dropout: float, beta: float) -> None:
        """The choice kept: lambda in the weights, and in the config (what the run's config.json
        records) the chosen values in place of the unset ones. The grids stay (unread once their
        value is set) but for the penalties' grid, which is emptied: a non-empty one is
        searched, so that the config fits this B again."""
        self.l2 = torch.tensor(l2, dtype=torch.float64)
        self.config = replace(
            self.config, l2=float(l2), popularity_exponent=float(beta), popularity_grid=[]
        )

    def fit(
        self,
        train: sp.csr_matrix,
        validate: Callable[[Model], dict] | None = None,
        select_metric: str = "ndcg@100",
        log: Callable[[str], None] | None = None,
        validation: tuple[sp.csr_matrix, sp.csr_matrix] | None = None,
        fold_in: sp.csr_matrix | None = None,
        deadline: float | None = None,
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
        # the selection's own scoring (several betas, or folds): anything but one B on the
        # validation users alone, which the caller's `validate` scores
        own = cv or len(betas) > 1
        if own and validation is None:
            raise ConfigError(f"{self.name}'s search needs the validation split")
        start, self.start = self.start, None  # an update's, used once where it pays (CPU)
        dense_cpu = single and solver == "dense" and device.type == "cpu"
        if start and (got := start.tried(x, l2s[0], dense_cpu, log)):
            return self._from_inverse(x, *got, l2s[0], betas[0], t0)
        search = self._search(x, train, solver, cv, betas, validation, select_metric, log, deadline)
        t_gram = time.perf_counter() - t0
        full = search.order(l2s, dropouts)
        fast = cfg.search == "fast" and validation is not None and self.n_items > cfg.coarse_items
        if not single and fast:
            full = search.coarse(l2s, dropouts, cfg.coarse_items, refine=cfg.l2 is None)
        if own:
            self.weight = torch.empty(0, device=device)
            best = search.scored(full, self.n_items, solver == "sparse")
        else:
            best = self._validated(search, full, validate, single, solver == "sparse")
        self._install(search, *best[1:])
        self._keep(best[1], best[2], best[3])
        record = search.record(self, solver, single, best[1], best[2], best[3])
        record.update(gram_seconds=round(t_gram, 3), seconds=round(time.perf_counter() - t0, 3))
        if search.stopped:
            record["stopped"] = "budget"
        return record

    def _search(self, x, train, solver, cv, betas, validation, select_metric, log, deadline):
        """The search over lambda, p and beta on `x` (the training rows, and the fold-in rows
        where they count): X^T X sparse, and dense for the dense solver; with `cv`, the
        folds of `train` drawn cv_repeats times."""
        cfg, device = self.config, self.weight.device
        dtype = getattr(torch, cfg.solve_dtype)
        x = x.astype(np.float64 if dtype == torch.float64 else np.float32)
        if solver == "sparse":  # large catalogues: scipy's one-thread product takes 30 s at 100,000
            from vaecf.models import gather

            gram_sp = gather.gram(x)  # the same matrix, in parallel
        else:
            gram_sp = (x.T @ x).tocsr()  # sparse: at most the sum of squared history lengths
            gram_sp.sort_indices()
        reps = range(cfg.cv_repeats) if cv else ()
        folds = [f for r in reps for f in cv_folds(train, cfg.cv_folds, x.dtype, 1000 * r)]
        from vaecf.evaluate import metrics_with

        return Search(
            x,
            gram_sp,
            torch.from_numpy(gram_sp.toarray()).to(device) if solver == "dense" else None,
            validation,
            folds,
            betas,
            metrics_with(select_metric),
            select_metric,
            device,
            dtype,
            self._emphasis(),
            (cfg.neighbours, cfg.popular_share, cfg.popular_neighbours, cfg.neighbour_rank),
            log,
            self.title,
            deadline,
        )

    def _validated(self, search: Search, full, validate, single: bool, sparse: bool):
        """The full catalogue's points, each B set on the model and scored by `validate`
        (nothing scored for a single point): (value, lambda, p, beta, B's tensors) of the
        best."""
        beta, best, last = search.betas[0], None, 0.0
        for l2, p in full:
            if best is not None and search.late(last):
                break
            t1 = time.perf_counter()
            if sparse:
                self._set_sparse(search.sparse_b(l2, p))
                self.b_values.mul_(penalty(search.diag, beta).to(search.device)[self.b_indices])
            else:
                self.weight = torch.empty(0, device=search.device)  # the last B goes first
                b = search.dense_solve(search.gram, l2, p)(None)
                self.weight = b.mul_(penalty(search.diag, beta).to(search.device))
            row = {"stage": "full", "n_items": self.n_items, "l2": l2, "dropout": p}
            row["popularity_exponent"] = beta
            value = 0.0
            if not single:
                row["validation"] = validate(self)
                value = row["value"] = row["validation"][search.select_metric]
            last = time.perf_counter() - t1
            search.note({**row, "seconds": round(last, 3)})
            if best is None or value > best[0]:
                best = (value, l2, p, beta, [getattr(self, n) for n in self._B])
        return best

    def _install(self, search: Search, l2: float, p: float, beta: float, b) -> None:
        """Set the chosen B: solved again (dense, chosen by the search's own scoring), the
        sparse B the search kept (penalised now), or B's tensors as they were validated."""
        scale = penalty(search.diag, beta).to(search.device)
        if b is None:
            self.weight = search.dense_solve(search.gram, l2, p)(None).mul_(scale)
        elif len(b) == 1:
            self._set_sparse(b[0])
            self.b_values.mul_(scale[self.b_indices])
        else:
            for name, t in zip(self._B, b):
                setattr(self, name, t)
        if self.weight.numel() and not p and self._emphasis() == "full":
            self.p_diag = inverse_diag(search.gram, self.weight, l2, scale)
            self.gram_rows = search.x
        search.gram = search.gram_sp = None

    def _from_inverse(self, x, p, added: int, removed: int, l2: float, beta: float, t0) -> dict:
        """B from the updated inverse P (`start`), at the run's lambda and beta: no search."""
        d = p.diagonal().clone()
        self.p_diag, self.gram_rows = d.float(), x
        self.weight = p.div_(-d).float()
        self.weight.diagonal().zero_()
        counts = torch.from_numpy(x.getnnz(axis=0))  # the Gram's diagonal: `start` took binary rows
        self.weight.mul_(penalty(counts, beta).to(self.weight.device))
        self._keep(l2, 0.0, beta)
        return {"l2": l2, "grid": None, "search": None, "selection": None, "solver": "dense",
                "lapack": None, "popularity_exponent": beta, "gram_rows": x.shape[0],
                "solve_dtype": str(self.weight.dtype).removeprefix("torch."),
                "device": str(self.weight.device), "rows_added": added, "rows_removed": removed,
                "gram_seconds": 0.0, "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip

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
        dense, free = linear_bytes(n, dtype, not single), memory.free_memory(device)
        if solver == "auto":
            solver = "dense" if dense <= free.bytes or self._emphasis() == "none" else "sparse"
        if solver == "dense":
            check_memory(n, dtype, device, not single, x.getnnz(axis=0))
            what = f"dense solve ({linalg.solver(n, dtype, device)} LAPACK), {n:,} x {n:,} arrays"
            return solver, memory.statement(what, dense, free, device)
        if self._emphasis() == "none":
            raise ConfigError("the sparse solver fits EASE and EDLAE, not --emphasis none")
        k = min(cfg.neighbours, n)
        # the sparse Gram (and its copy while built), B twice (the best kept while searching),
        # and a block's work (its dense part of G, its systems: `block_bytes`); cv
        # adds a fold's Gram (the Gram with the fold's rows swapped) and that fold's B
        wide, big = int(cfg.popular_share * n), min(cfg.popular_neighbours, n)
        extra = wide * max(0, big - k)  # the popular items' longer columns
        b_bytes, block = (n * k + extra) * 16, block_bytes(n, max(k, big if wide else k))

        def needs(g_bytes: int) -> tuple[int, int]:  # gram_bytes: two copies
            plain = g_bytes + 2 * b_bytes + block
            return plain, plain + (g_bytes // 2 + b_bytes if cv else 0)

        cpu = torch.device("cpu")
        host = memory.free_memory(cpu)
        plain, need = needs(gram_bytes(x))
        if need > host.bytes:  # the bound counts a pair once per history: count G's entries
            plain, need = needs(gram_bytes(x, exact=True))
        if need > host.bytes:
            advice = ["drop rare items when preparing (--min-item-users)", "lower --neighbours"]
            if cv and plain <= host.bytes:
                advice.append(
                    "choose with --selection validation (--linear-cv false under --model "
                    f"auto): no fold Gram and B, about {memory.gib(plain)}"
                )
            what = f"{self.title}'s sparse solver on {n:,} items"
            parts = f" (the sparse X^T X and B with {k} neighbours per item)"
            raise RunError(memory.refusal(what, need, host, cpu, advice, parts))
        why = (
            f" (the dense arrays would need {dense / 2**30:.1f} GiB)"
            if cfg.solver == "auto"
            else ""
        )
        more = f" ({big} for the {wide:,} most popular)" if wide else ""
        what = f"sparse solver, {k} neighbours per item{more}{why}"
        plan = memory.statement(what, need, host, cpu)
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

    def _keep(self, l2: float, dropout: float, beta: float) -> None:
        super()._keep(l2, dropout, beta)
        self.dropout = torch.tensor(dropout, dtype=torch.float64)
        self.config = replace(self.config, dropout=float(dropout))
