"""Every parser under generated input (Hypothesis): a file parses as its format says, or raises a
DataError naming the file and line; the CLI turns such an error into exit 2 and one message.

The generators and the property live in fuzzkit.py (shared with benchmarks/drills.py, which runs
>= 10,000 inputs per parser); here each parser gets a small share plus exact known answers.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzzkit import CASES, check, fuzz
from tests.helpers import cli_in_process
from vaecf.data import parsers, sources

N = 120  # generated inputs per parser in the suite


@pytest.mark.parametrize("name", [*CASES, "parquet"])
def test_generated_inputs_parse_or_raise_a_data_error(name):
    t = fuzz(name, N, seed=20261123)
    assert t.failures == 0, "\n\n".join(t.examples)
    assert t.inputs >= N // 2 and t.rejected > 0  # the generator does reach malformed files


FUZZ = settings(
    max_examples=40,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
ids = st.integers(0, 10**9)


@FUZZ
@given(st.lists(st.tuples(ids, ids, st.integers(1, 5), ids), min_size=1, max_size=20))
def test_ml1m_rows_parse_exactly(tmp_path, rows):
    path = tmp_path / "ratings.dat"
    path.write_text("".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows))
    df = parsers.read_movielens_dat([path])[0]
    assert df.rows() == [(u, i, float(r), float(t)) for u, i, r, t in rows]


@FUZZ
@given(
    st.lists(st.tuples(ids, ids, st.sampled_from([0.5, 3.0, 4.5]), ids), min_size=1, max_size=20),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
)
def test_movielens_csv_with_crlf_and_bom_parses_exactly(tmp_path, rows, eol, bom):
    path = tmp_path / "ratings.csv"
    text = eol.join(["userId,movieId,rating,timestamp", *(",".join(map(str, r)) for r in rows)])
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + (text + eol).encode())
    df = parsers.read_movielens_csv([path])[0]
    assert df.rows() == [(u, i, r, float(t)) for u, i, r, t in rows]


@FUZZ
@given(
    st.lists(
        st.tuples(ids, st.lists(st.tuples(ids, st.integers(1, 5)), min_size=1, max_size=5)),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(["\n", "\r\n"]),
)
def test_netflix_blocks_parse_exactly(tmp_path, blocks, eol):
    path = tmp_path / "combined_data_1.txt"
    lines = []
    for movie, rows in blocks:
        lines.append(f"{movie}:")
        lines += [f"{c},{r},2005-09-06" for c, r in rows]
    path.write_text(eol.join(lines) + eol, newline="")
    df = parsers.read_netflix([path])[0]
    assert df.rows() == [(c, m, r) for m, rows in blocks for c, r in rows]


@FUZZ
@given(
    st.lists(
        st.tuples(st.text("0123456789abcdef", min_size=1, max_size=8), st.integers(0, 10**6)),
        min_size=1,
        max_size=20,
    )
)
def test_msd_triplets_parse_exactly(tmp_path, rows):
    path = tmp_path / "train_triplets.txt"
    path.write_text("".join(f"u{u}\ts{u}\t{p}\n" for u, p in rows))
    df = parsers.read_msd([path])[0]
    assert df.rows() == [(f"u{u}", f"s{u}", float(p)) for u, p in rows]


@pytest.mark.parametrize(
    "text, where",
    [
        ("1::2::3::4\n1::2::nan::4\n", "line 2"),
        ("1::2::3::4\n1::2::-3::4\n", "line 2"),
        ("1::2::3::4\n\n1::2::3::4\n", "line 2"),  # a blank line in the middle
        ("1::2::3::4\n" + "9" * 30 + "::2::3::4\n", "line 2"),
        ("1::2::3\n", "line 1"),
        ("1::2::3::4::5\n", "line 1"),
        ("\ufeff", "holds no rows"),  # a byte-order mark and nothing else
    ],
)
def test_ml1m_errors_name_the_line(tmp_path, text, where):
    path = tmp_path / "ratings.dat"
    path.write_text(text)
    with pytest.raises(sources.DataError, match=where) as e:
        parsers.read_movielens_dat([path])
    assert str(path) in str(e.value)


def test_latin1_bytes_name_the_line(tmp_path):
    path = tmp_path / "ratings.dat"
    path.write_bytes("1::2::3::4\n2::3::4::5\nBj\xf6rk::1::2::3\n".encode("latin-1"))
    with pytest.raises(sources.DataError, match="line 3: not valid UTF-8"):
        parsers.read_movielens_dat([path])


def test_csv_row_with_extra_fields_names_its_line(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("u,i,r\n1,2,3\n4,5,6,7\n")
    with pytest.raises(sources.DataError, match="line 3: 4 field"):
        sources.read_table(path, "u", "i", "r")


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_csv_non_finite_rating_is_refused(tmp_path, bad):
    path = tmp_path / "x.csv"
    path.write_text(f"u,i,r\n1,2,3\n4,5,{bad}\n")
    with pytest.raises(sources.DataError, match="data row 2"):
        sources.read_table(path, "u", "i", "r")


def test_parquet_of_float_ids_is_refused(tmp_path):
    path = tmp_path / "x.parquet"
    pl.DataFrame({"u": [1.5, 2.0], "i": [1, 2]}).write_parquet(path)
    with pytest.raises(sources.DataError, match="ids must be integers or text"):
        sources.read_table(path, "u", "i")


MALFORMED = {
    "ml-1m": ("ratings.dat", b"1::2::3::4\n1::x::3::4\n"),
    "ml-20m": ("ratings.csv", b"userId,movieId,rating,timestamp\n1,2,NaN,4\n"),
    "netflix": ("mv_0000001.txt", b"1:\n5,3\n"),
    "lastfm-360k": ("usersha1-artmbid-artname-plays.tsv", b"\xff\xfe\x00garbage\n"),
    "pinterest": ("pinterest-20.train.rating", b"1\t2\t1\n"),
    "msd": ("train_triplets.txt", b"u\ts\t-4\n"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_cli_maps_parser_errors_to_exit_2_and_one_message(tmp_path, name):
    fname, data = MALFORMED[name]
    src = tmp_path / fname
    src.write_bytes(data)
    extra = ["--protocol", "liang"] if name != "netflix" else []
    args = ["prepare", name, "--source", src, "--root", tmp_path / "home", "--quiet", *extra]
    rc, err = cli_in_process(args)
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vaecf prepare: error:"), err
    assert str(src) in lines[0]


def test_cli_csv_error_is_exit_2(tmp_path):
    src = tmp_path / "x.csv"
    src.write_bytes(b"u,i\n1,2\n\xe9,3\n")
    rc, err = cli_in_process(["prepare", "csv", "--path", src, "--user-col", "u", "--item-col",
                              "i", "--heldout-users", 1, "--out", tmp_path / "out"])  # fmt: skip
    assert rc == 2 and "line 3" in err and str(src) in err and "Traceback" not in err


def test_check_rejects_a_parser_that_lets_a_null_through(tmp_path, monkeypatch):
    # the property itself can fail: a parser returning a null id breaks it
    path = Path(tmp_path / "train_triplets.txt")
    path.write_text("u\ts\t1\n")
    monkeypatch.setitem(
        CASES,
        "msd",
        CASES["msd"].__class__(
            "msd", "t.txt", lambda p: pl.DataFrame({"user_id": [None], "item_id": ["s"]}), (), ""
        ),
    )
    with pytest.raises(AssertionError, match="null"):
        check("msd", path)


@pytest.mark.parametrize("parser", ["read_movielens_dat", "read_netflix", "read_lastfm"])
def test_unit_separator_byte_names_its_line(tmp_path, parser):
    # these parsers read whole lines with 0x1f as the separator; one in the data was a traceback
    path = tmp_path / "f.txt"
    path.write_bytes(b"1::2::3::4\n1::2\x1f::3::4\n")
    with pytest.raises(sources.DataError, match="line 2: holds a control character"):
        getattr(parsers, parser)([path])
