"""`python -m vaecf` and `torchrun -m vaecf`."""

from vaecf.cli import command

raise SystemExit(command())
