"""What test files import: quiet, reproducible CPU training settings; the CLI run in process."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import vaecf
from vaecf.cli import main


def cpu_config(**kw) -> vaecf.TrainConfig:
    """Training settings for a quiet CPU run in fp32; `kw` sets the rest (seed, epochs, ...)."""
    return vaecf.TrainConfig(**{"device": "cpu", "precision": "fp32", "progress": False, **kw})


def cli_in_process(args: list) -> tuple[int, str]:
    """`vaecf ARGS` through the real entry point in this process: its exit code and stderr."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()
