"""sources.read_table: column selection, id typing, separators, formats and error messages."""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl
import pytest

from vaecf.data.columns import ITEM_NAMES, USER_NAMES, found_by_name, guess_column
from vaecf.data.separators import WHITESPACE, found_sep
from vaecf.data.sources import ITEM, RATING, USER, read_table
from vaecf.errors import DataError


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_integer_looking_ids_become_int64_in_file_order(tmp_path):
    path = _write(
        tmp_path / "r.csv",
        "userId,movieId,rating,timestamp\n10,300,4.5,1\n9,20,0.5,2\n100, 7 ,5,3\n9,300,3,4\n",
    )
    df = read_table(path, "userId", "movieId", "rating")
    assert df.columns == [USER, ITEM, RATING]
    assert df.schema == {USER: pl.Int64, ITEM: pl.Int64, RATING: pl.Float64}
    assert df.get_column(USER).to_list() == [10, 9, 100, 9]
    assert df.get_column(ITEM).to_list() == [300, 20, 7, 300]
    assert df.get_column(RATING).to_list() == [4.5, 0.5, 5.0, 3.0]


def test_mixed_ids_stay_strings(tmp_path):
    path = _write(tmp_path / "r.csv", "u,i\n1,a1\nu2,7\n3,b\n")
    df = read_table(path, "u", "i")
    assert df.columns == [USER, ITEM]
    assert df.schema == {USER: pl.String, ITEM: pl.String}
    assert df.get_column(USER).to_list() == ["1", "u2", "3"]
    assert df.get_column(ITEM).to_list() == ["a1", "7", "b"]


def test_user_and_item_typed_independently(tmp_path):
    path = _write(tmp_path / "r.csv", "u,i\n1,x\n2,y\n")
    df = read_table(path, "u", "i")
    assert df.schema == {USER: pl.Int64, ITEM: pl.String}


def test_float_looking_ids_are_not_truncated(tmp_path):
    path = _write(tmp_path / "r.csv", "u,i\n1.5,1\n1,2\n")
    df = read_table(path, "u", "i")
    assert df.schema[USER] == pl.String
    assert df.get_column(USER).to_list() == ["1.5", "1"]


def test_no_rating_column_without_rating_col(tmp_path):
    path = _write(tmp_path / "r.csv", "u,i,rating\n1,2,oops\n")
    df = read_table(path, "u", "i")  # the unused bad rating is never parsed
    assert df.columns == [USER, ITEM]


@pytest.mark.parametrize("suffix", [".tsv", ".TSV", ".tab"])
def test_tab_separator_inferred_from_suffix(tmp_path, suffix):
    path = _write(tmp_path / f"r{suffix}", "u\ti\tr\n1\t10\t4\n2\t11\t3.5\n")
    df = read_table(path, "u", "i", "r")
    assert df.to_dicts() == [
        {USER: 1, ITEM: 10, RATING: 4.0},
        {USER: 2, ITEM: 11, RATING: 3.5},
    ]


@pytest.mark.parametrize("sep", ["\t", "\\t", "tab"])
def test_explicit_tab_separator(tmp_path, sep):
    path = _write(tmp_path / "r.txt", "u\ti\n1\t10\n")
    assert read_table(path, "u", "i", sep=sep).to_dicts() == [{USER: 1, ITEM: 10}]


def test_explicit_other_separator_and_quotes(tmp_path):
    path = _write(tmp_path / "r.csv", 'u;i;r\n"a;b";1;2\nc;2;3\n')
    df = read_table(path, "u", "i", "r", sep=";")
    assert df.get_column(USER).to_list() == ["a;b", "c"]


def test_csv_default_separator_is_comma_and_wrong_sep_hints(tmp_path):
    path = _write(tmp_path / "r.csv", "u\ti\n1\t10\n")
    with pytest.raises(DataError) as e:
        read_table(path, "u", "i", sep=",")
    assert "--sep" in str(e.value) and "u\\ti" in str(e.value)
    assert read_table(path, "u", "i").get_column(ITEM).to_list() == [10]  # the tab found


