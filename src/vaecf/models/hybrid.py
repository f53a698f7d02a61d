"""RecVAE with a frozen EDLAE path: an autoencoder that starts where the linear models end.

The logits of a history x are RecVAE's decoder output plus `alpha * (x B)`, where B is EDLAE's
item-item matrix (models/ease.py) fitted in closed form on the training users before the first
epoch (lambda and p searched on validation as `--model edlae` does, or given) and then frozen,
and alpha is one trained scalar. The VAE thus learns what the linear model misses, under its
own multinomial likelihood, composite prior and alternating schedule.

With `distil` above 0 the path is a teacher instead (knowledge distillation, Hinton et al.,
2015): the decoder alone scores, and its softmax is trained toward the mix (1 - distil) x +
distil n_u softmax(alpha x B) of the history and the teacher's distribution (alpha, its
temperature, the likeliest on the training users; frozen).

The first form is the cheap variant of VASP (Vančura & Kordík, ICANN 2021: sigmoid(VAE) x
sigmoid(x B), B trained jointly, focal loss) that keeps Mult-VAE's softmax training;
neither form's accuracy is published: it is measured in benchmarks/README.md. B
costs n_items^2 floats (checked against memory like EASE; a student keeps it too), so this
model is for catalogues where EASE fits.
"""

from __future__ import annotations

from dataclasses import replace

import scipy.sparse as sp
import torch
from torch import nn

from vaecf.config import specs
from vaecf.config.modelconfigs import HybridConfig
from vaecf.data.matrix import CSR, SparseBatch
from vaecf.models.base import Phase
from vaecf.models.ease import EDLAE
from vaecf.models.fused import linear_multinomial_nll
from vaecf.models.linear import linear_bytes, metrics_of, sparse_rows
from vaecf.models.recvae import RecVAE

ALPHA_GRID = [2.0**k for k in range(13)]  # 1 ... 4096


