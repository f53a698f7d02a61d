"""The drill of `vaecf serve`: servers SIGKILLed during start-up, answering and a reload; both
run directories must stay byte for byte as they were, and a restarted server answer the same.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

from .outputs import tree_digest
from .runners import Proc, prepare_synthetic, read_output, run_ok, suppress_lookup
from .trials import Tally


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, method: str, path: str, body=None, timeout: float = 10.0) -> tuple[int, dict]:
    """(status, JSON body) of one request to 127.0.0.1:`port`; OSError when it cannot connect."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _alive(pid: int) -> bool:
    """The process runs (not gone, not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _stable(body):
    """An answer without the moment its model was loaded (the one field a restart changes)."""
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k != "loaded_at"}
    if isinstance(body, (list, tuple)):
        return type(body)(_stable(v) for v in body)
    return body


class ServeDrill:
    """`vaecf serve RUN` SIGKILLed at random moments: during start-up, while answering a stream
    of requests, and during a `POST /v1/admin/reload` of another run. Serve only reads: after
    every kill both run directories must hold exactly the files they held, byte for byte (no
    new, changed or temp files). A server started again afterwards must answer /readyz and
    /v1/recommend exactly as before the kills (the model's version included: it names the
    checkpoint's path, size and mtime), and a reload of the other run as before too."""

    name = "serve"

    def setup(self, root: Path, runner) -> None:

        self.root, self.runner = Path(root), runner
        data = prepare_synthetic(runner, self.root, 400, 100, 8, 40)[0]
        self.run_a, self.run_b = self.root / "runs" / "a", self.root / "runs" / "b"
        for argv in (
            ["train", "--data", data, "--out", self.run_a, "--epochs", 2, "--batch-size", 64,
             "--precision", "fp32", "--device", "cpu", "--quiet"],
            ["train", "--data", data, "--out", self.run_b, "--model", "ease", "--device", "cpu",
             "--quiet"],
        ):  # fmt: skip
            run_ok(runner, argv)
        from vaecf.data.vocab import Vocabulary

        items = Vocabulary.load(self.run_a / "items.parquet").id_of(range(3))
        self.request = {"items": [str(i) for i in items], "k": 10}
        self.files = tree_digest([self.run_a, self.run_b])
        t0 = time.perf_counter()
        proc, port = self.start()
        self.startup = time.perf_counter() - t0
        try:
            self.answers = self.answer(proc, port)
            t0 = time.perf_counter()
            self.reload_answers = self.reload(port)
            self.reload_s = time.perf_counter() - t0
        finally:
            self.stop(proc)

    def start(self, wait: bool = True):
        port = free_port()
        proc = self.runner.start(["serve", self.run_a, "--port", port, "--log-level", "warning"])
        if wait:
            self.wait_ready(proc, port)
        return proc, port

    def wait_ready(self, proc: Proc, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(proc.pid):
                raise RuntimeError(f"vaecf serve exited: {read_output(proc.stderr)[-2000:]}")
            try:
                if http(port, "GET", "/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise RuntimeError("vaecf serve did not become ready")

    def answer(self, proc: Proc, port: int) -> tuple:
        return tuple(
            _stable(x)
            for x in (
                http(port, "GET", "/readyz"),
                http(port, "POST", "/v1/recommend", self.request),
            )
        )

    def reload(self, port: int) -> tuple:
        status, body = http(port, "POST", "/v1/admin/reload", {"run": str(self.run_b)})
        return _stable((status, body)), _stable(http(port, "POST", "/v1/recommend", self.request))

    def stop(self, proc: Proc) -> int:
        with suppress_lookup():
            os.kill(proc.pid, signal.SIGKILL)
        return self.runner.wait(proc)


def _requests(port: int, body_of: Callable[[int], tuple], stop) -> None:
    """Send requests one after another (a thread) until `stop` is set or the server is gone."""
    i = 0
    while not stop.is_set():
        try:
            http(port, *body_of(i), timeout=5)
        except Exception:  # noqa: BLE001 - killed mid-answer: refused, reset, cut short
            return
        i += 1


def serve_drill(drill: ServeDrill, runner, trials: int, seed: int, max_kills: int = 2, log=print):
    """`trials` times: 1..max_kills servers, each SIGKILLed at a random moment of a random phase
    (start-up; answering requests; reloading the other run while answering), checking after
    each kill that neither run directory changed; then a fresh server must answer as before."""
    rng = random.Random(seed)
    log(f"kill drill serve: seed {seed} ({trials} trials)")
    t = Tally("kill serve")
    for trial in range(trials):
        failed = lost = False
        for k in range(rng.randint(1, max_kills)):
            kill_failed, kill_lost = _kill_once(drill, rng, t, trial, k)
            failed, lost = failed or kill_failed, lost or kill_lost
        failed = _restart(drill, t, trial) or failed
        t.trials += 1
        t.failures += failed
        t.lost += lost
    return t


def _kill_once(drill: ServeDrill, rng: random.Random, t: Tally, trial: int, k: int) -> tuple:
    """One server SIGKILLed at a random moment of a random phase: (failed, lost), noted in `t`."""
    import threading

    failed = lost = False
    recommend = ("POST", "/v1/recommend", drill.request)
    reload = ("POST", "/v1/admin/reload", {"run": str(drill.run_b)})
    phase = rng.choice(["start-up", "answering", "reload"])
    stop = threading.Event()
    sender = None
    try:
        proc, port = drill.start(wait=phase != "start-up")
    except RuntimeError as e:
        t.notes.append(f"trial {trial} kill {k}: {e}")
        return True, False
    if phase == "start-up":
        delay = rng.uniform(0.0, drill.startup * 1.1)
    else:
        first = reload if phase == "reload" else recommend
        sender = threading.Thread(
            target=_requests,
            args=(port, lambda i, first=first: first if i == 0 else recommend, stop),
        )
        sender.start()
        delay = rng.uniform(0.0, drill.reload_s * 1.5 if phase == "reload" else 0.3)
    time.sleep(max(0.0, delay - (time.perf_counter() - proc.started)) if phase ==
               "start-up" else delay)  # fmt: skip
    alive = _alive(proc.pid)
    rc = drill.stop(proc)
    stop.set()
    if sender is not None:
        sender.join(30)
    t.points += 1
    if not alive and rc != -signal.SIGKILL:
        failed = True
        t.notes.append(f"trial {trial} kill {k} ({phase}): exited {rc} by itself\n"
                       f"{read_output(proc.stderr)[-2000:]}")  # fmt: skip
    now = tree_digest([drill.run_a, drill.run_b])
    if now != drill.files:
        failed = lost = True
        changed = sorted(set(now.items()) ^ set(drill.files.items()))
        t.notes.append(f"trial {trial} kill {k} ({phase} at {delay:.3f}s): {changed}")
        drill.files = now  # report each change once
    return failed, lost


def _restart(drill: ServeDrill, t: Tally, trial: int) -> bool:
    """A fresh server must answer, and reload, as before the kills: whether it failed to."""
    failed = False
    try:
        proc, port = drill.start()
        try:
            got, got_reload = drill.answer(proc, port), drill.reload(port)
        finally:
            drill.stop(proc)
        if (got, got_reload) != (drill.answers, drill.reload_answers):
            failed = True
            t.notes.append(f"trial {trial}: restarted server answers {got} {got_reload}")
    except (RuntimeError, OSError) as e:
        failed = True
        t.notes.append(f"trial {trial} restart: {e}")
    return failed
