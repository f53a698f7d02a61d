"""`vaecf info RUN`: a run's card (vaecf.rundir.card, what GET /v1/model and the page show)."""

from __future__ import annotations

import textwrap

from vaecf.cli.common import print_json


def _pairs(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items())


def _metrics(m: dict) -> str:
    shown = " · ".join(f"{k} {v:.4f}" for k, v in m.items() if "@" in k)
    return shown + (f" ({m['n_users']} users)" if m.get("n_users") else "")


def print_card(run_dir: str, as_json: bool) -> int:
    from vaecf import rundir
    from vaecf.errors import RunError

    cfg = rundir.load_config(run_dir)
    try:
        results = rundir.load_results(run_dir)
    except RunError:  # not finished, or damaged: the card without metrics
        results = None
    card = rundir.card(cfg, results)
    if as_json:
        print_json(card)
        return 0
    if card["closed_form"]:
        how = "fitted in closed form (no epochs)"
    elif card["best_epoch"] is not None:
        how = f"best epoch {card['best_epoch']} of {card['epochs']}"
    else:
        how = "not finished"
    d = card["data"]
    lines = [
        f"{run_dir}: {card['title']} ({card['model']}, {card['family']}), {how}",
        ("settings", _pairs(card["settings"]) or "none"),
        ("training", _pairs(card["train"])),
        (
            "data",
            f"{d.get('n_items')} items, {d.get('n_train_users')} training users, "
            f"fingerprint {d.get('fingerprint')} ({d.get('path')})",
        ),
    ]
    for split in ("validation", "test"):
        if card[split]:
            lines.append((split, _metrics(card[split])))
    if results is None:
        lines.append(("results", f"none yet ({rundir.RESULTS} missing or unreadable)"))
    print(lines[0])
    for label, text in lines[1:]:
        wrapped = textwrap.wrap(text, 96 - 14, break_long_words=False, break_on_hyphens=False)
        print(f"  {label:<12s}" + f"\n{'':14s}".join(wrapped))
    return 0
