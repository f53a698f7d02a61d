"""Recommender = trained model + item vocabulary: raw item ids in, ranked raw ids and scores out.

A recommendation is a fold-in: any history (a known user's or a new one's) is encoded, decoded,
its own items are excluded, and the top k of the rest are returned with their probabilities
under the model's multinomial.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vaecf import checkpoint
from vaecf import precision as prec
from vaecf.config import from_dict
from vaecf.data.matrix import SparseBatch
from vaecf.data.vocab import Vocabulary
from vaecf.errors import RunError
from vaecf.models.multvae import ModelConfig, MultAE, Scorer, build_model
from vaecf.trainer import load_run_config


@dataclass
class Recommendation:
    item_ids: list  # raw ids, best first
    scores: list[float]  # probability of each item under the model (history excluded)
    unknown: list = field(default_factory=list)  # history ids the model has never seen

    def to_dict(self) -> dict:
        return {
            "items": [{"item_id": i, "score": s} for i, s in zip(self.item_ids, self.scores)],
            "unknown": self.unknown,
        }


class Recommender:
    def __init__(self, model: MultAE, items: Vocabulary, precision: str = "fp32"):
        if len(items) != model.n_items:
            raise ValueError(f"vocabulary has {len(items)} items, model {model.n_items}")
        prec.check_precision(precision, next(model.parameters()).device)
        if precision in ("bf16", "fp16"):  # a half-width copy: no casts per call
            model = model.to(torch.bfloat16 if precision == "bf16" else torch.float16)
        self.model = model.eval()
        self.scorer = Scorer(self.model)
        self.items = items
        self.precision = precision
        self.device = next(model.parameters()).device

    @classmethod
    def load(
        cls,
        run_dir: str | os.PathLike,
        device: str = "cpu",
        checkpoint_name: str = "best.pt",
        precision: str = "fp32",
    ) -> Recommender:
        """The run's best model on `device`; precision "bf16" serves a bfloat16 copy."""
        run_dir = Path(run_dir)
        cfg = load_run_config(run_dir)
        dev = prec.resolve_device(device)
        ck = checkpoint.load(run_dir / checkpoint_name, map_location=dev)
        model = build_model(cfg["data"]["n_items"], from_dict(ModelConfig, cfg["model"]))
        try:
            model.load_state_dict(ck["model"])
        except (RuntimeError, KeyError) as e:
            raise RunError(
                f"{run_dir}/{checkpoint_name} does not match the run's config ({e})"
            ) from None
        items = Vocabulary.load(run_dir / "items.parquet")
        return cls(model.to(dev), items, precision)

    def _batch(self, rows: Sequence[list[int]]) -> SparseBatch:
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
        flat = [i for r in rows for i in r]
        return SparseBatch(
            indices=torch.tensor(flat, dtype=torch.long, device=self.device),
            offsets=(torch.cumsum(lens, 0) - lens).to(self.device),
            values=torch.ones(len(flat), device=self.device),
            row_ids=torch.repeat_interleave(torch.arange(len(rows)), lens).to(self.device),
            batch_size=len(rows),
        )

    @torch.no_grad()
    def recommend_batch(
        self, histories: Sequence[Iterable], k: int = 10, exclude_history: bool = True
    ) -> list[Recommendation]:
        """One Recommendation per history (a list of raw item ids)."""
        if k < 1:
            raise ValueError("k must be at least 1")
        known, unknown = (
            zip(*(self.items.index_of(h) for h in histories)) if histories else ((), ())
        )
        known = [sorted(set(r)) for r in known]
        if not known:
            return []
        batch = self._batch(known)
        logits = self.scorer(batch)
        probs = torch.softmax(logits.float(), dim=1)
        if exclude_history:
            probs[batch.row_ids, batch.indices] = -1.0
        k_eff = min(k, self.model.n_items)
        top = probs.topk(k_eff, dim=1)
        out = []
        for r in range(len(known)):
            idx, sc = top.indices[r].tolist(), top.values[r].tolist()
            keep = [j for j, s in enumerate(sc) if s >= 0]  # fewer items left than k
            out.append(
                Recommendation(
                    self.items.id_of([idx[j] for j in keep]),
                    [sc[j] for j in keep],
                    list(unknown[r]),
                )
            )
        return out

    def recommend(
        self, history: Iterable, k: int = 10, exclude_history: bool = True
    ) -> Recommendation:
        """Top-k raw item ids and scores for one history of raw item ids."""
        return self.recommend_batch([list(history)], k, exclude_history)[0]