def test_parquet_keeps_integer_ids_and_types_string_ids(tmp_path):
    ints = tmp_path / "ints.parquet"
    pl.DataFrame({"u": [3, 1, 2], "i": [9, 8, 7], "r": [1, 2, 3]}).write_parquet(ints)
    df = read_table(ints, "u", "i", "r")
    assert df.get_column(USER).dtype.is_integer() and df.get_column(USER).to_list() == [3, 1, 2]
    assert df.schema[RATING] == pl.Float64
    strs = tmp_path / "strs.pq"
    pl.DataFrame({"u": ["3", "1", "2"], "i": ["x", "y", "z"], "r": ["1", "2", "3"]}).write_parquet(
        strs
    )
    df = read_table(strs, "u", "i", "r")
    assert df.schema == {USER: pl.Int64, ITEM: pl.String, RATING: pl.Float64}


def test_parquet_missing_column_and_null_rating(tmp_path):
    path = tmp_path / "r.parquet"
    pl.DataFrame({"u": [1, 2], "i": [1, 2], "r": [4.0, None]}).write_parquet(path)
    with pytest.raises(DataError, match=r"the file has columns \['u', 'i', 'r'\]"):
        read_table(path, "user", "i")
    with pytest.raises(DataError, match="data row 2"):
        read_table(path, "u", "i", "r")


def test_not_a_parquet_file(tmp_path):
    path = _write(tmp_path / "r.parquet", "u,i\n1,2\n")
    with pytest.raises(DataError, match="cannot read"):
        read_table(path, "u", "i")


def test_missing_column_lists_columns(tmp_path):
    path = _write(tmp_path / "r.csv", "user,item,stars\n1,2,3\n")
    with pytest.raises(DataError) as e:
        read_table(path, "user", "item", "rating")
    msg = str(e.value)
    assert "['rating']" in msg and "['user', 'item', 'stars']" in msg and "rating_col=" in msg


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "is empty"),
        ("u,i,r\n", "header but no rows"),
        ("u,i,r\n1,2,4\n2,3,x\n", r"data row 2: 'r' is 'x'"),
        ("u,i,r\n1,2,4\n2,3,4\n3,4,\n", "data row 3"),
        ("u,i,r\n1,2,4\n,3,4\n", r"data row 2: empty 'u'"),
        ("u,i,r\n1,2,4\n2,3,4\n3,4,4\n4,,4\n", r"data row 4: empty 'i'"),
    ],
    ids=["empty", "header_only", "bad_rating", "empty_rating", "empty_user", "empty_item"],
)
def test_bad_csv_raises_data_error(tmp_path, text, match):
    path = _write(tmp_path / "r.csv", text)
    with pytest.raises(DataError, match=match):
        read_table(path, "u", "i", "r")


def test_missing_file(tmp_path):
    """A path that is missing, or a directory: the directory's data files are named."""
    with pytest.raises(DataError, match="does not exist"):
        read_table(tmp_path / "nope.csv", "u", "i")
    with pytest.raises(DataError, match="is a directory: pass the path of a file"):
        read_table(tmp_path, "u", "i")
    for name in ("ratings.csv", "movies.csv", "README.md"):
        (tmp_path / name).write_text("u,i\n1,2\n")
    with pytest.raises(DataError, match=r"directory \(it holds movies.csv, ratings.csv\): pass"):
        read_table(tmp_path, "u", "i")


@pytest.mark.parametrize("blank", ['""', "   "], ids=["quoted_empty", "whitespace"])
def test_blank_user_id_is_rejected(tmp_path, blank):
    path = _write(tmp_path / "r.csv", f"u,i\n1,10\n{blank},11\n2,12\n")
    with pytest.raises(DataError, match="data row 2"):
        read_table(path, "u", "i")


# -- files without a header, whitespace separators, any line ending -----------------------------
ROWS = [(1, 10, 3.0), (1, 11, 0.5), (2, 10, 4.0), (3, 12, 2.5)]
EXPECTED = pl.DataFrame(
    {USER: [r[0] for r in ROWS], ITEM: [r[1] for r in ROWS], RATING: [r[2] for r in ROWS]}
)
COLS = ["user", "item", "rating"]


def _text_file(tmp_path, name, text: str) -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("header", [True, False])
def test_every_line_ending_with_and_without_header(tmp_path, eol, header):
    lines = (["user,item,rating"] if header else []) + [f"{u},{i},{r}" for u, i, r in ROWS]
    p = _text_file(tmp_path, "r.csv", eol.join(lines) + eol)
    cols = None if header else COLS
    got = read_table(p, "user", "item", "rating", header=header, columns=cols)
    assert got.equals(EXPECTED)


