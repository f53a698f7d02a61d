"""`python -m vaecf` and `torchrun -m vaecf`."""

from vaecf.cli import main

raise SystemExit(main())
