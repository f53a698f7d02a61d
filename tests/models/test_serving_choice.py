"""`--precision auto` (vaecf.models.serving_choice): the copy chosen is one whose top 10 agrees
with fp32's, the choice is cached and read back without timing, a damaged cache is written
again, and a Recommender loaded with "auto" serves the copy chosen. Which copy is fastest
depends on the machine: no test says which."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import vaecf
from vaecf import models
from vaecf.data.matrix import SparseBatch
from vaecf.models import serving_choice as sc
from vaecf.models import serving_pick as sp
from vaecf.models.serving import serving_copy
from vaecf.serve.fixtures import fresh_run

ALL = ["fp32", "bf16", "fp16", "int8"]
SMALL = {"hidden_dims": [32], "latent_dim": 8}


def model(seed: int = 0, n_items: int = 300, logit_scale: float = 1.0):
    torch.manual_seed(seed)
    m = models.build("multvae", n_items, SMALL)
    if logit_scale != 1.0:
        with torch.no_grad():
            for layer in m.modules():
                if isinstance(layer, torch.nn.Linear) and layer.out_features == n_items:
                    layer.weight.mul_(logit_scale)
    return m.eval()


def usable(choice) -> dict:
    return {c.precision: c for c in choice.candidates if c.refused is None}


def check_sound(choice, sizes) -> None:
    """Every copy it could have chosen was timed at every size and agrees with fp32; the
    chosen ones are among them (whichever this machine found fastest)."""
    ok = usable(choice)
    assert "fp32" in ok and choice.chosen in ok and choice.small in (None, *ok)
    for c in ok.values():
        assert len(c.batch_ms) == len(sizes) and all(ms > 0 for ms in c.batch_ms)
        assert c.agreement >= choice.min_agreement
    assert ok["fp32"].agreement == 1.0


def test_a_copy_whose_scores_overflow_is_never_chosen():
    """Output weights beyond fp16's range (65,504): the fp16 copy's scores are infinite, so it is
    refused for that, whatever its speed; the others still compete."""
    m = model(logit_scale=1e7)
    served, fn, choice = sc.auto_copy(m, (1, 8), precisions=ALL, cache=False)
    check_sound(choice, [1, 8])
    fp16 = next(c for c in choice.candidates if c.precision == "fp16")
    assert fp16.refused and "non-finite" in fp16.refused
    assert "fp16" not in (choice.chosen, choice.small) and choice.source == "measured"
    batch = SparseBatch.of_rows([[1, 2, 3]], served.device)
    assert torch.isfinite(fn(batch).float()).all()
    lines = choice.lines()
    assert lines[0].startswith(f"precision auto: {choice.label()} (measured in ")
    assert len(lines) == 1 + len(ALL) + len(choice.notes)  # a line per candidate, per note
    assert any(line.strip().startswith("fp16") and "refused: non-finite" in line for line in lines)


def test_a_tolerance_no_reduced_copy_meets_leaves_fp32():
    """A tolerance above what any reduced copy can reach (agreement 1.01): each is refused with
    its agreement, and fp32 (the reference, never refused) serves."""
    _, fn, choice = sc.auto_copy(model(), (1, 8), precisions=ALL, min_agreement=1.01, cache=False)
    assert choice.chosen == "fp32" and list(usable(choice)) == ["fp32"]
    for c in choice.candidates[1:]:
        assert c.refused and ("top-10 agreement" in c.refused or "not timed" in c.refused)


def test_a_model_without_an_item_layer_has_no_int8_candidate():
    torch.manual_seed(0)
    m = models.build("ease", 40)
    _, _, choice = sc.auto_copy(m, (1, 4), precisions=["fp32", "int8"], cache=False)
    int8 = choice.candidates[1]
    assert int8.precision == "int8" and "cannot be built" in int8.refused
    assert choice.chosen == "fp32"


def test_the_choice_is_cached_read_back_without_timing_and_rewritten_when_damaged(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("VAECF_HOME", str(tmp_path))
    m = model(seed=1)
    _, _, first = sc.auto_copy(copy.deepcopy(m), (1, 16))
    check_sound(first, [1, 16])
    assert first.source == "measured" and first.cache is not None
    files = list((tmp_path / "serving").iterdir())
    assert [str(f) for f in files] == [first.cache]
    # the same weights again (a restart): read back, nothing timed (the same figures)
    _, _, again = sc.auto_copy(copy.deepcopy(m), (1, 16))
    assert again.source == "cache" and again.cache == first.cache
    assert again.chosen == first.chosen and again.candidates == first.candidates
    assert again.lines()[0].startswith(f"precision auto: {first.label()} (timings read from ")
    # other weights, or other batch sizes: another key, measured
    _, _, other = sc.auto_copy(model(seed=2), (1, 16))
    assert other.source == "measured" and other.cache != first.cache
    _, _, sizes = sc.auto_copy(copy.deepcopy(m), (1, 32))
    assert sizes.source == "measured" and sizes.batch_sizes == [1, 32]
    # a damaged cache file is ignored and written again
    for damage in ("{not json", json.dumps({"key": "x"}), ""):
        files[0].write_text(damage)
        _, _, fresh = sc.auto_copy(copy.deepcopy(m), (1, 16))
        assert fresh.source == "measured" and fresh.cache == first.cache
        assert json.loads(files[0].read_text())["choice"]["chosen"] == fresh.chosen
    # one that names a copy it refused is not believed either
    cached = json.loads(files[0].read_text())
    cached["choice"]["chosen"] = "fp16-not-a-copy"
    files[0].write_text(json.dumps(cached))
    assert sc.read_cache(files[0], cached["key"]) is None


def test_timed_sizes_are_bounded_by_the_catalogue():
    assert sc.timed_sizes((1, 256), 60) == [1, 256]
    assert sc.timed_sizes((1, 256), 20_108) == [1, sc.TIMED_SCORES // 20_108]  # 104
    assert sc.timed_sizes((1024,), 10**8) == [1]
    hist = sc.sample_histories(30, 50, popularity=list(range(30)))
    assert len(hist) == 50 and all(1 <= len(h) <= 29 and h == sorted(set(h)) for h in hist)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    return fresh_run(root / "run", 120, "multvae", SMALL, list(range(1000, 1120)), seed=5)


def test_recommender_load_auto_serves_the_chosen_copy(run):
    rec = vaecf.Recommender.load(run, precision="auto", batch_sizes=[1, 8])
    choice = rec.precision_choice
    check_sound(choice, [1, 8])
    assert rec.precision == choice.chosen
    assert ("(chosen by auto)" in repr(rec)) and rec.recommend([1000, 1001], k=5).item_ids
    again = vaecf.Recommender.load(run, precision="auto", batch_sizes=[1, 8])
    assert again.precision_choice.source == "cache" and again.precision == rec.precision
    # given precisions are served as given, nothing chosen
    for p in ("fp32", "int8"):
        given = vaecf.Recommender.load(run, precision=p)
        assert given.precision == p and given.precision_choice is None
        assert "chosen by auto" not in repr(given)


def brute_force_rows(small, large, sizes) -> int:
    """How many histories a batch may hold with `small` faster than `large` at every size up to
    it, from each copy's time at every size (piecewise linear through the timed ones)."""

    def at(c, b: int, i: int) -> float:  # between the i-th and the next timed size
        lo, hi = sizes[i], sizes[i + 1]
        return c.batch_ms[i] + (c.batch_ms[i + 1] - c.batch_ms[i]) * (b - lo) / (hi - lo)

    rows = 0
    for b in range(1, sizes[-1]):
        i = max(j for j, s in enumerate(sizes) if s <= b)
        if at(small, b, i) >= at(large, b, i):
            break
        rows = b
    return rows