def test_mixed_line_endings_and_whitespace_runs(tmp_path):
    # FilmTrust's shape: single spaces and CRLF, here mixed with tabs, runs, LF, bare CR, blanks
    text = "1 10 3\r\n1\t11   0.5\n\n  2 10\t 4 \r3 12 2.5\r\n\r\n"
    p = _text_file(tmp_path, "ratings.txt", text)
    got = read_table(p, "user", "item", "rating", sep="whitespace", header=False, columns=COLS)
    assert got.equals(EXPECTED)
    with_header = _text_file(tmp_path, "h.txt", "user  item rating\n" + text)
    assert read_table(with_header, "user", "item", "rating", sep="whitespace").equals(EXPECTED)


def test_headerless_errors_say_what_to_do(tmp_path):
    p = _text_file(tmp_path, "r.txt", "1 10 3\n1 11\n")
    with pytest.raises(DataError, match=r"line 2: 2 field\(s\) where 3 \(user, item, rating\)"):
        read_table(p, "user", "item", "rating", sep="whitespace", header=False, columns=COLS)
    with pytest.raises(DataError, match=r"header=False needs columns="):
        read_table(p, "user", "item", header=False)
    with pytest.raises(DataError, match="add header=False"):
        read_table(p, "user", "item", columns=COLS)
    with pytest.raises(DataError, match="distinct, non-empty"):
        read_table(p, "user", "item", header=False, columns=["user", "user"])
    c = _text_file(tmp_path, "r.csv", "1,10\n2,11\n")
    with pytest.raises(DataError, match=r"line 1: 2 field\(s\), but columns= names 3"):
        read_table(c, "user", "item", header=False, columns=COLS)
    c3 = _text_file(tmp_path, "r3.csv", "1,10,3\n2,11\n")
    with pytest.raises(DataError, match="data row 2: 'rating' is missing"):
        read_table(c3, "user", "item", "rating", header=False, columns=COLS)
    for bad in (":::", "ab", '"'):
        with pytest.raises(DataError, match="not a field separator"):
            read_table(c, "user", "item", sep=bad)
    pq = tmp_path / "r.parquet"
    EXPECTED.write_parquet(pq)
    with pytest.raises(DataError, match="Parquet and JSON name their columns"):
        read_table(pq, USER, ITEM, header=False, columns=COLS)


def test_one_character_separators(tmp_path):
    for sep, name in ((";", ";"), ("|", "|"), (" ", "space"), ("\t", "tab")):
        text = "".join(f"{u}{sep}{i}{sep}{r}\n" for u, i, r in ROWS)
        p = _text_file(tmp_path, "r.txt", text)
        got = read_table(p, "user", "item", "rating", sep=name, header=False, columns=COLS)
        assert got.equals(EXPECTED), sep


def test_filmtrust_raw_file_prepares_in_one_call(tmp_path):
    from vaecf.data.prepare import PrepareSettings, prepare_csv

    raw = Path(__file__).resolve().parents[3] / "shared" / "data" / "filmtrust" / "ratings.txt"
    if not raw.is_file():
        pytest.skip("the shared FilmTrust file is not here")
    settings = PrepareSettings(min_rating=3, heldout_users=150)
    ds = prepare_csv(raw, tmp_path / "ft", sep="whitespace", header=False, columns=COLS,
                     settings=settings)  # fmt: skip
    c = ds.manifest["counts"]
    # 35,497 rows (mixed CRLF/LF); user, item and rating found by their --columns names
    assert (c["n_rows"], c["n_users"], c["n_items"]) == (35497, 1119, 1478)
    assert ds.manifest["source"]["header_columns"] == COLS


def test_a_file_read_as_one_column_names_the_separator_that_splits_it(tmp_path):
    """A wrong separator reads each line as one field: the error names the one that splits it,
    as a flag and as a keyword (and following the advice reads the file)."""
    for text, words in (
        ("1 10 3\n2 11 4\n", "--sep whitespace (sep='whitespace')"),
        ("1\t10\t3\n2\t11\t4\n", "--sep '\\t' (sep='\\t')"),
        ("1;10;3\n2;11;4\n", "--sep ';' (sep=';')"),
    ):
        p = _text_file(tmp_path, "r.csv", text)
        with pytest.raises(DataError) as e:
            read_table(p, "user", "item", sep=",", header=False, columns=COLS)
        assert words in str(e.value), str(e.value)
        sep = words.split("(sep=")[1].rstrip(")").strip("'")  # "\\t" is read as a tab
        got = read_table(p, "user", "item", "rating", sep=sep, header=False, columns=COLS)
        assert got.height == 2
    headed = _text_file(tmp_path, "h.csv", "user;item\n1;10\n")
    with pytest.raises(DataError, match=r"its fields look separated by ';': pass --sep ';'"):
        read_table(headed, "user", "item", sep=",")


