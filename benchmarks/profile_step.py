"""Where a training step's time goes: `vaecf bench train`'s steps under torch.profiler.

    python benchmarks/profile_step.py [--device cuda] [--precision fp32] [--model multvae]
                                      [--users 136677 --items 20108 --nnz 10000000] [--steps 10]
                                      [--cuda-graphs false] [--shapes]

Leaves out the model's set-up and 3 warm-up steps (allocations, caches). Prints the operators
by self time on the host (launch and Python overhead, the cost on a GPU when kernels are small)
and, on a GPU, by device time, and counts the host-device synchronisations (the bench itself
synchronises 4 times a step to split its breakdown; any more stall the queue). ML-20M shape and
batch 500 by default. A replayed CUDA graph shows as one launch: `--cuda-graphs false` profiles
the same step eagerly, kernel by kernel (their device times are what a replay runs; the
launches are what it saves). `--shapes` groups the operators by their inputs' shapes as well
(which product is which layer's).
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile, schedule

from vaecf.bench import speed as bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--model", default="multvae")
    ap.add_argument("--batch-size", type=int, default=500)
    bench.add_shape_arguments(ap)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=25, help="operators shown per table")
    ap.add_argument("--cuda-graphs", default="true", choices=["true", "false"])
    ap.add_argument("--shapes", action="store_true", help="group operators by input shapes")
    a = ap.parse_args()
    data = bench.synthetic_csr(a.users, a.items, a.nnz)
    acts = [ProfilerActivity.CPU]
    gpu = a.device.startswith("cuda")
    if gpu:
        acts.append(ProfilerActivity.CUDA)
    kw = dict(device=a.device, model=a.model, progress=False, data=data)
    kw["cuda_graphs"] = a.cuda_graphs == "true"
    warmup = 3  # the model's set-up and the first steps (allocations, caches) are not profiled
    when = schedule(skip_first=warmup - 1, wait=0, warmup=1, active=a.steps, repeat=1)
    with profile(activities=acts, schedule=when, record_shapes=a.shapes) as prof:
        r = bench.bench_train(
            a.precision, a.batch_size, steps=a.steps, warmup=warmup, on_step=prof.step, **kw
        )
    ev = prof.key_averages(group_by_input_shape=a.shapes)
    print(f"{a.model} {a.precision} on {a.device}: {r.users_per_s:.0f} users/s, {r.step_ms:.2f} ms")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=a.rows))
    if gpu:
        print(ev.table(sort_by="self_device_time_total", row_limit=a.rows))
    syncs = {
        e.key: e.count
        for e in ev
        if any(s in e.key for s in ("Synchronize", "cudaMemcpy", "item", "_local_scalar_dense"))
    }
    print("host-device synchronisations and copies over", a.steps, "steps:", syncs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
