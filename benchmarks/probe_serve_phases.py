"""Probe: where a served request's time goes, phase by phase, with variants of the server side.

    python benchmarks/probe_serve_phases.py current load-on-main current load-on-main
    python benchmarks/probe_serve_phases.py current gc-off gc-high
    PYTHONPATH=OTHER/src python benchmarks/probe_serve_phases.py current   # another commit's code

Each variant is a `vaecf serve` subprocess of an untrained Mult-VAE over 6,946 items (fp32)
whose guard, batcher and scoring call are timed from inside (perf_counter at the guard's entry,
the batcher's submit, the scoring call's start and end, submit's return, the guard's exit),
answering 4,000 POST /v1/recommend (history 10, k 10) on one keep-alive connection; the first
200 are left out. Variants: current; load-on-main (the model loaded on the main thread, as
before ModelHolder.load moved it to a thread of its own); gc-off / gc-high (the cyclic
collector disabled, or gen0 at 100,000, after the server's gc.freeze).
"""

import atexit
import gc
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PHASES = [
    ("guard + route + validation", "a", "b"),
    ("to the scoring thread", "b", "c"),
    ("scoring", "c", "d"),
    ("back to the loop", "d", "e"),
    ("answer built and sent", "e", "f"),
    ("server total", "a", "f"),
]


def server(variant: str, run: str, port: str, out: str) -> None:
    """The instrumented `vaecf serve` (in this process)."""
    from vaecf.cli import main
    from vaecf.serve import batcher, guard, reload

    t = {k: [] for k in "abcdef"}

    def wrap_async(cls, name, before, after, only=None):
        orig = getattr(cls, name)

        async def timed(self, *a, **k):
            if only is not None and not only(a):
                return await orig(self, *a, **k)
            t[before].append(time.perf_counter())
            r = await orig(self, *a, **k)
            t[after].append(time.perf_counter())
            return r

        setattr(cls, name, timed)

    wrap_async(guard.Guard, "__call__", "a", "f", lambda a: a[0].get("path") == "/v1/recommend")
    wrap_async(batcher.MicroBatcher, "submit", "b", "e")
    orig_timed = batcher.MicroBatcher._timed

    def timed_call(self, fn, *a):
        t["c"].append(time.perf_counter())
        try:
            return orig_timed(self, fn, *a)
        finally:
            t["d"].append(time.perf_counter())

    batcher.MicroBatcher._timed = timed_call
    if variant == "load-on-main":

        def on_main(cls, run_dir, device="cpu", precision="fp32", root=None, batch_sizes=(1,)):
            loaded = reload.load_checked(run_dir, device, precision, batch_sizes)
            return cls(loaded, device, precision, root, batch_sizes)

        reload.ModelHolder.load = classmethod(on_main)
    if variant.startswith("gc-"):
        freeze = gc.freeze

        def then_tune():
            freeze()
            gc.disable() if variant == "gc-off" else gc.set_threshold(100_000, 50, 100)

        gc.freeze = then_tune

    def dump():
        n = min(len(v) for v in t.values())
        a = {k: np.array(v[-n:]) for k, v in t.items()}

        def ms(x, y, q):
            return float(np.percentile((a[y] - a[x])[200:] * 1e3, q))

        Path(out).write_text(json.dumps({k: [ms(x, y, 50), ms(x, y, 99)] for k, x, y in PHASES}))

    atexit.register(dump)
    main(["serve", run, "--port", port, "--precision", "fp32"])


def one(variant: str, run: Path, tmp: Path) -> tuple[dict, list]:
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_latency import Client, wait_ready

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp / f"{variant}.json"
    cmd = [sys.executable, __file__, "--server", variant, str(run), str(port), str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, proc)
    c, rng, ms = Client(port), random.Random(0), []
    bodies = [json.dumps({"items": rng.sample(range(6946), 10), "k": 10}).encode()
              for _ in range(1000)]  # fmt: skip
    for i in range(4000):
        t0 = time.perf_counter()
        assert c.post("/v1/recommend", bodies[i % 1000])[0] == 200
        ms.append((time.perf_counter() - t0) * 1e3)
    c.close()
    proc.terminate()
    proc.wait(30)
    a = np.array(ms[200:])
    return json.loads(out.read_text()), [float(np.percentile(a, q)) for q in (50, 99)]


def main() -> int:
    if sys.argv[1] == "--server":
        server(*sys.argv[2:6])
        return 0
    from vaecf.serve.fixtures import fresh_run

    with tempfile.TemporaryDirectory() as tmp:
        run = fresh_run(Path(tmp) / "run", 6946, "multvae")
        for variant in sys.argv[1:]:
            phases, client = one(variant, run, Path(tmp))
            cells = "; ".join(f"{k} {v[0]:.3f} / {v[1]:.3f}" for k, v in phases.items())
            print(f"{variant}: client p50 / p99 {client[0]:.3f} / {client[1]:.3f} ms; {cells}",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
