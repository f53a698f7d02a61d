"""Downloads and raw files: verified, atomic, resumable fetches; finding a dataset's raw files
in what the user passes as `--source` (archives extracted safely by data/archive.py).

A download streams into `.<name>.part` beside its target; an interruption keeps the part file and
the next attempt resumes it with an HTTP Range request (or restarts it when the server ignores
ranges). Only a file whose digest matches the published one (or, where none is published, any
complete file) is renamed into place, and its SHA-256 is recorded in `download.json`.
HTTP is urllib's (the standard library): it speaks http, https and file URLs and lets us resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from vaecf.data.archive import ARCHIVE_SUFFIXES, extract, is_archive
from vaecf.data.datasets import DatasetSpec, RemoteFile, raw_dir
from vaecf.data.prepared import sha256_file
from vaecf.errors import DataError
from vaecf.storage.safewrite import write_json

CHUNK = 1 << 20
RECORD = "download.json"


# -- digests ------------------------------------------------------------------------------------
def digests(path: str | os.PathLike) -> dict[str, str]:
    """{'md5': ..., 'sha256': ...} of a file, in one pass."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK * 4):
            md5.update(block)
            sha.update(block)
    return {"md5": md5.hexdigest(), "sha256": sha.hexdigest()}


def parse_checksum_file(text: str, filename: str | None = None) -> str:
    """The digest in a `.md5`/`.sha256` file: BSD style `MD5 (name) = hex` or GNU `hex  name`."""
    for line in text.splitlines():
        line = line.strip()
        m = re.fullmatch(r"(?:MD5|SHA256|SHA-256)\s*\((.+)\)\s*=\s*([0-9a-fA-F]{32,64})", line)
        if m and (filename is None or Path(m.group(1)).name == filename):
            return m.group(2).lower()
        m = re.fullmatch(r"([0-9a-fA-F]{32}|[0-9a-fA-F]{64})(?:\s+\*?(.+))?", line)
        if m and (filename is None or m.group(2) is None or Path(m.group(2)).name == filename):
            return m.group(1).lower()
    raise DataError(f"no checksum for {filename or 'the file'} in checksum file text {text[:80]!r}")


def verify(path: Path, remote: RemoteFile, seen: dict[str, str] | None = None) -> dict[str, str]:
    """Digests of `path`; a DataError naming the file and both digests when one differs."""
    seen = seen or digests(path)
    for algo in ("md5", "sha256"):
        want = getattr(remote, algo)
        if want and seen[algo] != want.lower():
            raise DataError(
                f"{path.name}: {algo.upper()} is {seen[algo]}, but the published {algo.upper()} "
                f"is {want}; the file is corrupt or not the official one (it was not kept). "
                "Download it again, or pass --url for another mirror"
            )
    return seen


DIGESTS = "digests.json"  # sha256 cache of raw files: {abs path: [size, mtime_ns, sha256]}


def cached_sha256(files: list[Path], cache_dir: Path) -> dict[str, str] | None:
    """The raw files' SHA-256 sums from the dataset's cache, or None where any file is not
    there as it was hashed (size and mtime)."""
    try:
        cache = json.loads((cache_dir / DIGESTS).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    out = {}
    for f in files:
        st = f.stat()
        hit = cache.get(str(f.resolve()))
        if not hit or hit[:2] != [st.st_size, st.st_mtime_ns]:
            return None
        out[str(f)] = hit[2]
    return out


def store_sha256(sums: dict[str, str], cache_dir: Path) -> None:
    """Record the files' sums (with each one's size and mtime) in the dataset's cache."""
    try:
        cache = json.loads((cache_dir / DIGESTS).read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    for name, digest in sums.items():
        st = Path(name).stat()
        cache[str(Path(name).resolve())] = [st.st_size, st.st_mtime_ns, digest]
    write_json(cache_dir / DIGESTS, cache)


def hash_files(files: list[Path]) -> dict[str, str]:
    return {str(f): sha256_file(f) for f in files}


# -- fetching -----------------------------------------------------------------------------------
def _unreachable(error: Exception) -> bool:
    """A failure to reach the host at all (name lookup, refused, no route), not a cut-off."""
    import socket

    reason = getattr(error, "reason", error)
    return isinstance(reason, (socket.gaierror, ConnectionRefusedError, TimeoutError)) or (
        isinstance(reason, OSError) and reason.errno in (101, 113)  # ENETUNREACH, EHOSTUNREACH
    )


def _progress(total: int | None, initial: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=name,
        file=sys.stderr,
        leave=False,
        disable=None,  # no bar when stderr is not a terminal (a log file)
    )


def _attempt(url: str, part: Path, timeout: float, progress: bool) -> None:
    """One attempt: stream `url` into `part`, resuming from its current size if the server can."""
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "vaecf"})
    if have and url.startswith(("http://", "https://")):
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to send: the part is complete (or bogus)
            return
        raise
    with resp:
        status = getattr(resp, "status", 200)
        resumed = have and status == 206
        if not resumed:
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        bar = _progress(total, have, part.name.lstrip(".").removesuffix(".part"), progress)
        got = have
        try:
            with open(part, "ab" if resumed else "wb") as f:
                while block := resp.read(CHUNK):
                    f.write(block)
                    got += len(block)
                    if bar is not None:
                        bar.update(len(block))
        finally:
            if bar is not None:
                bar.close()
        if total is not None and got < total:
            raise http.client.IncompleteRead(b"", total - got)


