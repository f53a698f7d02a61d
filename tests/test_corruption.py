"""Corrupted artefacts: truncated or bit-flipped splits, vocabularies, manifests and checkpoints
each give a DataError/RunError naming the file and what to do; never a silent wrong load."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from vaecf.data import prepare as prep
from vaecf.data.prepare import SPLIT_FILES, PreparedDataset, PrepareSettings, prepare_frame
from vaecf.data.synthetic import generate
from vaecf.errors import DataError, RunError
from vaecf.storage import checkpoint

REPREPARE = "prepare the dataset again"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("corrupt") / "ds"
    prepare_frame(generate(n_users=300, n_items=80, seed=4), out, PrepareSettings(heldout_users=20))
    return out


@pytest.fixture
def ds_dir(pristine, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(pristine, d)
    return d


def read_everything(d):
    ds = PreparedDataset(d)
    for s in SPLIT_FILES:
        ds.split(s)
    assert len(ds.items) == ds.n_items
    assert ds.users.height == ds.manifest["counts"]["n_users"]
    return ds


def flip_bit(path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def test_manifest_lists_a_checksum_of_every_file(pristine):
    ds = read_everything(pristine)
    names = {p.name for p in pristine.iterdir()} - {"manifest.json"}
    assert set(ds.manifest["files"]) == names
    assert ds.manifest["format_version"] == prep.FORMAT_VERSION
    assert len(ds.manifest["manifest_sha256"]) == 64


FILES = [f"{s}.npz" for s in SPLIT_FILES] + ["items.parquet", "users.parquet"]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "swap"])
def test_damaged_file_is_named_with_what_to_do(ds_dir, name, damage):
    f = ds_dir / name
    rng = random.Random(hash((name, damage)) & 0xFFFF)
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[: rng.randrange(f.stat().st_size)])
    elif damage == "flip":
        flip_bit(f, rng)
    elif damage == "empty":
        f.write_bytes(b"")
    else:  # a valid file of the same kind, but not this one
        other = "validation_te.npz" if name == "test_te.npz" else "test_te.npz"
        other = "users.parquet" if name == "items.parquet" else other
        other = "items.parquet" if name == "users.parquet" else other
        shutil.copyfile(ds_dir / other, f)
    with pytest.raises(DataError) as e:
        read_everything(ds_dir)
    msg = str(e.value)
    assert str(f) in msg and REPREPARE in msg and "--overwrite" in msg


def test_missing_file_is_named(ds_dir):
    (ds_dir / "train.npz").unlink()
    with pytest.raises(DataError, match=f"{ds_dir / 'train.npz'} is missing; {REPREPARE}"):
        PreparedDataset(ds_dir).split("train")


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t[: len(t) // 2],  # truncated
        lambda t: "",
        lambda t: "[1, 2]",
        lambda t: t.replace('"n_items": ', '"n_items": 1', 1),  # still JSON, wrong number
        lambda t: t.replace('"counts"', '"kounts"', 1),
        lambda t: t.replace('"fingerprint": "', '"fingerprint": "0', 1),
    ],
)
def test_damaged_manifest_is_named(ds_dir, edit):
    m = ds_dir / "manifest.json"
    m.write_text(edit(m.read_text()))
    with pytest.raises(DataError) as e:
        PreparedDataset(ds_dir)
    assert str(m) in str(e.value) and REPREPARE in str(e.value)


def test_bit_flips_anywhere_in_the_manifest_are_caught(pristine, tmp_path):
    rng = random.Random(7)
    text = (pristine / "manifest.json").read_bytes()
    caught = 0
    for trial in range(200):
        d = tmp_path / f"d{trial}"
        d.mkdir()
        for f in pristine.iterdir():
            (d / f.name).symlink_to(f)
        (d / "manifest.json").unlink()
        data = bytearray(text)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (d / "manifest.json").write_bytes(bytes(data))
        with pytest.raises(DataError, match="manifest.json"):
            read_everything(d)
        caught += 1
    assert caught == 200


def test_manifest_from_a_newer_vaecf_says_upgrade(ds_dir):
    m = ds_dir / "manifest.json"
    obj = json.loads(m.read_text())
    obj["format_version"] = prep.FORMAT_VERSION + 1
    obj.pop("manifest_sha256")
    m.write_text(json.dumps(obj))
    with pytest.raises(DataError, match="newer vaecf.*upgrade vaecf"):
        PreparedDataset(ds_dir)


def test_format_1_dataset_still_loads_unverified(ds_dir):
    m = ds_dir / "manifest.json"
    obj = json.loads(m.read_text())
    for k in ("files", "manifest_sha256"):
        obj.pop(k)
    obj["format_version"] = 1
    m.write_text(json.dumps(obj))
    read_everything(ds_dir)


def test_prepare_repairs_a_damaged_copy_of_its_own_output(tmp_path):
    csv = tmp_path / "x.csv"
    generate(n_users=200, n_items=60, seed=2).write_csv(csv)
    args = (csv, tmp_path / "ds", "user_id", "item_id")
    s = PrepareSettings(heldout_users=10)
    first = prep.prepare_csv(*args, settings=s)
    want = first.split("train").toarray()
    flip_bit(tmp_path / "ds" / "train.npz", random.Random(1))
    again = prep.prepare_csv(*args, settings=s)  # same fingerprint, damaged: prepared again
    assert (again.split("train").toarray() == want).all()


def test_older_format_dataset_in_out_says_so(tmp_path):
    csv = tmp_path / "x.csv"
    generate(n_users=200, n_items=60, seed=2).write_csv(csv)
    s = PrepareSettings(heldout_users=10)
    prep.prepare_csv(csv, tmp_path / "ds", "user_id", "item_id", settings=s)
    m = tmp_path / "ds" / "manifest.json"
    obj = json.loads(m.read_text())
    obj.update(format_version=1, fingerprint="0123456789abcdef")
    for k in ("files", "manifest_sha256"):
        obj.pop(k)
    m.write_text(json.dumps(obj))
    with pytest.raises(DataError, match=r"older vaecf \(format 1, now 2\).*--overwrite"):
        prep.prepare_csv(csv, tmp_path / "ds", "user_id", "item_id", settings=s)


def test_fingerprint_covers_the_format_version(monkeypatch):
    src = {"sha256": "x", "columns": {"user": "u"}, "sep": None}
    fp = prep.fingerprint(PrepareSettings(), src)
    monkeypatch.setattr(prep, "FORMAT_VERSION", prep.FORMAT_VERSION + 1)
    assert prep.fingerprint(PrepareSettings(), src) != fp


# -- checkpoints ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ck_bytes(tmp_path_factory):
    p = tmp_path_factory.mktemp("ck") / "last.pt"
    g = torch.Generator().manual_seed(0)
    checkpoint.save(
        p,
        {"model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32)}, "epoch": 3},
    )
    return p.read_bytes()


def test_checkpoint_round_trip(tmp_path, ck_bytes):
    p = tmp_path / "c.pt"
    p.write_bytes(ck_bytes)
    assert checkpoint.verify(p)
    ck = checkpoint.load(p)
    assert ck["epoch"] == 3 and ck["model"]["w"].shape == (64, 32)


def same_checkpoint(a: dict, b: dict) -> bool:
    return a["epoch"] == b["epoch"] and all(torch.equal(a["model"][k], b["model"][k]) for k in "wb")


def test_every_truncation_and_bit_flip_of_a_checkpoint_is_caught(tmp_path, ck_bytes):
    """Each damaged file raises RunError naming it, except one harmless case that loads the
    exact original: a cut right before the footer (a checkpoint as written before footers)."""
    rng = random.Random(11)
    p = tmp_path / "c.pt"
    p.write_bytes(ck_bytes)
    original = checkpoint.load(p)
    n, footer = len(ck_bytes), len(checkpoint.FOOTER) + 32
    cuts = {0, 1, n - 1, n - footer + 1, n - footer - 1} | {rng.randrange(n) for _ in range(25)}
    flips = [rng.randrange(n) for _ in range(60)] + list(range(n - footer, n))
    for cut in sorted(cuts):
        p.write_bytes(ck_bytes[:cut])
        with pytest.raises(RunError, match=f"{p}.*(restore|retrain)"):
            checkpoint.load(p)
    p.write_bytes(ck_bytes[: n - footer])
    assert same_checkpoint(checkpoint.load(p), original)
    for i in flips:
        data = bytearray(ck_bytes)
        data[i] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(data))
        # the digest's words, though torch reads the file beside its check (and may fail first)
        with pytest.raises(RunError, match=f"{p} is corrupted \\((its SHA-256|truncated)"):
            checkpoint.load(p)


def test_footerless_checkpoint_loads_and_foreign_files_are_refused(tmp_path):
    p = tmp_path / "old.pt"
    torch.save({"magic": checkpoint.MAGIC, "epoch": 1}, p)  # written before footers existed
    assert not checkpoint.verify(p) and checkpoint.load(p)["epoch"] == 1
    torch.save({"epoch": 1}, p)
    with pytest.raises(RunError, match="not a vaecf checkpoint"):
        checkpoint.load(p)
    with pytest.raises(RunError, match="missing"):
        checkpoint.load(tmp_path / "none.pt")
