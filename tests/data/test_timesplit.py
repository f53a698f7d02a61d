"""The time protocols (vaecf.data.timesplit) on hand-worked frames: the global cut, leave-last-
out, ties in file order, the filters counted on the past, time columns found by name and read
as numbers or dates, and the errors in one line."""

import numpy as np
import polars as pl
import pytest

import vaecf
from tests.helpers import cli_in_process
from vaecf.errors import DataError


def frame(rows):
    """(user, item, time) rows -> the frame prepare_frame reads."""
    u, i, t = zip(*rows)
    return pl.DataFrame({"user_id": list(u), "item_id": list(i), "time": list(map(float, t))})


def dense(ds, split):
    return ds.split(split).toarray().astype(int).tolist()


def prep(tmp_path, rows, **kw):
    settings = vaecf.PrepareSettings(min_user_items=1, **kw)
    return vaecf.prepare_frame(frame(rows), tmp_path / "p", settings)


def test_a_period_without_scorable_users_is_refused(tmp_path):
    # validation: user 1's e (not a training item), test: user 6's z (no history)
    rows = [(1, "a", 1), (2, "b", 2), (1, "b", 3), (2, "a", 4), (1, "c", 5), (2, "c", 6),
            (1, "e", 7), (6, "z", 8)]  # fmt: skip
    with pytest.raises(DataError, match="no user of the (validation|test) period has a history"):
        prep(tmp_path, rows, protocol="temporal", validation_share=0.1, test_share=0.1)


ROWS2 = [
    (1, "a", 1), (1, "b", 2), (2, "a", 3), (2, "c", 4), (3, "b", 5), (3, "c", 6),
    (1, "c", 7),  # validation: user 1 (history a b)
    (2, "b", 8),  # test: user 2 (history a c)
    (3, "a", 9), (4, "c", 10),  # test: user 3 (history b c), user 4 (no history: not scored)
]  # fmt: skip


def test_temporal_scores_each_period_on_the_history_before_it(tmp_path):
    ds = prep(tmp_path, ROWS2, protocol="temporal", validation_share=0.1, test_share=0.3)
    c = ds.manifest["counts"]
    assert ds.items.ids.to_list() == ["a", "b", "c"]
    assert dense(ds, "train") == [[1, 1, 0], [1, 0, 1], [0, 1, 1]]  # 7..10 never train
    assert dense(ds, "validation_tr") == [[1, 1, 0]] and dense(ds, "validation_te") == [[0, 0, 1]]
    # test histories hold everything before the test period: user 2's a c, user 3's b c
    assert dense(ds, "test_tr") == [[1, 0, 1], [0, 1, 1]]
    assert dense(ds, "test_te") == [[0, 1, 0], [1, 0, 0]]
    assert c["n_test_users_without_history"] == 1
    users = ds.users
    assert users.filter(pl.col("split") == "test").get_column("user_id").to_list() == [2, 3]


def test_leave_last_out_by_hand(tmp_path):
    rows = [(1, "a", 5), (1, "b", 1), (1, "c", 3), (1, "d", 4), (2, "a", 2), (2, "b", 6),
            (2, "c", 7), (2, "d", 8), (3, "b", 9), (3, "a", 10)]  # fmt: skip
    ds = prep(tmp_path, rows, protocol="last", last_n=1)
    # user 1 in time order b c d a: train b c, validation d, test a; user 2: a b | c | d;
    # user 3 has 2 < 3 items: all of them train
    assert ds.items.ids.to_list() == ["b", "a", "c"]  # the training rows' items, in time order
    assert dense(ds, "train") == [[1, 0, 1], [1, 1, 0], [1, 1, 0]]
    # d is no training item: user 1's validation target is dropped; user 2's c is scored
    assert dense(ds, "validation_tr") == [[1, 1, 0]] and dense(ds, "validation_te") == [[0, 0, 1]]
    # test histories add the validation targets: user 1 b c (d unknown), user 2 a b c
    assert dense(ds, "test_tr") == [[1, 0, 1]]
    assert dense(ds, "test_te") == [[0, 1, 0]]  # user 1's a; user 2's d is no training item