def fetch(
    remote: RemoteFile,
    dest_dir: Path,
    url: str | None = None,
    retries: int = 3,
    timeout: float = 60.0,
    progress: bool = True,
) -> dict:
    """Fetch `remote` into dest_dir (skipped when a verified copy is there); returns its record."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / remote.filename
    record_path = dest_dir / RECORD
    records = _records(record_path)
    if dest.is_file() and remote.filename in records:
        rec = records[remote.filename]
        if rec.get("bytes") == dest.stat().st_size:
            return rec
    url = url or remote.url
    part = dest_dir / f".{remote.filename}.part"
    _download(url, part, remote.filename, retries, timeout, progress)
    try:
        seen = verify(part, remote)
    except DataError:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest)
    rec = {
        "url": url,
        "bytes": dest.stat().st_size,
        **seen,
        "verified": "md5" if remote.md5 else ("sha256" if remote.sha256 else "none published"),
        "downloaded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    records[remote.filename] = rec
    write_json(record_path, records)
    return rec


def _download(url: str, part: Path, filename: str, retries: int, timeout: float, progress: bool):
    """`url` into `part` (resumed where a part is there), retried with back-off; a DataError
    that says what to do where it cannot be had (the partial file kept for the next run)."""
    error: Exception | None = None
    for attempt in range(retries + 1):
        try:
            _attempt(url, part, timeout, progress)
            error = None
            break
        except urllib.error.HTTPError as e:
            raise DataError(
                f"downloading {url} failed: HTTP {e.code} {e.reason}; check the URL "
                "or pass --url for a mirror, or --source for a file you have"
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            error = e
            if attempt < retries:
                time.sleep(min(2**attempt, 10) * 0.5)
    if error is not None:
        size = part.stat().st_size if part.exists() else 0
        if size == 0 and _unreachable(error):
            part.unlink(missing_ok=True)
            host = urllib.parse.urlsplit(url).hostname or url
            raise DataError(
                f"cannot reach {host} ({getattr(error, 'reason', error)}): no network, or "
                "it is blocked here. Fetch the file on a machine that can and use it: "
                f"`vaecf prepare NAME --source PATH` (the archive or its files), or "
                f"`vaecf download NAME --url file:///PATH/{filename}` to verify and keep it"
            )
        raise DataError(
            f"downloading {url} was interrupted after {size} bytes ({error}); the partial file "
            f"{part} is kept: run the command again to resume it"
        )


def _records(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def download(spec: DatasetSpec, root=None, url: str | None = None, progress: bool = True) -> dict:
    """Fetch every file of `spec` into <root>/raw/<name>/; {filename: record}."""
    if not spec.files:
        raise DataError(f"{spec.name} has no official download. {spec.manual}")
    if url and len(spec.files) > 1:
        raise DataError(
            f"{spec.name} has {len(spec.files)} files; --url works for one-file "
            "datasets only: download them yourself and pass --source DIR"
        )
    d = raw_dir(spec.name, root)
    return {f.filename: fetch(f, d, url=url, progress=progress) for f in spec.files}


# -- finding raw files ---------------------------------------------------------------------------
def _matches(name: str, patterns) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, p) for p in patterns)


def _find(directory: Path, patterns) -> list[Path]:
    found = [
        p
        for p in directory.rglob("*")
        if p.is_file() and not p.name.startswith(".") and _matches(p.name, patterns)
    ]
    return sorted(found)


def locate(
    spec: DatasetSpec,
    source: str | os.PathLike | None = None,
    root=None,
    url: str | None = None,
    progress: bool = True,
) -> tuple[list[Path], dict]:
    """The raw files to parse, and a description of where they came from.

    Without `source`: download (verified) into <root>/raw/<name>/ and extract what is needed.
    With `source`: a raw file, a directory holding the raw files (searched recursively), or an
    archive (verified when it is the official one and a checksum is published).
    """
    d = raw_dir(spec.name, root)
    origin: dict = {}
    if source is None:
        records = download(spec, root, url=url, progress=progress)
        origin["downloads"] = records
        candidates = [d / f for f in records]
    else:
        src = Path(source).expanduser()
        if not src.exists():
            raise DataError(
                f"--source {src} does not exist; pass the downloaded archive, the "
                f"raw file(s) ({', '.join(spec.raw_files)}) or a directory with them"
            )
        origin["source"] = str(src.resolve())
        candidates = [src]
    files: list[Path] = []
    for cand in candidates:
        if cand.is_dir():
            files += _find(cand, spec.raw_files)
            if not files:  # maybe only the archives are there
                for arc in _find(cand, [f"*{s}" for s in ARCHIVE_SUFFIXES]):
                    files += _from_archive(spec, arc, d)
        elif _matches(cand.name, spec.raw_files) or (source is not None and not is_archive(cand)):
            files.append(cand)  # a file passed by name is read as the format, whatever its name
        elif is_archive(cand):
            official = {f.filename: f for f in spec.files}
            if source is not None and cand.name in official:
                rec = verify(cand, official[cand.name])
                origin.setdefault("archive_digests", {})[cand.name] = rec
            files += _from_archive(spec, cand, d)
        else:
            raise DataError(
                f"{cand} is not one of {spec.name}'s raw files "
                f"({', '.join(spec.raw_files)}) nor an archive holding them"
            )
    expanded: list[Path] = []
    for f in files:
        expanded += _from_archive(spec, f, d) if is_archive(f) else [f]
    files = expanded
    if not files:
        raise DataError(
            f"no {spec.name} raw files ({', '.join(spec.raw_files)}) found in "
            f"{source or d}. {spec.manual}".strip()
        )
    return _dedupe(spec, files), origin


def _from_archive(spec: DatasetSpec, archive: Path, raw: Path) -> list[Path]:
    target = raw / "extracted" / archive.name
    done = target / ".complete"
    # the item names file (MovieLens' movies.csv) is extracted beside the raw files; the marker
    # says so, so that an extraction made before names were read is made again, once
    extra = (spec.names,) if spec.names and spec.names != "inline" else ()
    mark = str(archive.stat().st_size) + (f" +{spec.names}" if extra else "")
    if done.is_file() and done.read_text().strip() == mark:
        files = _find(target, spec.raw_files)
    else:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(target)
        files = extract(
            archive,
            target,
            wanted=lambda n: _matches(n, spec.raw_files + extra) or n.endswith(".tar"),
        )
        files = [f for f in files if not _matches(f.name, extra)]
        done.write_text(mark)
    # nested archives (Netflix: nf_prize_dataset.tar.gz -> training_set.tar -> mv_*.txt)
    nested = [f for f in files if is_archive(f) and not _matches(f.name, ("*.txt", "*.csv"))]
    out = [f for f in files if f not in nested]
    for inner in nested:
        out += _from_archive(spec, inner, raw)
    return out


def _dedupe(spec: DatasetSpec, files: list[Path]) -> list[Path]:
    """One copy of each raw file; for Netflix keep one layout (mv_*.txt preferred)."""
    seen: dict[str, Path] = {}
    for f in sorted(files):
        seen.setdefault(f.name, f)
    files = sorted(seen.values(), key=lambda p: p.name)
    if spec.parser == "netflix":
        mv = [f for f in files if f.name.startswith("mv_")]
        files = mv or [f for f in files if f.name.startswith("combined_data_")]
    return files
