"""Memory a gradient model's training holds: counted before the model is built, stated, refused
with the figures, and checkpoints written in the foreground where their copies do not fit."""

import pytest
import torch

import vaecf
from tests.helpers import cpu_config
from vaecf import memory, models
from vaecf.training import background, footprint


def free_bytes(n: int):
    """In place of memory.free_memory: `n` bytes free on any device."""
    return lambda device: memory.Free(n, "MemAvailable")


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
    monkeypatch.setattr(memory, "free_memory", free_bytes(10**5))
    with pytest.raises(vaecf.RunError) as e:
        vaecf.train(ds, cfg(batch_size=500), tmp_path / "r")
    msg = str(e.value)
    assert f"training needs about {memory.gib(mem.need(False))} (" in msg
    assert "cpu has 0.1 MiB free" in msg and "more memory" in msg
    assert "--min-item-users" not in msg and "--batch-size" not in msg  # neither would do
    assert not built  # refused before the model was built
    free = mem.need(False) - mem.batch // 2  # a quarter of the batch fits
    monkeypatch.setattr(memory, "free_memory", free_bytes(free))
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
    monkeypatch.setattr(memory, "free_memory", free_bytes(free))
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
    monkeypatch.setattr(memory, "free_memory", free_bytes(tight))
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


def test_cgroup_limits_count_at_every_level_less_the_droppable_cache(tmp_path):
    """The tightest level's limit minus its use (file cache the kernel can drop not counted),
    for cgroup v2 and v1 trees laid out as the kernel lays them; no limit anywhere: None."""
    v2 = tmp_path / "v2"
    for level, limit, use, cache in (
        ("", "max", 9 * 2**30, 0),
        ("a", "4294967296", 3 * 2**30, 2**30),
        ("a/b", "max", 2**30, 0),
    ):
        d = v2 / level
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text(limit + "\n")
        (d / "memory.current").write_text(f"{use}\n")
        (d / "memory.stat").write_text(f"anon 5\nfile 9\ninactive_file {cache}\n")
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    assert memory.cgroup_room(proc, v2) == 4 * 2**30 - (3 * 2**30 - 2**30)  # a's: 2 GiB
    (v2 / "a" / "memory.max").write_text("max\n")
    assert memory.cgroup_room(proc, v2) is None
    v1 = tmp_path / "v1"
    d = v1 / "memory" / "job"
    d.mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (d / "memory.limit_in_bytes").write_text(f"{6 * 2**30}\n")
    (d / "memory.usage_in_bytes").write_text(f"{2 * 2**30}\n")
    (d / "memory.stat").write_text(f"cache 7\ntotal_inactive_file {2**29}\n")
    proc.write_text("5:cpu,cpuacct:/\n4:memory:/job\n0::/\n")
    assert memory.cgroup_room(proc, v1) == 6 * 2**30 - (2 * 2**30 - 2**29)


UNDER_ULIMIT = r"""
import json, resource, sys
import numpy as np, scipy.sparse as sp, torch
import vaecf
from vaecf import memory, models
from vaecf.data import synthetic
from vaecf.errors import RunError

out, head = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
x = sp.csr_matrix((rng.random((4000, 200)) < 0.05).astype(np.float32))
df = synthetic.generate(n_users=600, n_items=4000, n_groups=3, mean_items=40, seed=1)
ds = vaecf.prepare_frame(df, out + "/d", vaecf.PrepareSettings(heldout_users=30, seed=1))
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize:")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + head, resource.RLIM_INFINITY))
said = {"free": memory.free_memory(torch.device("cpu"))}
try:
    models.build("infae", 200, {"ridge": 1.0}).fit(x)
except RunError as e:
    said["infae"] = str(e)
    users = int(said["infae"].split("--max-users ")[1].split()[0].replace(",", ""))
    said["followed"] = models.build("infae", 200, {"ridge": 1.0, "max_users": users}).fit(x)
for name, more in (("edlae", {}), ("recvae-edlae", {"epochs": 1})):
    cfg = vaecf.TrainConfig(device="cpu", progress=False, **more)
    try:
        vaecf.train(ds, cfg, out + "/" + name, model=name)
    except RunError as e:
        said[name] = str(e)
print(json.dumps(said))
"""


def test_an_address_space_limit_is_counted_and_refusals_leave_nothing(tmp_path):
    """Under `ulimit -v` (RLIMIT_AS) the free figure is what the limit leaves, and every model
    refuses in words before allocating: inf-AE with a --max-users that fits when followed,
    EDLAE (its n^2 arrays) and RecVAE+EDLAE (its linear path's fit, before the model is built)
    leaving no run directory behind."""
    import json
    import subprocess
    import sys

    # 256 MiB free for arrays beside the compute threads' reserve (one thread or two: the
    # child runs as many as this process)
    head = 256 * 2**20 + torch.get_num_threads() * memory.THREAD_ADDRESS_SPACE
    got = subprocess.run(
        [sys.executable, "-c", UNDER_ULIMIT, str(tmp_path), str(head)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    said = json.loads(got.stdout.strip().splitlines()[-1])
    free, limit = said["free"]
    threads = torch.get_num_threads() * memory.THREAD_ADDRESS_SPACE  # not yet started
    # a thread of the preparation ending between the limit and the figure unmaps its arena:
    # the address space can shrink by one thread's reserve (seen once under a loaded suite)
    ended = memory.THREAD_ADDRESS_SPACE
    assert limit == "ulimit -v" and 0.8 * (head - threads) < free <= head - threads + ended
    assert "(ulimit -v); give --max-users" in said["infae"]
    assert said["followed"]["users"] < 4000
    for name in ("edlae", "recvae-edlae"):
        assert "(ulimit -v)" in said[name] and not (tmp_path / name).exists()
    assert "the linear path's fit before training" in said["recvae-edlae"]
