"""download: verified, atomic, resumable fetches from a local HTTP server; safe extraction."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from vaecf.data import archive
from vaecf.data import download as dl
from vaecf.data.datasets import DatasetSpec, RemoteFile
from vaecf.errors import DataError

PAYLOAD = os.urandom(300_000) + b"userId,movieId\n" * 1000


class Server:
    """127.0.0.1 HTTP server over an in-memory {path: bytes} map.

    `cut[path] = n` sends the full Content-Length but closes after n bytes (an interruption);
    `ranges = False` ignores Range headers (answers 200 with the whole body)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.ranges = True
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and server.ranges:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                n = server.cut.pop(self.path, None)
                self.wfile.write(part if n is None else part[: max(0, n - start)])
                if n is not None:
                    self.wfile.flush()
                    self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    s.files["/data.zip"] = PAYLOAD
    yield s
    s.close()


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_checksum_match_writes_file_and_record(server, tmp_path):
    remote = RemoteFile(server.url("/data.zip"), "data.zip", md5=md5(PAYLOAD))
    rec = dl.fetch(remote, tmp_path, progress=False)
    assert (tmp_path / "data.zip").read_bytes() == PAYLOAD
    assert rec["md5"] == md5(PAYLOAD) and rec["sha256"] == sha256(PAYLOAD)
    assert rec["verified"] == "md5" and rec["bytes"] == len(PAYLOAD)
    assert json.loads((tmp_path / "download.json").read_text())["data.zip"] == rec
    assert listing(tmp_path) == ["data.zip", "download.json"]
    n = len(server.requests)
    assert dl.fetch(remote, tmp_path, progress=False) == rec  # cached: no new request
    assert len(server.requests) == n


def test_sha256_published_and_none_published(server, tmp_path):
    rec = dl.fetch(
        RemoteFile(server.url("/data.zip"), "a.zip", sha256=sha256(PAYLOAD)),
        tmp_path,
        progress=False,
    )
    assert rec["verified"] == "sha256"
    rec = dl.fetch(RemoteFile(server.url("/data.zip"), "b.zip"), tmp_path, progress=False)
    assert rec["verified"] == "none published" and rec["sha256"] == sha256(PAYLOAD)


def test_checksum_mismatch_names_file_and_both_digests(server, tmp_path):
    wrong = "0" * 32
    remote = RemoteFile(server.url("/data.zip"), "data.zip", md5=wrong)
    with pytest.raises(DataError) as e:
        dl.fetch(remote, tmp_path, progress=False)
    msg = str(e.value)
    assert "data.zip" in msg and wrong in msg and md5(PAYLOAD) in msg
    assert listing(tmp_path) == []  # nothing kept, no part file


def test_interrupted_download_resumes_with_range(server, tmp_path):
    server.cut["/data.zip"] = 100_000
    remote = RemoteFile(server.url("/data.zip"), "data.zip", md5=md5(PAYLOAD))
    with pytest.raises(DataError, match="interrupted after 100000 bytes.*run the command again"):
        dl.fetch(remote, tmp_path, retries=0, progress=False)
    assert listing(tmp_path) == [".data.zip.part"]
    assert not (tmp_path / "data.zip").exists()
    rec = dl.fetch(remote, tmp_path, retries=0, progress=False)
    assert server.requests[-1] == ("/data.zip", "bytes=100000-")
    assert (tmp_path / "data.zip").read_bytes() == PAYLOAD and rec["md5"] == md5(PAYLOAD)
    assert listing(tmp_path) == ["data.zip", "download.json"]


def test_interruption_is_retried_automatically(server, tmp_path):
    server.cut["/data.zip"] = 50_000
    remote = RemoteFile(server.url("/data.zip"), "data.zip", md5=md5(PAYLOAD))
    dl.fetch(remote, tmp_path, retries=1, progress=False)
    assert [r for _, r in server.requests] == [None, "bytes=50000-"]
    assert (tmp_path / "data.zip").read_bytes() == PAYLOAD