def test_the_separator_is_found_in_a_file_whose_first_line_has_no_comma(tmp_path):
    """Tab, ';', '|', '::' (MovieLens 1M's ratings.dat) and runs of spaces are found where no
    separator is given, with a header row or without; a comma in the first line keeps ','
    (a quoted field may hold the others); lines that split unevenly find nothing."""
    for sep in ("\t", ";", "|", "::", "  "):
        rows = "".join(f"{u}{sep}{i}{sep}{r}{sep}97830076{u}\n" for u, i, r in ROWS)
        p = _text_file(tmp_path, "r.dat", rows)
        assert found_sep(p) == (WHITESPACE if sep == "  " else sep)
        cols = [*COLS, "timestamp"]
        got = read_table(p, "user", "item", "rating", header=False, columns=cols)
        assert got.equals(EXPECTED), sep
        h = _text_file(tmp_path, "h.txt", sep.join(cols) + "\n" + rows)
        assert read_table(h, "user", "item", "rating").equals(EXPECTED), sep
    quoted = _text_file(tmp_path, "q.csv", 'user,item;name\n1,"a;b"\n')
    assert found_sep(quoted) is None and read_table(quoted, "user", "item;name").height == 1
    uneven = _text_file(tmp_path, "u.txt", "1;10;3\n2;11\n")
    assert found_sep(uneven) is None
    tsv = _text_file(tmp_path, "r.tsv", "user\titem\n1\t10\n")
    assert found_sep(tsv) is None and read_table(tsv, "user", "item").height == 1


def test_id_columns_are_found_by_name_in_order_of_preference():
    """Any case, with or without separators; user_id before customer_id whatever the file's
    order; the first of two spellings of one name; none known: refused with the columns."""
    assert guess_column(["customer_id", "User_ID", "x"], None, USER_NAMES, "user") == "User_ID"
    assert guess_column(["ts", "reviewerID", "asin"], None, ITEM_NAMES, "item") == "asin"
    assert guess_column(["Item", "ITEM"], None, ITEM_NAMES, "item") == "Item"
    assert guess_column(["a", "b"], "b", USER_NAMES, "user") == "b"
    with pytest.raises(DataError, match=r"user_col= .c. is not a column"):
        guess_column(["a", "b"], "c", USER_NAMES, "user")
    with pytest.raises(DataError, match=r"which column holds the items: item_col="):
        guess_column(["who", "what"], None, ITEM_NAMES, "item")


def test_the_line_naming_the_columns_found_by_name():
    used = {"user": "userId", "item": "movieId", "rating": None}
    assert found_by_name({"user": "userId"}, used) == "columns found by name: items 'movieId'"
    assert found_by_name({"user": "userId", "item": "movieId"}, used) == ""
    rated = {**used, "rating": "rating"}  # a rating column no min_rating reads: every row counts
    given = {"user": "userId", "item": "movieId", "rating": "rating"}
    said = found_by_name(given, rated, None, None)
    assert said.startswith("the ratings in 'rating' were not read: every row is a positive")
    assert said.endswith("prepare with min_rating=4 (or the threshold of your scale)")
    assert found_by_name(given, rated, None, 3.5) == ""


def test_compressed_text_and_json_read_like_the_plain_csv(tmp_path):
    """gzip, bzip2 and xz (found by their first bytes, whatever the name), JSON Lines and a
    JSON array of records all read to the plain CSV's frame; a compression suffix does not
    hide the kind (.tsv.xz is tab-separated, .jsonl.gz is JSON); zstd and zip are refused
    with the command that unpacks them."""
    import bz2
    import gzip
    import json
    import lzma

    text = "user,item,rating\n" + "".join(f"{u},{i},{r}\n" for u, i, r in ROWS)
    records = [dict(zip(COLS, row)) for row in ROWS]
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    files = {
        "r.csv.gz": gzip.compress(text.encode()),
        "r.csv.bz2": bz2.compress(text.replace("\n", "\r").encode()),  # old-Mac line ends
        "r.tsv.xz": lzma.compress(text.replace(",", "\t").encode()),
        "r.csv": gzip.compress(text.encode()),  # named plainly, gzip by its bytes
        "r.jsonl": lines,
        "r.jsonl.gz": gzip.compress(lines),
        "r.json": json.dumps(records).encode(),
    }
    for name, data in files.items():
        p = tmp_path / name
        p.write_bytes(data)
        got = read_table(p, "user", "item", "rating")
        assert got.equals(EXPECTED), name
    for magic, words in ((b"\x28\xb5\x2f\xfd", "zstd -d"), (b"PK\x03\x04", "as a zip archive")):
        p = tmp_path / "packed.csv"
        p.write_bytes(magic + bytes(20))
        with pytest.raises(DataError, match=words):
            read_table(p, "user", "item")
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(text.encode())[:30])  # a download cut short
    with pytest.raises(DataError, match="cannot decompress"):
        read_table(cut, "user", "item")
    sheet = tmp_path / "ratings.xlsx"
    sheet.write_bytes(b"PK\x03\x04" + bytes(20))  # a zip inside, but a spreadsheet to its user
    with pytest.raises(DataError, match="a spreadsheet.*save it as CSV"):
        read_table(sheet, "user", "item")


