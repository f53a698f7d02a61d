"""Settings that would do nothing are refused: a held-out count under the percentage protocol, a
fraction under the count protocol; the message says what applies instead."""

from __future__ import annotations

import pytest

from tests.helpers import cli_in_process
from vaecf.data.prepare import PrepareSettings, dataset_settings
from vaecf.errors import DataError


def test_lastfm_heldout_users_is_refused_with_what_applies():
    with pytest.raises(DataError) as e:
        dataset_settings("lastfm-360k", heldout_users=250)
    msg = str(e.value)
    assert "heldout_users= applies to the liang protocol only" in msg  # Python's words
    assert "thesis protocol (its default)" in msg
    assert "validation_frac=, test_frac=" in msg and "protocol='liang' heldout_users=250" in msg


@pytest.mark.parametrize(
    "name, kw, flag",
    [
        ("ml-20m", dict(validation_frac=0.1), "validation_frac="),
        ("netflix", dict(test_frac=0.1), "test_frac="),
        ("ml-1m", dict(heldout_users=10), "heldout_users="),
        ("ml-20m", dict(protocol="thesis", heldout_users=10), "heldout_users="),
        ("pinterest", dict(protocol="liang", test_frac=0.2), "test_frac="),
    ],
)
def test_settings_of_the_other_protocol_are_refused(name, kw, flag):
    with pytest.raises(DataError, match=f"{flag} applies to the"):
        dataset_settings(name, **kw)


def test_switching_protocol_drops_the_other_protocols_defaults():
    s = dataset_settings("ml-20m", protocol="thesis")
    assert (s.heldout_users, s.validation_frac, s.test_frac) == (None, 0.07, 0.07)
    s = dataset_settings("lastfm-360k", protocol="liang", heldout_users=250)
    assert (s.heldout_users, s.validation_frac, s.test_frac) == (250, None, None)
    s = dataset_settings("ml-1m", validation_frac=0.1)
    assert (s.protocol, s.validation_frac, s.test_frac, s.heldout_users) == (
        "thesis",
        0.1,
        0.07,
        None,
    )


def test_prepare_settings_validate_and_defaults():
    assert PrepareSettings().heldout_users == 10_000
    t = PrepareSettings(protocol="thesis")
    assert (t.heldout_users, t.validation_frac) == (None, 0.07)
    t.validate()
    with pytest.raises(DataError, match="heldout_users="):
        PrepareSettings(protocol="thesis", heldout_users=5).validate()
    with pytest.raises(DataError, match="test_frac="):
        PrepareSettings(test_frac=0.1).validate()
    with pytest.raises(DataError, match="validation_frac= must lie strictly between"):
        PrepareSettings(protocol="thesis", validation_frac=1.5).validate()


def test_cli_refuses_before_reading_anything(tmp_path):
    rc, err = cli_in_process(["prepare", "lastfm-360k", "--heldout-users", 250, "--root", tmp_path,
                    "--source", tmp_path / "does-not-exist", "--quiet"])  # fmt: skip
    assert rc == 2 and "--heldout-users applies to the liang protocol only" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    rc, err = cli_in_process(["prepare", "ml-20m", "--validation-frac", 0.1, "--root", tmp_path,
                    "--source", tmp_path / "none", "--quiet"])  # fmt: skip
    assert rc == 2 and "--validation-frac applies to the thesis protocol only" in err, err
