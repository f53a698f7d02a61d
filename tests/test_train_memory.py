"""Memory a gradient model's training holds: counted before the model is built, stated, refused
with the figures, and checkpoints written in the foreground where their copies do not fit."""

import pytest
import torch
from conftest import cpu_config

import vaecf
from vaecf import background, footprint, memory, models


@pytest.fixture(scope="module")
def ds(planted):
    return planted("mem", 700, 300, 6, 20, seed=5, heldout=80)


def cfg(**kw):
    base = dict(epochs=3, batch_size=100, seed=3, preset="paper", checkpoint_every=0)
    return cpu_config(**{**base, **kw})


def mem_of(ds, batch_size=100, name="multvae"):
    nnz = ds.manifest["counts"]["nnz_train"]
    return footprint.train_memory(
        name, ds.n_items, models.config_from_dict(name), batch_size, "fp32", nnz
    )


def _weights(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.parametrize("name", ["multvae", "multdae", "recvae", "recvae-edlae"])
def test_parameters_are_counted_without_building_the_model(name):
    mem = footprint.train_memory(name, 500, models.config_from_dict(name), 64, "fp32", 1000)
    net = models.build(name, 500, models.config_from_dict(name))
    stepped = {id(p) for ps in net.param_groups().values() for p in ps}
    assert mem.trained == sum(p.numel() for p in net.parameters() if id(p) in stepped)
    rest = sum(p.numel() for p in net.parameters() if id(p) not in stepped)
    rest += sum(b.numel() for b in net.buffers())
    assert mem.state == (16 + footprint.SLACK_BYTES) * mem.trained + 4 * rest
    assert mem.batch == 12 * 64 * 500 and mem.data == 12 * 1000
    if name == "multvae":  # the paper's network: n -> 600 -> 2 x 200 | 200 -> 600 -> n
        assert mem.trained == 500 * 600 + 600 + 600 * 400 + 400 + 200 * 600 + 600 + 600 * 500 + 500
    assert mem.need(True) - mem.need(False) == 4 * mem.trained * 4  # five copies against one


def test_half_width_autocast_counts_the_weight_casts():
    a = footprint.train_memory("multvae", 500, models.config_from_dict("multvae"), 64, "fp32", 0)
    b = footprint.train_memory("multvae", 500, models.config_from_dict("multvae"), 64, "bf16", 0)
    assert b.state - a.state == 2 * a.trained


def test_training_that_does_not_fit_is_refused_before_it_starts(ds, tmp_path, monkeypatch):
    mem = mem_of(ds, batch_size=500)
    built, build = [], models.build

    def spy(*a, **k):  # counting on the meta device allocates nothing; any other build does
        if torch.get_default_device().type != "meta":
            built.append(a)
        return build(*a, **k)

    monkeypatch.setattr(models, "build", spy)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**5)
    with pytest.raises(vaecf.RunError) as e:
        vaecf.train(ds, cfg(batch_size=500), tmp_path / "r")
    msg = str(e.value)
    assert f"training needs about {memory.gib(mem.need(False))} (" in msg
    assert "cpu has 0.1 MiB free" in msg and "more memory" in msg
    assert "--min-item-users" not in msg and "--batch-size" not in msg  # neither would do
    assert not built  # refused before the model was built
    free = mem.need(False) - mem.batch // 2  # a quarter of the batch fits
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    with pytest.raises(vaecf.RunError, match=r"--batch-size 125 \(0.4 MiB a batch\)"):
        vaecf.train(ds, cfg(batch_size=500), tmp_path / "r")
    # a batch beyond the training users is counted at the training users
    with pytest.raises(
        vaecf.RunError, match=f"a batch of {ds.manifest['counts']['n_train_users']} "
    ):
        vaecf.train(ds, cfg(batch_size=5000), tmp_path / "r")


def test_refusal_says_which_items_to_keep(ds, tmp_path, monkeypatch):
    mem = mem_of(ds, batch_size=1)
    free = int(footprint.RUNTIME_BYTES + mem.data + mem.per_item * ds.n_items / 2)  # half fit
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    with pytest.raises(vaecf.RunError, match=r"prepare again with --min-item-users (\d+)") as e:
        vaecf.train(ds, cfg(batch_size=1), tmp_path / "r")
    cut = int(e.value.args[0].split("--min-item-users ")[1].split(")")[0])
    users = ds.split("train").getnnz(axis=0)
    kept = int((users >= cut).sum())
    assert f"keep the {kept:,} items with at least {cut} users" in str(e.value)
    assert 0 < kept < ds.n_items and kept * mem.per_item <= free


def test_checkpoints_go_to_the_foreground_when_their_copies_do_not_fit(ds, tmp_path, monkeypatch):
    full = vaecf.train(ds, cfg(epochs=4), tmp_path / "full")  # background checkpoints
    mem = mem_of(ds)
    tight = (mem.need(False) + mem.need(True)) // 2
    monkeypatch.setattr(memory, "available_bytes", lambda device: tight)
    written = []
    save = background.CheckpointWriter.write_now
    monkeypatch.setattr(
        background.CheckpointWriter,
        "write_now",
        lambda self, path, payload: (written.append(path.name), save(self, path, payload)),
    )
    vaecf.train(ds, cfg(epochs=2), tmp_path / "split")
    resumed = vaecf.train(ds, cfg(epochs=4), tmp_path / "split", resume=True)
    assert written and set(written) == {"last.pt"}  # last.pt from the live tensors
    for name in ("last.pt", "best.pt"):  # the same run as with background checkpoints
        a, b = _weights(tmp_path / "full" / name), _weights(tmp_path / "split" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.test_metrics == full.test_metrics


def test_the_plan_is_stated_before_training(ds, tmp_path, capsys):
    vaecf.train(ds, cfg(epochs=1, progress=True), tmp_path / "r")
    out = capsys.readouterr()
    line = next(x for x in (out.out + out.err).splitlines() if "checkpoint copies" in x)
    mem = mem_of(ds)
    assert f"{mem.trained:,} parameters" in line and "written in the background)" in line