@pytest.mark.parametrize(
    "times, sizes, want",
    [
        # the Intel AMX machine (6,946 items): bf16 for a micro-batch, fp32 for a few histories
        (
            {"fp32": [0.381, 9.067], "bf16": [0.581, 2.864], "int8": [0.404, 4.132]},
            [1, 256],
            ("bf16", "fp32"),
        ),
        (
            {"fp32": [0.381, 0.909, 9.067], "bf16": [0.581, 0.692, 2.864]},
            [1, 16, 256],
            ("bf16", "fp32"),
        ),
        # one copy fastest at both sizes: no second copy
        ({"fp32": [1.0, 9.0], "int8": [0.6, 4.0]}, [1, 256], ("int8", None)),
        # the other copy only 5% faster for one history: not worth a second copy
        ({"fp32": [0.95, 9.0], "bf16": [1.0, 3.0]}, [1, 256], ("bf16", None)),
        # 10% faster for one history, but by microseconds (EASE): not worth a second B
        ({"fp32": [0.009, 3.1], "fp16": [0.011, 1.0]}, [1, 256], ("fp16", None)),
        # a reduced copy 5% faster than fp32 does not displace it
        ({"fp32": [1.0, 3.0], "bf16": [1.2, 2.85]}, [1, 256], ("fp32", None)),
        # one size timed (`vaecf score`): one copy
        ({"fp32": [9.0], "bf16": [3.0]}, [256], ("bf16", None)),
    ],
)
def test_pick_keeps_a_second_copy_for_the_small_batches_it_answers_faster(times, sizes, want):
    cands = [sp.Candidate(p, ms, 1.0) for p, ms in times.items()]
    cands.append(sp.Candidate("fp16", refused="not timed"))  # refused: never picked
    chosen, small, rows = sp.pick(cands, sizes)
    assert (chosen, small) == want
    if small is None:
        assert rows == 0
        return
    by = {c.precision: c for c in cands}
    assert rows == brute_force_rows(by[small], by[chosen], sizes) >= 1


