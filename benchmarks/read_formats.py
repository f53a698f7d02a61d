"""Wall time and peak memory of `vaecf prepare csv` on a review dump in each format it reads.

    python benchmarks/read_formats.py [--records 5000000] [--workdir /tmp/readbench]

Writes an Amazon-like review dump (reviewerID, asin, overall and a review text a record) as
CSV, JSON Lines and gzipped JSON Lines, and prepares each in its own `vaecf prepare csv`
process (`--min-rating 4`): wall seconds and that process's peak resident memory (file pages it
mapped included). The gzipped file is prepared twice: as vaecf reads it (above
`data.files.IN_MEMORY` compressed bytes it is unpacked into a temp file and read from disk) and
with the whole file unpacked in memory (that threshold raised past its size), the way a
compressed file was read before. This process holds no data and imports no torch: each child
is measured from a small start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITE = """
import gzip, sys
from pathlib import Path
import numpy as np, polars as pl
from vaecf.bench import hardware
from vaecf.data import files
n, work = int(sys.argv[1]), Path(sys.argv[2])
rng = np.random.default_rng(1)
pl.DataFrame({
    "reviewerID": pl.Series(rng.integers(0, max(n // 16, 50), n)).cast(pl.String),
    "asin": pl.Series(rng.zipf(1.3, n) % max(n // 60, 20)).cast(pl.String),
    "overall": rng.integers(1, 6, n).astype(float),
    "reviewText": ["lorem ipsum dolor sit amet, consectetur adipiscing elit"] * n,
}).pipe(lambda df: (df.write_csv(work / "reviews.csv"), df.write_ndjson(work / "reviews.jsonl")))
gz = work / "reviews.jsonl.gz"
gz.write_bytes(gzip.compress((work / "reviews.jsonl").read_bytes(), 1))
mb = lambda p: (work / p).stat().st_size / 1e6
print(f"{hardware.machine()}; {n:,} records, {mb('reviews.jsonl'):.0f} MB as JSON Lines, "
      f"{mb('reviews.jsonl.gz'):.0f} MB gzipped")
print("disk" if gz.stat().st_size > files.IN_MEMORY else "memory (below IN_MEMORY)")
"""

PREPARE = """
import sys
from vaecf.data import files
from vaecf.cli import main
if sys.argv[1] == "memory":
    files.IN_MEMORY = 1 << 62
sys.exit(main(["prepare", "csv", "--path", sys.argv[2], "--min-rating", "4", "--out", sys.argv[3]]))
"""


def prepare(how: str, path: Path, out: Path) -> tuple[float, float]:
    """(wall s, peak resident GiB) of one `vaecf prepare csv` child (its own rusage)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", PREPARE, how, str(path), str(out)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            err.seek(0)
            raise SystemExit(f"{path.name} ({how}): {err.read().decode().strip()}")
    return wall, usage.ru_maxrss / 2**20  # KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/readbench"))
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    a.workdir.mkdir(parents=True)
    written = subprocess.run(
        [sys.executable, "-c", WRITE, str(a.records), str(a.workdir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    print(written[0])
    csv, jsonl, gz = (a.workdir / f"reviews.{s}" for s in ("csv", "jsonl", "jsonl.gz"))
    cases = [("csv", csv, "-"), ("jsonl", jsonl, "-"), ("jsonl.gz", gz, written[1])]
    cases.append(("jsonl.gz", gz, "memory"))
    print("| file | unpacked | wall s | peak resident GiB |")
    print("|---|---|---:|---:|")
    for n, (name, path, how) in enumerate(cases):
        wall, peak = prepare(how, path, a.workdir / f"out{n}")
        print(f"| {name} | {how} | {wall:.1f} | {peak:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
