"""Recommendation verbs: recommend (top-k for a history or a user of the run's data, with
`--explain`: the history items that led to each) and similar (an item's nearest items)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from vaecf.cli.common import print_json, printable
from vaecf.cli.options import add_settings, from_args
from vaecf.config.settings import Scoring, setting
from vaecf.errors import VaecfError


# -- recommend ----------------------------------------------------------------------------------
@dataclass
class Ranking(Scoring):
    """recommend and similar: how many items, on which device (in fp32)."""

    k: int = setting(10, "how many items", flag="-k")


def cmd_recommend(a) -> int:
    from vaecf.recommender import Recommender

    filters = {}
    for key in ("allow", "deny"):
        if getattr(a, key):
            filters[key] = [s.strip() for s in getattr(a, key).split(",") if s.strip()]
    s = from_args(Ranking, a)
    rec = Recommender.load(a.run, device=s.device)
    if a.user is not None:  # the user's history in the run's data, excluded from the answer
        history = rec.user_history(a.user.strip(), data=a.data)
        n = len(history)
        if not a.json:
            print(
                f"user {printable(a.user.strip())}: {n} item{'s' * (n != 1)} in the history",
                file=sys.stderr,
            )
    else:
        if a.data is not None:
            raise VaecfError("--data goes with --user (where the run's users are); drop it")
        history = [s.strip() for s in a.items.split(",") if s.strip()]
    r = rec.recommend(history, k=s.k, explain=a.explain, **filters)
    if a.json:
        print_json(r.to_dict())
        return 0
    if r.unknown:  # the first ten: a long list of them is no use on a terminal
        more = f", and {len(r.unknown) - 10:,} more" if len(r.unknown) > 10 else ""
        shown = ", ".join(map(printable, r.unknown[:10]))
        print(f"unknown item ids (ignored): {shown}{more}", file=sys.stderr)
    if not r.item_ids:
        print(
            "no item left to recommend: the history (with --allow/--deny) covers every item "
            "the model knows",
            file=sys.stderr,
        )
    if r.fallback == "popular":
        print(
            "no item of the history is known to the model: the most popular training items "
            "(score: share of the training interactions)",
            file=sys.stderr,
        )
    _print_ranked(r)
    return 0


def _print_ranked(r) -> None:
    """rank, item id, score and, when the run has names, title; where explained, a line under
    each item: the history items that led to it, by title where named, with their weights."""
    titles = r.titles if r.titles is not None else [None] * len(r.item_ids)
    head = f"{'rank':>4s}  {'item_id':>12s}  {'score':>10s}"
    print(head + ("  title" if r.titles is not None else ""))
    for i, (item, s, t) in enumerate(zip(r.item_ids, r.scores, titles), 1):
        line = f"{i:4d}  {printable(item):>12s}  {s:10.5g}"
        print(
            line + (f"  {printable(t) if t is not None else '-'}" if r.titles is not None else "")
        )
        if r.because is not None:
            liked = ", ".join(
                f"{printable(w.get('title') or w['item_id'])} ({w['weight']:.3g})"
                for w in r.because[i - 1]
            )
            print(f"{'':20s}because you liked {liked or '-'}")


def cmd_similar(a) -> int:
    from vaecf.recommender import Recommender

    s = from_args(Ranking, a)
    rec = Recommender.load(a.run, device=s.device)
    r = rec.similar_items(a.item, k=s.k)
    if r.unknown:
        raise VaecfError(f"item {a.item!r} is not in the model's vocabulary")
    if a.json:
        print_json(r.to_dict())
        return 0
    if rec.names is not None:
        known = rec.items.id_of(rec.items.index_of([a.item])[0])[0]
        print(f"most similar to {printable(known)}: {printable(rec.names.get(known) or '-')}")
    _print_ranked(r)
    return 0


def register(sub) -> None:
    _register_recommend(sub)
    _register_similar(sub)


def _register_recommend(sub) -> None:
    pr = sub.add_parser(
        "recommend", help="top-k items for a history of item ids, or for a user of the run's data"
    )
    pr.add_argument("run", help="run directory written by `vaecf train`")
    who = pr.add_mutually_exclusive_group(required=True)
    who.add_argument("--items", help="comma-separated raw item ids (the history)")
    who.add_argument(
        "--user",
        help="a raw user id of the run's prepared dataset: their items there are the history "
        "(a held-out user's fold-in items, never their targets) and are not recommended back",
    )
    pr.add_argument(
        "--data",
        help="with --user: the run's prepared dataset, where it has moved (unset: the one in "
        "the run's config.json)",
    )
    add_settings(pr, Ranking, skip=("precision",))
    pr.add_argument("--allow", help="comma-separated raw item ids: recommend only among these")
    pr.add_argument("--deny", help="comma-separated raw item ids: never recommend these")
    pr.add_argument(
        "--explain",
        action="store_true",
        help="say which history items led to each recommendation, strongest first, with weights "
        "(a linear model's exact share of the score; else how much the score falls without it)",
    )
    pr.add_argument(
        "--json",
        action="store_true",
        help="print JSON: items with scores (with --explain, each item's because: item_id, "
        "weight), unknown",
    )
    pr.set_defaults(fn=cmd_recommend)


def _register_similar(sub) -> None:
    ps = sub.add_parser("similar", help="the items most similar to an item, under a model")
    ps.add_argument("run", help="run directory written by `vaecf train`")
    ps.add_argument("--item", required=True, help="a raw item id")
    add_settings(ps, Ranking, skip=("precision",))
    ps.add_argument("--json", action="store_true", help="print JSON: items with similarities")
    ps.set_defaults(fn=cmd_similar)