def test_json_ids_keep_their_types_and_bad_values_are_named(tmp_path):
    """JSON's own types: text ids stay text (Amazon's reviewerID, asin, whose leading zeros
    are part of it), numbers stay integers, a record missing an id or holding a list there is
    refused naming the column; Amazon's rating column 'overall' is found by name."""
    from vaecf.data.columns import RATING_NAMES

    p = tmp_path / "reviews.jsonl"
    p.write_text('{"reviewerID": "A1", "asin": "0001", "overall": 5.0}\n'
                 '{"reviewerID": "A2", "asin": "0002", "overall": 3.0}\n')  # fmt: skip
    got = read_table(p, "reviewerID", "asin", "overall")
    assert got.get_column(USER).to_list() == ["A1", "A2"]
    assert got.get_column(ITEM).to_list() == ["0001", "0002"]  # leading zeros kept: text
    assert guess_column(["reviewerID", "asin", "overall"], None, RATING_NAMES, "rating") == (
        "overall"
    )
    p.write_text('{"user": 1, "item": [1, 2]}\n')
    with pytest.raises(DataError, match="'item' holds List"):
        read_table(p, "user", "item")
    p.write_text('{"user": 1, "item": 2}\n{"user": 2}\n')
    with pytest.raises(DataError, match="empty 'item'"):
        read_table(p, "user", "item")
    p.write_text('{"user": 1, "item": 2}\n{"user": 1, "item": 3\n')
    with pytest.raises(DataError, match="as JSON, line 2: Expecting ','"):
        read_table(p, "user", "item")
    p.write_text('{"user": 1, "item": 2}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"line 2: not a record"):
        read_table(p, "user", "item")


def test_a_latin1_file_is_refused_with_how_to_convert_it(tmp_path):
    p = _text_file(tmp_path, "r.csv", "user,item\n1,a\n")
    p.write_bytes(b"user,item\n1,Caf\xe9\n")
    with pytest.raises(DataError, match=r"line 2: not valid UTF-8 .*iconv -f latin1 -t utf-8"):
        read_table(p, "user", "item")


def test_text_ids_become_integers_only_where_each_spells_one_as_queries_do(tmp_path):
    """ "42" is 42; "042", "+42" and "4.2e1" are not (a query's "042" would not find 42): a
    column holding one keeps every id as text, so "01" and "1" stay two items."""
    for ids, want in (
        (["42", " 7", "0", "-3"], [42, 7, 0, -3]),
        (["0001", "0002"], ["0001", "0002"]),
        (["1", "01"], ["1", "01"]),
        (["+42", "5"], ["+42", "5"]),
        (["9223372036854775808", "1"], ["9223372036854775808", "1"]),  # beyond int64
    ):
        p = _text_file(tmp_path, "ids.csv", "user,item\n" + "".join(f"u,{i}\n" for i in ids))
        assert read_table(p, "user", "item").get_column(ITEM).to_list() == want, ids


def test_a_directory_of_parquet_parts_reads_as_one_table(tmp_path):
    """Spark's layout: key=value subdirectories, part files, _SUCCESS and .crc beside them:
    the parts in name order, as one table. Parts of different columns, or a prepared dataset's
    directory, are refused with what to pass instead."""
    from vaecf.data import files

    table = tmp_path / "export"
    for n, (lo, hi) in enumerate([(0, 2), (2, 4)]):
        part = table / f"day={n}" / f"part-{n:05d}.parquet"
        part.parent.mkdir(parents=True)
        pl.DataFrame(
            {"user": [r[0] for r in ROWS[lo:hi]], "item": [r[1] for r in ROWS[lo:hi]],
             "rating": [r[2] for r in ROWS[lo:hi]]}
        ).write_parquet(part)  # fmt: skip
        (part.parent / f".{part.name}.crc").write_bytes(b"crc")
    (table / "_SUCCESS").touch()
    assert files.kind(table) == files.PARQUET and len(files.parts(table)) == 2
    assert read_table(table, "user", "item", "rating").equals(EXPECTED)
    pl.DataFrame({"user": [9], "other": [1]}).write_parquet(table / "day=1" / "stray.parquet")
    with pytest.raises(DataError, match="different columns .* not one table's parts"):
        read_table(table, "user", "item")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "manifest.json").write_text("{}")
    with pytest.raises(DataError, match="a prepared dataset .* vaecf train --data"):
        read_table(prepared, "user", "item")