class RecVAEEDLAE(RecVAE):
    spec = specs.RECVAE_EDLAE

    def __init__(self, n_items: int, config: HybridConfig | None = None):
        super().__init__(n_items, config)
        b = torch.zeros(n_items, n_items)  # EDLAE's B
        if self.config.train_linear:
            self.shallow = nn.Parameter(b)  # the same state-dict key as the frozen buffer
        else:
            self.register_buffer("shallow", b)
        self.alpha = nn.Parameter(torch.tensor(float(self.config.alpha or 1.0)))

    def prepare_bytes(self) -> int:
        """The EDLAE fit's n_items^2 arrays (searching where a linear setting is not given)."""
        c = self.config
        search = c.linear_l2 is None or c.linear_dropout is None
        return linear_bytes(self.n_items, getattr(torch, EDLAE.Config().solve_dtype), search)

    def prepare(self, train: sp.csr_matrix, validation) -> dict:
        """Fit the EDLAE path on the training users (before the first epoch)."""
        c = self.config
        cfg = EDLAE.Config(
            l2=c.linear_l2,
            dropout=c.linear_dropout,
            solver="dense",
            popularity_exponent=c.linear_popularity_exponent,
        )
        linear = EDLAE(self.n_items, cfg)
        linear = linear.to(self.shallow.device)
        val = tuple(CSR.from_scipy(m, self.shallow.device) for m in validation)
        record = linear.fit(
            train, validate=lambda m: metrics_of(m.weight, *val), validation=validation
        )
        with torch.no_grad():
            self.shallow.copy_(linear.weight)
            # start where the linear model ends: a zero decoder (a student starts as RecVAE),
            # and alpha the scale at which softmax(alpha x B) best fits the training users (x B
            # is in regression units)
            if not c.distil:
                self.decoder.weight.zero_()
                self.decoder.bias.zero_()
            a = self.config.alpha
            self.alpha.fill_(a if a is not None else self._likeliest_alpha(train))
        # the card shows the chosen values (a resume restores the path from its checkpoint)
        self.config = replace(
            self.config,
            linear_l2=float(record["l2"]),
            linear_dropout=float(record["dropout"]),
            linear_popularity_exponent=float(record["popularity_exponent"]),
        )
        return {
            "linear_l2": record["l2"],
            "linear_dropout": record["dropout"],
            "linear_popularity_exponent": record["popularity_exponent"],
            "alpha": float(self.alpha.detach()),
        }

    @torch.no_grad()
    def _likeliest_alpha(self, train: sp.csr_matrix, n_users: int = 2000) -> float:
        """The alpha of ALPHA_GRID with the highest multinomial log-likelihood of
        softmax(alpha x B) on (up to `n_users` of) the training users."""
        x = CSR.from_scipy(train.tocsr()[:n_users], self.shallow.device)
        batch = x.batch(torch.arange(x.n_rows, device=self.shallow.device))
        s = sparse_rows(self.shallow, batch)  # (B, n_items)
        picked = s[batch.row_ids, batch.indices] * batch.values
        best = None
        for a in ALPHA_GRID:
            lse = torch.logsumexp(a * s, dim=1)
            ll = float((a * picked).sum() - (batch.row_sums() * lse).sum())
            if best is None or ll > best[0]:
                best = (ll, a)
        return best[1]

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        groups = super().param_groups()
        if not self.config.distil:  # a teacher's temperature stays as it was fitted
            groups["decoder"].append(self.alpha)
        if self.config.train_linear:
            groups["decoder"].append(self.shallow)
        return groups

    def _offset(self, batch: SparseBatch, alpha: torch.Tensor, shallow: torch.Tensor):
        s = sparse_rows(shallow, batch)  # (B, n_items)
        if self.config.train_linear:  # B's diagonal is trained away: take it back out
            own = batch.values.to(s.dtype) * shallow.diagonal()[batch.indices]
            s = s.index_put((batch.row_ids, batch.indices), -own, accumulate=True)
        return alpha * s

    def _linear(self) -> torch.Tensor:
        """B with a zero diagonal."""
        b = self.shallow.detach()
        return b - torch.diag(b.diagonal()) if self.config.train_linear else b

    def scores(self, batch: SparseBatch) -> torch.Tensor:
        if self.config.distil:
            return super().scores(batch)
        offset = self._offset(batch, self.alpha, self.shallow)
        return super().scores(batch) + offset.to(self.alpha.dtype)

    def dense_scores(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.distil:
            return super().dense_scores(x)
        return super().dense_scores(x) + self.alpha * (x @ self._linear())

    def distilled_nll(self, z, w, b, batch: SparseBatch) -> torch.Tensor:
        """sum_u [n_u lse_u - sum_i t_ui logit_ui], t = (1 - d) x + d n_u q, q the teacher's
        softmax(alpha x B): the history's part through the fused layer, the teacher's as
        q . logit = z . (q W) + q . b (no second (B, n_items) logits)."""
        d, acc = self.config.distil, torch.promote_types(w.dtype, torch.float32)
        with torch.no_grad():
            q = torch.softmax(self.alpha * sparse_rows(self.shallow, batch), dim=1)
            q = q.to(acc) * batch.row_sums().to(acc)[:, None]  # n_u q
        own = linear_multinomial_nll(z, w, b, batch, values=(1.0 - d) * batch.values)
        taught = (z.to(acc) * (q @ w.to(acc))).sum() + (q @ b.to(acc)).sum()
        return own - d * taught

    def nll(self, z, w, b, batch: SparseBatch, phase: Phase | None) -> torch.Tensor:
        if self.config.distil:
            return self.distilled_nll(z, w, b, batch)
        alpha, shallow = self.alpha, self.shallow
        if phase is not None and phase.name == "encoder":
            alpha, shallow = alpha.detach(), shallow.detach()
        return linear_multinomial_nll(z, w, b, batch, self._offset(batch, alpha, shallow))