def test_server_without_ranges_restarts_cleanly(server, tmp_path):
    server.ranges = False
    (tmp_path / ".data.zip.part").write_bytes(b"garbage from an older attempt")
    remote = RemoteFile(server.url("/data.zip"), "data.zip", md5=md5(PAYLOAD))
    dl.fetch(remote, tmp_path, progress=False)
    assert (tmp_path / "data.zip").read_bytes() == PAYLOAD


def test_stale_part_with_wrong_bytes_is_caught_by_checksum(server, tmp_path):
    (tmp_path / ".data.zip.part").write_bytes(b"x" * 1000)  # resumed onto wrong bytes
    remote = RemoteFile(server.url("/data.zip"), "data.zip", md5=md5(PAYLOAD))
    with pytest.raises(DataError, match="MD5"):
        dl.fetch(remote, tmp_path, progress=False)
    assert listing(tmp_path) == []  # the bad part is gone: the next run starts over
    dl.fetch(remote, tmp_path, progress=False)
    assert (tmp_path / "data.zip").read_bytes() == PAYLOAD


def test_http_error_and_file_url_and_mirror(server, tmp_path):
    with pytest.raises(DataError, match="HTTP 404.*--url"):
        dl.fetch(RemoteFile(server.url("/nope.zip"), "nope.zip"), tmp_path, progress=False)
    src = tmp_path / "mirror" / "data.zip"
    src.parent.mkdir()
    src.write_bytes(PAYLOAD)
    remote = RemoteFile(server.url("/nope.zip"), "data.zip", md5=md5(PAYLOAD))
    rec = dl.fetch(remote, tmp_path / "raw", url=src.as_uri(), progress=False)
    assert rec["url"] == src.as_uri() and (tmp_path / "raw" / "data.zip").is_file()


@pytest.mark.parametrize(
    "text",
    [
        "MD5 (ml-20m.zip) = cd245b17a1ae2cc31bb14903e1204af3\n",
        "cd245b17a1ae2cc31bb14903e1204af3  ml-20m.zip\n",
        "cd245b17a1ae2cc31bb14903e1204af3 *ml-20m.zip\n",
        "CD245B17A1AE2CC31BB14903E1204AF3\n",
    ],
    ids=["bsd", "gnu", "gnu_binary", "bare"],
)
def test_parse_checksum_file(text):
    assert dl.parse_checksum_file(text, "ml-20m.zip") == "cd245b17a1ae2cc31bb14903e1204af3"


def test_parse_checksum_file_wrong_name():
    with pytest.raises(DataError):
        dl.parse_checksum_file("MD5 (other.zip) = cd245b17a1ae2cc31bb14903e1204af3", "ml-20m.zip")


# -- archives -------------------------------------------------------------------------------------
def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _tar(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            t.addfile(info)
    return path


def test_extract_zip_only_wanted_members(tmp_path):
    arc = _zip(tmp_path / "ml.zip", {"ml/ratings.csv": b"a", "ml/movies.csv": b"b"})
    out = archive.extract(arc, tmp_path / "x", wanted=lambda n: n == "ratings.csv")
    assert out == [tmp_path / "x" / "ml" / "ratings.csv"]
    assert listing(tmp_path / "x") == ["ml"] and listing(tmp_path / "x" / "ml") == ["ratings.csv"]


@pytest.mark.parametrize(
    "name", ["../evil.csv", "/tmp/evil.csv", "a/../../evil.csv", "..\\evil.csv"]
)
@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_path_traversal_is_refused(tmp_path, name, kind):
    members = {"ok/ratings.csv": b"fine", name: b"evil"}
    arc = (
        _zip(tmp_path / "a.zip", members) if kind == "zip" else _tar(tmp_path / "a.tar.gz", members)
    )
    target = tmp_path / "t"
    with pytest.raises(DataError, match="outside the target directory"):
        archive.extract(arc, target)
    assert listing(target) == []  # nothing half-extracted
    assert not (tmp_path / "evil.csv").exists()


def test_tar_symlink_is_refused(tmp_path):
    arc = _tar(tmp_path / "a.tar.gz", {"d/ratings.csv": b"x"}, links={"d/link.csv": "/etc/passwd"})
    with pytest.raises(DataError, match="link"):
        archive.extract(arc, tmp_path / "t")
    assert listing(tmp_path / "t") == []


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_truncated_archive_is_a_clear_error(tmp_path, kind):
    members = {"d/ratings.csv": os.urandom(200_000)}
    arc = (
        _zip(tmp_path / "a.zip", members) if kind == "zip" else _tar(tmp_path / "a.tar.gz", members)
    )
    data = arc.read_bytes()
    arc.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="truncated or corrupt"):
        archive.extract(arc, tmp_path / "t")
    assert listing(tmp_path / "t") == []


