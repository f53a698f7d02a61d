"""The Python API in its own words (issue 38, item 9): errors that `vaecf.fit` and the prepare
functions raise name the keyword argument beside the command-line flag, "too few users" says
what to change (and following it works), and `repr` of a Recommender says what it is."""

from __future__ import annotations

import os
import shutil

import polars as pl
import pytest

import vaecf
from tests.helpers import cpu_config
from vaecf import models
from vaecf.data.vocab import Vocabulary
from vaecf.errors import ConfigError, DataError
from vaecf.recommender import Recommender


def _users(n: int, items: int = 6) -> pl.DataFrame:
    """n users with `items` items each, all rated 5."""
    return pl.DataFrame(
        {
            "user": [u for u in range(n) for _ in range(items)],
            "item": list(range(items)) * n,
            "rating": [5] * (n * items),
        }
    )


def _fit(df, **kw):
    return vaecf.fit(df, model="popular", progress=False, device="cpu", **kw)


def test_errors_name_the_keyword_argument_in_python_and_the_flag_on_the_command_line(
    capsys, planted, tmp_path
):
    df = _users(8)
    with pytest.raises(DataError, match=r"lower min_rating= or min_user_items=") as e:
        _fit(df, min_rating=10)
    assert "--" not in str(e.value)
    with pytest.raises(DataError, match=r"^min_user_items= must be at least 1"):
        _fit(df, min_user_items=0)
    with pytest.raises(DataError, match=r"test_frac= must lie in \[0, 1\) \(vaecf.fit: test=\)"):
        _fit(df, test=1.5)
    protocols = "liang, thesis, temporal, last"
    with pytest.raises(DataError, match=rf"^protocol= must be one of {protocols}, not 'x'$"):
        vaecf.PrepareSettings(protocol="x").validate()
    with pytest.raises(ConfigError, match=r"^epochs= must be at least 1$"):
        vaecf.fit(df, model="multvae", epochs=0, progress=False)
    with pytest.raises(ConfigError, match=r"^budget= must be a positive number"):
        _fit(df, budget=-1)
    from vaecf.cli import main

    ds = planted("words", 60, 30, 3, 5, 0, 5)
    assert (
        main(["train", "--data", str(ds.path), "--out", str(tmp_path / "o"), "--epochs", "0"]) == 2
    )
    err = capsys.readouterr().err
    assert "--epochs must be at least 1" in err and "epochs=" not in err
    with pytest.raises(ConfigError, match=r"^epochs= "):  # the CLI's setting is undone
        vaecf.fit(df, model="multvae", epochs=0, progress=False)


def test_too_few_users_says_what_to_change_and_the_advice_works():
    with pytest.raises(DataError) as one:
        _fit(_users(1))
    msg = str(one.value)
    assert msg.startswith("1 user remains after filtering, too few to hold out 10%")
    assert "(at least 6 users)" in msg and "lower min_user_items= or min_rating=" in msg
    assert "larger share" not in msg  # with one user, no share helps
    with pytest.raises(DataError, match=r"vaecf.fit: validation=, a share or a number of users"):
        _fit(_users(3))
    rec = _fit(_users(3), validation=1)  # the advice taken: one validation user
    assert len(rec.items) == 6


def test_repr_names_the_model_its_items_and_where_it_came_from(planted, tmp_path):
    ds = planted("words", 200, 40, 2, 10, seed=3, heldout=20)
    run = tmp_path / "run"
    vaecf.train(ds, cpu_config(), run, model="popular")
    rec = Recommender.load(run)
    assert repr(rec) == f"Recommender(popular, 40 items, from run {os.path.abspath(run)})"
    shutil.rmtree(run)  # a run directory that is gone is no source any more
    assert repr(rec).endswith(", in memory)")
    many = Recommender(models.build("popular", 1500), Vocabulary(list(range(1500))))
    assert repr(many) == "Recommender(Popular, 1,500 items, in memory)"


def test_fit_on_a_headerless_whitespace_file_says_how_to_name_its_columns(tmp_path):
    """FilmTrust's ratings.txt ('1050 215 3'): its separator (runs of spaces) is found; the
    error names the columns to pass, and passing them fits."""
    p = tmp_path / "ratings.txt"
    p.write_text("".join(f"{u} {i} {1 + (u + i) % 4}\n" for u in range(12) for i in range(6)))
    with pytest.raises(DataError) as e:
        _fit(p)
    msg = str(e.value)
    assert "has no header row" in msg and 'columns=["user", "item", "rating"]' in msg
    rec = _fit(p, columns=["user", "item", "rating"], validation=2)
    assert len(rec.items) == 6
