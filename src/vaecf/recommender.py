"""Recommender = a model of the contract + item vocabulary: raw item ids in, ranked raw ids and
scores out. It imports no training code (what a server loads).

A recommendation is a fold-in: any history (a known user's or a new one's) is scored, its own
items are excluded (unless asked otherwise), an allow list or a deny list filters the rest, and the
top k are returned, with their names where the run has them (`titles`). Scores of multinomial
models (Mult-VAE, Mult-DAE, RecVAE) are each item's probability under the model; EASE's are its
raw scores, popularity's the training counts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from vaecf import precision as prec
from vaecf import rundir
from vaecf.data.histories import UserHistories, run_histories
from vaecf.data.matrix import SparseBatch
from vaecf.data.vocab import Vocabulary
from vaecf.errors import ConfigError, DataError, RunError
from vaecf.models.base import Model, cosine_neighbours, vector_norms
from vaecf.models.explain import EXPLAIN_TOP, check_work, strongest, weights
from vaecf.models.serving_choice import DEFAULT_BATCH_SIZES, copy_to_serve, one_copy
from vaecf.models.serving_pick import PrecisionChoice


@dataclass
class Recommendation:
    item_ids: list  # raw ids, best first
    scores: list[float]  # the model's score of each (probability for multinomial models)
    unknown: list = field(default_factory=list)  # history ids the model has never seen
    titles: list | None = None  # each item's name (None where unnamed); None: the run has none
    # "popular": the list is training popularity, so nothing in the history led to it (a cold
    # start: no known item in the history; with explain, also the popularity model's answers)
    fallback: str | None = None
    # explain=True: for each item, the history items that led to it, strongest first, as
    # [{"item_id", "weight"[, "title"]}] (vaecf.models.explain says what a weight is); None: not
    # asked, or a fallback
    because: list | None = None

    def to_dict(self) -> dict:
        """{"items": [{"item_id", "score"[, "title"][, "because"]}], "unknown", "fallback"}:
        "title" (null for an item without one) on every item when the run has names, on none
        otherwise; "because" [{"item_id", "weight"[, "title"]}] where explained; "fallback"
        is "popular" where the list is training popularity, else null."""
        items = [{"item_id": i, "score": s} for i, s in zip(self.item_ids, self.scores)]
        if self.titles is not None:
            for item, title in zip(items, self.titles, strict=True):
                item["title"] = title
        for item, why in zip(items, self.because or ()):
            item["because"] = why
        return {"items": items, "unknown": self.unknown, "fallback": self.fallback}


class Recommender:
    def __init__(
        self,
        model: Model,
        items: Vocabulary,
        precision: str = "fp32",
        info=None,
        names: dict | None = None,
        popularity: np.ndarray | None = None,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    ):
        if len(items) != model.n_items:
            raise ConfigError(f"vocabulary has {len(items)} items, model {model.n_items}")
        # a history with no known item is ranked by training popularity (share of the
        # training interactions), whatever the model; None: the model scores it as it is
        self.popularity = None
        self.popularity_counts = None if popularity is None else np.asarray(popularity)
        if popularity is not None:
            if len(popularity) != model.n_items:
                raise ConfigError(f"popularity has {len(popularity)} items, model {model.n_items}")
            p = torch.as_tensor(np.asarray(popularity, dtype=np.float64))
            self.popularity = (p / max(float(p.sum()), 1.0)).float().to(model.device)
        self.device = model.device
        # precision_choice: what "auto" chose, from which timings (None: precision was given)
        self.precision_choice: PrecisionChoice | None
        self.model, self.score_fn, self.precision_choice = copy_to_serve(
            model, precision, batch_sizes, self.popularity_counts
        )
        self.items = items
        self.precision = getattr(self.precision_choice, "chosen", precision)
        self.info = info or {}  # the run's config, when loaded from a run directory
        self.results: dict | None = None  # the run's results.json (validation, test metrics)
        self.names = names  # {raw item id: name}, or None when the run has no names
        self.source: str | None = None  # the run directory it was loaded from (None: built here)
        # the users of the run's prepared dataset, loaded on the first recommend_user
        self._histories: tuple[str | None, UserHistories] | None = None
        self._histories_lock = threading.Lock()
        self._name_index = None  # lower-case names in vocabulary order, built by `search`
        # similar items: the item vectors and their norms, taken once per loaded model (the
        # norms are n_items floats; the vectors are the model's own, not a copy)
        self._no_similar: Exception | None = None
        self.item_vectors = self.item_norms = None
        try:
            self.item_vectors = self.model.item_vectors().detach()
            self.item_norms = vector_norms(self.item_vectors)
        except (RunError, NotImplementedError) as e:  # popularity: no notion of similar items
            self._no_similar = e

    @classmethod
    def load(
        cls,
        run_dir: str | os.PathLike,
        device: str = "cpu",
        checkpoint_name: str = rundir.BEST,
        precision: str = "fp32",
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    ) -> Recommender:
        """The run's selected model on `device`, served in `precision` (fp32, tf32, bf16, fp16,
        or int8: see `vaecf.models.serving`), or "auto": the fastest copy here at `batch_sizes`
        of those that rank as fp32 does, timed once (`vaecf.models.serving_choice`)."""
        dev = prec.resolve_device(device)
        model, cfg = rundir.load_model(run_dir, dev, checkpoint_name)
        items = Vocabulary.load(os.path.join(run_dir, rundir.ITEMS))
        pop = rundir.load_popularity(run_dir, model.n_items)
        rec = cls(model, items, precision, cfg, rundir.load_item_names(run_dir), pop, batch_sizes)
        rec.source = os.path.abspath(run_dir)
        if os.path.isfile(os.path.join(run_dir, rundir.RESULTS)):
            try:  # metadata only: a damaged results.json does not stop the model loading
                rec.results = rundir.load_results(run_dir)
            except RunError:
                rec.results = None
        return rec

    def __repr__(self) -> str:
        name = (self.info.get("model") or {}).get("name") or type(self.model).__name__
        choice = self.precision_choice
        auto = f"{choice.label()} (chosen by auto)" if choice is not None else self.precision
        served = f", served in {auto}" if auto != "fp32" else ""
        where = (  # a run directory that is gone (vaecf.fit's temporary one) is no source
            f"from run {self.source}" if self.source and rundir.is_run(self.source) else "in memory"
        )
        return f"Recommender({name}, {len(self.items):,} items{served}, {where})"

    def save(self, run_dir: str | os.PathLike) -> None:
        """Write this recommender as a run directory (config, weights, vocabulary, item names,
        popularity, results), all at once: `run_dir` is replaced only once it is complete.
        `vaecf serve/score/export --run run_dir` and `Recommender.load` read it."""
        from pathlib import Path

        import polars as pl

        from vaecf.storage.safewrite import atomic_dir, atomic_file, write_json
        from vaecf.storage.writelock import writer_lock

        if self.precision not in ("fp32", "tf32"):
            raise ConfigError(
                f"this recommender serves a {self.precision} copy of the model; save one "
                "loaded in fp32 (the run keeps full-precision weights)"
            )
        cfg = self.info
        if not {"model", "train", "data"} <= set(cfg):
            raise ConfigError("save needs the run's config: load the recommender from a run")
        out = Path(run_dir)
        if out.exists() and not rundir.is_run(out) and any(out.iterdir()):
            raise RunError(f"{out} exists and is not a run directory; choose another directory")
        with writer_lock(out, "Recommender.save"), atomic_dir(out) as tmp:
            rundir.write_config(
                tmp,
                cfg["model"]["name"],
                cfg["model"]["config"],
                cfg["train"],
                cfg["data"],
                cfg.get("vaecf_version"),
            )
            self.items.save(tmp / rundir.ITEMS)
            if self.names is not None:
                ids = [i for i in self.items.ids.to_list() if i in self.names]
                names = pl.DataFrame(
                    {"item_id": pl.Series(ids, dtype=self.items.ids.dtype)}
                ).with_columns(name=pl.Series([self.names[i] for i in ids], dtype=pl.String))
                with atomic_file(tmp / rundir.ITEM_NAMES) as f:
                    names.write_parquet(f)
            if self.popularity_counts is not None:
                rundir.save_popularity(tmp, self.popularity_counts)
            best = (self.results or {}).get("best_epoch")
            metrics = (self.results or {}).get("validation")
            rundir.save_model(tmp, self.model, epoch=best, metrics=metrics)
            if self.results is not None:
                write_json(tmp / rundir.RESULTS, self.results)

    def titles(self, item_ids: Iterable) -> list | None:
        """The name of each raw id (None where unnamed), or None when the run has no names."""
        if self.names is None:
            return None
        return [self.names.get(i) for i in item_ids]

    def _batch(self, rows: Sequence[list[int]]) -> SparseBatch:
        lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
        return self.batch_of(torch.tensor([i for r in rows for i in r], dtype=torch.long), lens)

    def batch_of(self, indices: torch.Tensor, lens: torch.Tensor) -> SparseBatch:
        """A batch of histories given as item indices (not raw ids): row r is the next
        `lens[r]` entries of `indices`, distinct and sorted."""
        return SparseBatch.of_flat(indices, lens, self.device)

    def _item_mask(self, allow: Iterable | None, deny: Iterable | None) -> torch.Tensor | None:
        """(n_items,) True where an item may not be recommended, or None for no filter."""
        if allow is not None and deny is not None:
            raise ConfigError("give an allow list or a deny list, not both")
        if allow is None and deny is None:
            return None
        idx = torch.tensor(self.items.index_of(allow if allow is not None else deny)[0])
        mask = torch.full((self.model.n_items,), allow is not None, dtype=torch.bool)
        mask[idx.long()] = allow is None
        return mask.to(self.device)

    @torch.no_grad()
    def scores(self, histories: Sequence[list[int]]) -> tuple[torch.Tensor, SparseBatch]:
        """(B, n_items) float32 scores of histories given as item indices (not raw ids)."""
        batch = self._batch(histories)
        s = self.score_fn(batch).float()
        if self.model.multinomial:
            s = torch.softmax(s, dim=1)
        return s, batch

    @torch.no_grad()
    def top_k(
        self,
        batch: SparseBatch,
        k: int,
        exclude_history: bool = True,
        mask: torch.Tensor | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(indices, scores, n, cold): each history's best min(k, n_items) items as (B, k')
        arrays, best first, of which the first n[r] of row r are candidates (the rest were
        excluded or filtered out). Scores of multinomial models are probabilities, softmax over
        all items taken before anything is excluded: exp(logit - logsumexp(logits)).
        cold[r]: row r has no item, so it is ranked by training popularity (scores: each item's
        share of the training interactions), when the run has the counts."""
        logits = self.score_fn(batch).float()
        lse = torch.logsumexp(logits, dim=1, keepdim=True) if self.model.multinomial else None
        cold = torch.zeros(batch.batch_size, dtype=torch.bool, device=logits.device)
        if self.popularity is not None:
            cold = torch.bincount(batch.row_ids, minlength=batch.batch_size) == 0
            logits[cold] = self.popularity
        if mask is not None:
            logits.masked_fill_(mask, -torch.inf)
        if exclude_history:
            logits[batch.row_ids, batch.indices] = -torch.inf
        top = logits.topk(min(k, self.model.n_items), dim=1)
        n = torch.isfinite(top.values).sum(dim=1)
        scores = top.values
        if lse is not None:
            scores = torch.where(cold[:, None], scores, torch.exp(scores - lse))
        return top.indices.cpu().numpy(), scores.cpu().numpy(), n.cpu().numpy(), cold.cpu().numpy()

    @torch.no_grad()
    def recommend_batch(
        self,
        histories: Sequence[Iterable],
        k: int = 10,
        exclude_history: bool = True,
        allow: Iterable | None = None,
        deny: Iterable | None = None,
        explain: bool = False,
        explain_top: int | None = EXPLAIN_TOP,
    ) -> list[Recommendation]:
        """One Recommendation per history (a list of raw item ids); `allow` (only these raw
        ids) or `deny` (never these) filter the candidates. `explain`: each item's `because`,
        the `explain_top` history items that led to it most (None: all), by weight."""
        if k < 1:
            raise ConfigError("k must be at least 1")
        mask = self._item_mask(allow, deny)
        known, unknown = (
            zip(*(self.items.index_of(h) for h in histories)) if histories else ((), ())
        )
        known = [sorted(set(r)) for r in known]
        if not known:
            return []
        if explain:
            check_work(known, min(k, self.model.n_items))
        idx, scores, n, cold = self.top_k(self._batch(known), k, exclude_history, mask)
        ids = self.items.array[idx]
        # ranked by popularity: a cold start, or (asked to explain) the popularity model
        popular = cold | (explain and self.model.family == "baseline")
        why = self._because(known, idx, n, popular, explain_top) if explain else {}
        out = []
        for r in range(len(known)):
            top = ids[r, : n[r]].tolist()
            fallback = "popular" if popular[r] else None
            scored = scores[r, : n[r]].tolist()
            rec = Recommendation(top, scored, list(unknown[r]), self.titles(top), fallback)
            rec.because = why.get(r)
            out.append(rec)
        return out

    def _because(self, known, idx, n, popular, top) -> dict[int, list]:
        """{row: each recommended item's [{"item_id", "weight"[, "title"]}], strongest first}
        for the rows not ranked by popularity, their weights in one pass."""
        rows = [r for r in range(len(known)) if not popular[r] and n[r] and known[r]]
        hist = [torch.tensor(known[r], dtype=torch.long) for r in rows]
        items = [torch.from_numpy(idx[r, : n[r]].copy()) for r in rows]
        out = {}
        # one copy for every leave-one-out chunk: a history's rows compared must be scored alike
        explained = weights(self.model, one_copy(self.score_fn), hist, items)
        for r, h, w in zip(rows, hist, explained):
            raw = self.items.id_of(h.tolist())
            names = self.titles(raw)
            titled = [{} if names is None else {"title": name} for name in names or raw]
            out[r] = [
                [{"item_id": raw[j], "weight": wt, **titled[j]} for j, wt in col]
                for col in strongest(w, top)
            ]
        return out

    def recommend_many(self, histories, k: int = 10, **filters):
        """Recommendations for many users at once (scored in one batch): `histories` is a
        mapping {user: raw item ids} (returns {user: Recommendation}) or a sequence of
        histories (returns a list, in order)."""
        if isinstance(histories, Mapping):
            users = list(histories)
            recs = self.recommend_batch([list(histories[u]) for u in users], k, **filters)
            return dict(zip(users, recs))
        return self.recommend_batch([list(h) for h in histories], k, **filters)

    def recommend(self, history: Iterable, k: int = 10, **filters) -> Recommendation:
        """Top-k raw item ids and scores for one history of raw item ids."""
        return self.recommend_batch([list(history)], k, **filters)[0]

    def user_histories(self, data: str | os.PathLike | None = None) -> UserHistories:
        """The users of the prepared dataset the run was trained on (read once, on first use);
        `data`: that dataset's directory, where it has moved since. DataError, in words, when
        the dataset is gone or is not the run's."""
        key = None if data is None else os.path.abspath(data)
        with self._histories_lock:
            if self._histories is None or self._histories[0] != key:
                users = run_histories(self.info.get("data") or {}, data)
                if users.rows.shape[1] != len(self.items):
                    raise DataError(
                        f"{users.path} has {users.rows.shape[1]} items, the model "
                        f"{len(self.items)}: it is not the run's dataset"
                    )
                self._histories = (key, users)
            return self._histories[1]

    def user_history(self, user, data: str | os.PathLike | None = None) -> list:
        """The raw item ids of `user`'s history in the run's data: a training user's training
        items, a held-out user's fold-in items (never their held-out targets). The id is
        matched as the data spells it (an integer-id dataset takes 42 or "42");
        `vaecf.errors.UnknownUserError` when the data has no such user."""
        return self.items.id_of(self.user_histories(data).find(user)[1])

    def recommend_user(
        self, user, k: int = 10, data: str | os.PathLike | None = None, **filters
    ) -> Recommendation:
        """Top-k raw item ids and scores for a user of the run's data, from their history
        there (`user_history`), which is not recommended back. UnknownUserError for a user the
        data does not hold, DataError when the run's dataset is gone (`data`: where it is)."""
        return self.recommend(self.user_history(user, data), k, **filters)

    def search(self, query: str, limit: int = 20) -> list[tuple]:
        """Items whose id is `query`, then items whose name holds every word of it (any case),
        the most popular in training first: [(raw id, name or None)], at most `limit`."""
        import polars as pl

        words = query.lower().split()[:8]  # bounded work per query
        if not words or limit < 1:
            return []
        found: list = self.items.index_of([query.strip()])[0]  # an id ("42" finds 42)
        if self.names is not None:
            if self._name_index is None:  # once per recommender: names in vocabulary order
                names = [self.names.get(i) for i in self.items.ids.to_list()]
                self._name_index = pl.Series(names, dtype=pl.String).str.to_lowercase()
            hit = self._name_index.is_not_null()
            for w in words:
                hit &= self._name_index.str.contains(w, literal=True)
            idx = np.flatnonzero(hit.fill_null(False).to_numpy())
            if self.popularity_counts is not None:
                idx = idx[np.argsort(-self.popularity_counts[idx], kind="stable")]
            found += [int(i) for i in idx[: limit + 1] if i not in found]
        ids = self.items.id_of(found[:limit])
        return list(zip(ids, self.titles(ids) or [None] * len(ids)))

    @torch.no_grad()
    def similar_items(self, item_id, k: int = 10) -> Recommendation:
        """The k items most similar to `item_id` under the model (cosine of its item vectors;
        see each model's `item_vectors`), best first, with the similarity as the score."""
        if k < 1:
            raise ConfigError("k must be at least 1")
        known, unknown = self.items.index_of([item_id])
        if unknown:
            return Recommendation([], [], unknown)
        if self._no_similar is not None:
            raise self._no_similar
        idx, sims = cosine_neighbours(self.item_vectors, known[0], k, self.item_norms)
        ids = self.items.id_of(idx)
        return Recommendation(ids, sims, titles=self.titles(ids))