def test_ties_in_time_keep_the_file_order(tmp_path):
    # one time for all: the last 20% in file order are the test period, the 10% before validation
    pairs = [(1, "a"), (1, "b"), (2, "a"), (2, "b"), (3, "a"), (3, "c"), (2, "c"), (1, "c"),
             (3, "b"), (1, "d")]  # fmt: skip
    ds = prep(tmp_path, [(u, it, 7) for u, it in pairs], protocol="temporal",
              validation_share=0.1, test_share=0.2)  # fmt: skip
    counts = ds.manifest["counts"]
    assert counts["n_train_period_pairs"] == 7 and counts["n_test_period_pairs"] == 2
    assert ds.items.ids.to_list() == ["a", "b", "c"]
    assert dense(ds, "validation_te") == [[0, 0, 1]]  # user 1's c
    assert dense(ds, "test_te") == [[0, 1, 0]]  # user 3's b (user 1's d is no training item)


def test_filters_count_the_past_only(tmp_path):
    """Item x is popular only in the test period: min_item_users counts training users, so it is
    dropped however many users it has later."""
    rng = np.random.default_rng(0)
    rows, t, had = [], 0, {}
    for u in range(30):
        had[u] = [str(it) for it in rng.choice(list("abcdef"), 3, replace=False)]
        rows += [(u, it, t := t + 1) for it in had[u]]
    rows.append((0, "x", t := t + 1))  # x's one training user
    for u in range(1, 30):  # the future: everyone takes x, and an item they had not had
        new = next(it for it in "abcdef" if it not in had[u])
        rows += [(u, "x", t := t + 1), (u, new, t := t + 1)]
    ds = prep(tmp_path, rows, protocol="temporal", validation_share=0.13, test_share=0.25,
              min_item_users=2)  # fmt: skip
    # the training period held x once (user 0): too few users, so its row went with it
    assert ds.manifest["counts"]["n_train_period_pairs"] == 90
    assert "x" not in ds.items.ids.to_list()


def test_time_columns_are_found_by_name_and_read_as_numbers_or_dates(tmp_path):
    f = tmp_path / "r.csv"
    lines = ["customer,product,event_time"]
    for k in range(40):
        lines.append(f"u{k % 8},i{k % 5 + (k // 8)},2024-01-{k % 28 + 1:02d}T{k % 24:02d}:00:00")
    f.write_text("\n".join(lines) + "\n")
    ds = vaecf.prepare_csv(f, tmp_path / "out", settings=vaecf.PrepareSettings(
        protocol="temporal", min_user_items=1, validation_share=0.2, test_share=0.2))  # fmt: skip
    assert ds.manifest["source"]["columns"]["time"] == "event_time"
    assert ds.manifest["counts"]["n_test_users"] > 0


def test_no_time_column_is_one_line_naming_what_was_looked_for(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("user,item\n" + "".join(f"{u},{i}\n" for u in range(9) for i in range(5)))
    rc, err = cli_in_process(["prepare", "csv", "--path", f, "--out", tmp_path / "o",
                              "--protocol", "temporal"])  # fmt: skip
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "timestamp, time" in err and "--time-col" in err
    assert not (tmp_path / "o").exists()
    rc, err = cli_in_process(["prepare", "csv", "--path", f, "--out", tmp_path / "o",
                              "--time-col", "item"])  # fmt: skip
    assert rc == 2 and "--protocol temporal" in err


def test_a_bad_time_value_names_it(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("user,item,timestamp\n1,2,100\n1,3,soon\n")
    settings = vaecf.PrepareSettings(protocol="temporal", min_user_items=1)
    with pytest.raises(DataError, match="'soon' is not a time"):
        vaecf.prepare_csv(f, tmp_path / "o", settings=settings)


def test_the_paper_protocols_keep_their_fingerprints():
    """Settings added for the time protocols stay out of the fingerprint while unset: a dataset
    prepared before them (and the runs trained on it) keeps its fingerprint (the values below
    are vaecf's before the time protocols, at commit 3adc71e)."""
    from vaecf.data.prepare import fingerprint

    assert fingerprint(vaecf.PrepareSettings(), {"sha256": "x"}) == "3ad29b957f517d65"
    thesis = vaecf.PrepareSettings(protocol="thesis", min_rating=3.5)
    cols = {"user": "u", "item": "i", "rating": None}
    assert fingerprint(thesis, {"sha256": "y", "columns": cols}) == "85ad5311cf45acb2"