def test_a_choice_of_two_copies_scores_small_batches_with_the_small_one(tmp_path, monkeypatch):
    """Whatever the timings, a choice of int8 with fp32 for batches of up to 3 histories scores a
    batch of 1-3 as the fp32 copy does and a batch of 4 or more as the int8 copy does (and
    what needs one copy, int8 at any size); it is cached, read back as it was, shown in its
    lines, and a damaged one is not believed."""
    monkeypatch.setenv("VAECF_HOME", str(tmp_path))
    monkeypatch.setattr(sc, "pick", lambda cands, sizes: ("int8", "fp32", 3))
    m = model(seed=3)
    fp32_fn = serving_copy(copy.deepcopy(m), "fp32")[1]
    int8_fn = serving_copy(copy.deepcopy(m), "int8")[1]
    _, fn, choice = sc.auto_copy(copy.deepcopy(m), (1, 8), precisions=["fp32", "int8"])
    assert (choice.chosen, choice.small, choice.small_rows) == ("int8", "fp32", 3)
    hist = sc.sample_histories(m.n_items, 8, seed=4)
    with torch.no_grad():
        for n in range(1, 9):
            batch = SparseBatch.of_rows(hist[:n], "cpu")
            want = (fp32_fn if n <= 3 else int8_fn)(batch)
            assert torch.equal(fn(batch), want), n
        # what must come from one copy (an explanation's chunks) takes the int8 one at any size
        one = SparseBatch.of_rows(hist[:1], "cpu")
        assert torch.equal(sc.one_copy(fn)(one), int8_fn(one))
        assert sc.one_copy(int8_fn) is int8_fn
    assert choice.label() == "int8, fp32 for batches of up to 3"
    lines = choice.lines()
    assert lines[0].startswith("precision auto: int8, fp32 for batches of up to 3 (measured in")
    assert any(x.strip().startswith("fp32") and x.endswith("chosen for batches of up to 3")
               for x in lines)  # fmt: skip
    assert any(x.strip().startswith("int8") and x.endswith("<- chosen") for x in lines)
    _, again_fn, again = sc.auto_copy(copy.deepcopy(m), (1, 8), precisions=["fp32", "int8"])
    assert again.source == "cache" and (again.small, again.small_rows) == ("fp32", 3)
    batch = SparseBatch.of_rows(hist[:2], "cpu")
    with torch.no_grad():
        assert torch.equal(again_fn(batch), fp32_fn(batch))
    # memory too short for a second copy: the cached choice serves int8 alone, and says so;
    # without a cached choice nothing is measured, fp32 serves
    monkeypatch.setattr(sc, "available_bytes", lambda device: 1)
    _, short_fn, short = sc.auto_copy(copy.deepcopy(m), (1, 8), precisions=["fp32", "int8"])
    assert (short.source, short.chosen, short.small, short.small_rows) == ("cache", "int8", None, 0)
    assert short.notes[-1].startswith("fp32 not kept for small batches: a second copy of the")
    with torch.no_grad():
        assert torch.equal(short_fn(batch), int8_fn(batch))
    _, _, none = sc.auto_copy(model(seed=4), (1, 8), precisions=["fp32", "int8"])
    assert none.chosen == "fp32" and none.candidates == [] and none.small is None
    assert (
        none.notes[0].startswith("not measured: a second copy") and "serving fp32" in none.notes[0]
    )
    cached = json.loads(open(choice.cache).read())
    for small, rows in (("fp16", 3), ("fp32", 8), ("fp32", 0)):  # refused; as many as timed; none
        d = {**cached["choice"], "small": small, "small_rows": rows}
        with pytest.raises(ValueError):
            sp.PrecisionChoice.from_dict(d)