def test_corrupt_zip_member_crc(tmp_path):
    arc = _zip(tmp_path / "a.zip", {"d/ratings.csv": b"userId,movieId\n" * 5000})
    data = bytearray(arc.read_bytes())
    data[100] ^= 0xFF  # inside the compressed member
    arc.write_bytes(bytes(data))
    with pytest.raises(DataError, match="truncated or corrupt"):
        archive.extract(arc, tmp_path / "t")
    assert listing(tmp_path / "t") == []


# -- locate: the whole download -> verify -> extract path ----------------------------------------
def test_locate_downloads_verifies_and_extracts(server, tmp_path):
    arc = _zip(
        tmp_path / "ml-test.zip",
        {"ml-test/ratings.csv": b"userId,movieId\n1,2\n", "ml-test/tags.csv": b"t"},
    )
    server.files["/ml-test.zip"] = arc.read_bytes()
    spec = DatasetSpec(
        name="ml-test",
        title="t",
        parser="movielens-csv",
        raw_files=("ratings.csv",),
        files=(RemoteFile(server.url("/ml-test.zip"), "ml-test.zip", md5=md5(arc.read_bytes())),),
    )
    files, origin = dl.locate(spec, root=tmp_path / "home", progress=False)
    raw = tmp_path / "home" / "raw" / "ml-test"
    assert files == [raw / "extracted" / "ml-test.zip" / "ml-test" / "ratings.csv"]
    assert origin["downloads"]["ml-test.zip"]["verified"] == "md5"
    # --source with the official archive name: verified against the published checksum
    (tmp_path / "src").mkdir()
    bad = _zip(tmp_path / "src" / "ml-test.zip", {"ml-test/ratings.csv": b"userId,movieId\n9,9\n"})
    with pytest.raises(DataError, match="MD5"):
        dl.locate(spec, source=bad, root=tmp_path / "home2", progress=False)
    with pytest.raises(DataError, match="does not exist"):
        dl.locate(spec, source=tmp_path / "missing", root=tmp_path / "home2", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no ml-test raw files"):
        dl.locate(spec, source=tmp_path / "empty", root=tmp_path / "home2", progress=False)
    other = tmp_path / "my-ratings.txt"  # any file passed by name is read as the format
    other.write_text("x")
    assert dl.locate(spec, source=other, root=tmp_path / "home2", progress=False)[0] == [other]


def test_an_unreachable_host_says_how_to_use_a_local_file(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteFile(f"http://127.0.0.1:{port}/data.zip", "data.zip", md5=md5(PAYLOAD))
    with pytest.raises(DataError, match="cannot reach 127.0.0.1") as e:
        dl.fetch(remote, tmp_path, retries=0, progress=False)
    assert "--source" in str(e.value) and "file:///" in str(e.value)
    assert listing(tmp_path) == []  # no empty partial file left behind