def test_a_zip_of_one_data_file_reads_as_that_file(tmp_path):
    """Kaggle's downloads: a zip holding one CSV (beside macOS's __MACOSX folder) or one
    Parquet file reads as it; an archive of two data files is refused naming both."""
    import io
    import zipfile

    text = "user,item,rating\n" + "".join(f"{u},{i},{r}\n" for u, i, r in ROWS)
    buf = io.BytesIO()
    EXPECTED.rename({USER: "user", ITEM: "item", RATING: "rating"}).write_parquet(buf)
    cases = {
        "archive.zip": {"ratings.csv": text, "__MACOSX/._ratings.csv": "junk"},
        "ratings.csv.zip": {"data/ratings.tsv": text.replace(",", "\t")},
        "table.zip": {"part.parquet": buf.getvalue()},
    }
    for name, members in cases.items():
        p = tmp_path / name
        with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
            for member, data in members.items():
                z.writestr(member, data)
        assert read_table(p, "user", "item", "rating").equals(EXPECTED), name
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as z:
        z.writestr("ratings.csv", text)
        z.writestr("movies.csv", "movieId,title\n")
    with pytest.raises(DataError, match=r"a zip archive of 2 files \(ratings.csv, movies.csv\)"):
        read_table(two, "user", "item")


def test_a_semicolon_file_with_decimal_commas(tmp_path):
    """A European spreadsheet's export: ';' between fields (found), '4,5' for 4.5."""
    p = _text_file(tmp_path, "r.csv", 'user;item;rating\n1;10;4,5\n2;11;3\n3;12;"2,0"\n')
    got = read_table(p, "user", "item", "rating")
    assert got.get_column(RATING).to_list() == [4.5, 3.0, 2.0]


def test_a_large_compressed_file_is_unpacked_to_disk_once(tmp_path, monkeypatch):
    """Above files.IN_MEMORY compressed bytes a file is unpacked into a temp file (reused while
    it is unchanged) and read from disk: the same frame; bare CRs made LF across the unpacking's
    blocks (of 5 bytes here). On a full disk: a DataError saying where and what to do, and no
    temp file left behind."""
    import gzip

    from benchmarks.drillkit import Tmpfs, can_mount
    from vaecf.data import files

    monkeypatch.setattr(files, "IN_MEMORY", 0)
    monkeypatch.setattr(files, "BLOCK", 5)
    text = "user,item,rating\r" + "".join(f"{u},{i},{r}\r" for u, i, r in ROWS)  # old Mac
    p = tmp_path / "r.csv.gz"
    p.write_bytes(gzip.compress(text.encode()))
    assert read_table(p, "user", "item", "rating").equals(EXPECTED)
    first = files.source(p)
    assert isinstance(first, Path) and first.read_bytes() == text.replace("\r", "\n").encode()
    assert files.source(p) == first  # unpacked once
    if not can_mount():
        return
    fs = Tmpfs(1 << 20)
    try:
        fs.fill(leave=64 << 10)
        monkeypatch.setattr(tempfile, "tempdir", str(fs.path))
        big = tmp_path / "big.csv.gz"
        big.write_bytes(gzip.compress(b"user,item\n" + b"1,2\n" * 100_000))  # 400 kB unpacked
        with pytest.raises(DataError, match=r"cannot unpack .*big.csv.gz into .*set TMPDIR"):
            read_table(big, "user", "item")
        assert not list(fs.path.glob("vaecf-unpacked-*"))
    finally:
        fs.close()
