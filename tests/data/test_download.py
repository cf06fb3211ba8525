"""Named datasets downloaded for real, from an HTTP server on 127.0.0.1 that the test runs:
a good file is verified and cached, and every way a download can go wrong (wrong checksum, an
error status, an unreachable server, a transfer cut short) is a one-line DataError that leaves
nothing in the cache."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scratchgpt.cli import main
from scratchgpt.data import sources
from scratchgpt.errors import DataError
from tests.corpus import play_text

BODY = play_text(50_000, seed=3).encode("utf-8")
SHA256 = hashlib.sha256(BODY).hexdigest()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


ARCHIVE = _zip({"readme.txt": b"about the data", "Collection": BODY})


class Handler(BaseHTTPRequestHandler):
    """``/good.txt`` is BODY; ``/short.txt`` announces more bytes than it sends and closes;
    ``/chunked-cut.txt`` closes in the middle of a chunk; ``/stall.txt`` stops sending for a
    second; ``/status/N`` answers status N."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        self.server.requests.append(self.path)
        self.close_connection = True
        if self.path.startswith("/status/"):
            self.send_error(int(self.path.rsplit("/", 1)[1]))
        elif self.path == "/good.txt":
            self._head(200, {"Content-Length": str(len(BODY))})
            self.wfile.write(BODY)
        elif self.path == "/archive.zip":
            self._head(200, {"Content-Length": str(len(ARCHIVE))})
            self.wfile.write(ARCHIVE)
        elif self.path == "/short.txt":
            self._head(200, {"Content-Length": str(len(BODY))})
            self.wfile.write(BODY[: len(BODY) // 3])
        elif self.path == "/chunked-cut.txt":
            self._head(200, {"Transfer-Encoding": "chunked"})
            self.wfile.write(b"%x\r\n" % len(BODY) + BODY[:1000])
        elif self.path == "/stall.txt":
            self._head(200, {"Content-Length": str(len(BODY))})
            self.wfile.write(BODY[:1000])
            self.wfile.flush()
            time.sleep(1.0)
        else:
            self.send_error(404)

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in {"Content-Type": "text/plain", **headers}.items():
            self.send_header(key, value)
        self.end_headers()

    def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's signature)
        pass  # keep the test output clean


class Server:
    """Handler served by a thread on 127.0.0.1, at a free port; ``requests`` lists the paths
    asked for."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.requests = self.requests = []
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # a proxy set for the internet must not apply
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    server = Server()
    yield server
    server.stop()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache directory of this test alone."""
    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def serve_dataset(monkeypatch, server: Server, path: str, sha256: str | None = SHA256) -> None:
    """Register the named dataset ``testdata`` at ``server.url + path``."""
    monkeypatch.setitem(sources.DATASETS, "testdata", sources.NamedDataset(
        name="testdata", filename="testdata.txt", url=server.url + path, sha256=sha256,
        description="a generated play served by the test"))


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.is_file())


def one_line_cli_error(capsys, tmp_path) -> str:
    """``scratchgpt prepare --dataset testdata`` fails with one line and exit code 2."""
    code = main(["prepare", "--dataset", "testdata", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
    return err


def test_download_is_verified_cached_and_reused_offline(server, cache, monkeypatch, tmp_path):
    serve_dataset(monkeypatch, server, "/good.txt")
    path = sources.fetch_named("testdata")
    assert path == cache / "downloads" / "testdata.txt"
    assert path.read_bytes() == BODY and sources.sha256_file(path) == SHA256
    assert files_in(cache) == ["testdata.txt"]  # no temporary file left beside it
    assert server.requests == ["/good.txt"]
    server.stop()
    assert sources.fetch_named("testdata") == path  # from the cache: the server is gone
    assert main(["prepare", "--dataset", "testdata", "--out", str(tmp_path / "d")]) == 0
    assert server.requests == ["/good.txt"]


def test_data_dir_comes_before_cache_and_network(server, cache, monkeypatch, tmp_path):
    serve_dataset(monkeypatch, server, "/good.txt")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "testdata.txt").write_bytes(BODY)
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path / "mine"))
    assert sources.fetch_named("testdata") == tmp_path / "mine" / "testdata.txt"
    assert server.requests == [] and not cache.exists()


def test_a_wrong_file_in_the_data_dir_is_refused_and_kept(server, cache, monkeypatch,
                                                           tmp_path):
    """The file is the user's: the refusal says what the folder should hold, not to delete
    it, and it stays."""
    serve_dataset(monkeypatch, server, "/good.txt", sha256="0" * 64)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "testdata.txt").write_bytes(BODY)
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path / "mine"))
    with pytest.raises(DataError, match="SCRATCHGPT_DATA_DIR should hold the file from") as e:
        sources.fetch_named("testdata")
    assert "delete" not in str(e.value)
    assert (tmp_path / "mine" / "testdata.txt").read_bytes() == BODY
    assert server.requests == []


def test_wrong_checksum_is_an_error_and_nothing_is_kept(server, cache, monkeypatch, tmp_path,
                                                        capsys):
    serve_dataset(monkeypatch, server, "/good.txt", sha256="0" * 64)
    with pytest.raises(DataError, match="has sha256 .*, expected 000000000000") as e:
        sources.fetch_named("testdata")
    assert "\n" not in str(e.value)
    assert files_in(cache) == []
    assert "sha256" in one_line_cli_error(capsys, tmp_path)
    assert files_in(cache) == [] and len(server.requests) == 2  # tried again: nothing cached


@pytest.mark.parametrize("status", [404, 500])
def test_error_status_is_a_one_line_error(server, cache, monkeypatch, tmp_path, capsys, status):
    serve_dataset(monkeypatch, server, f"/status/{status}")
    with pytest.raises(DataError, match=f"HTTP {status}") as e:
        sources.fetch_named("testdata")
    assert "\n" not in str(e.value) and "SCRATCHGPT_DATA_DIR" in str(e.value)
    assert files_in(cache) == []
    assert f"HTTP {status}" in one_line_cli_error(capsys, tmp_path)


@pytest.mark.parametrize("sha256", [SHA256, None], ids=["pinned", "unpinned"])
@pytest.mark.parametrize("path", ["/short.txt", "/chunked-cut.txt"])
def test_interrupted_transfer_is_detected(server, cache, monkeypatch, tmp_path, capsys, path,
                                          sha256):
    # Detected by the transfer itself, not by the checksum: an unpinned dataset has none.
    serve_dataset(monkeypatch, server, path, sha256=sha256)
    with pytest.raises(DataError, match="transfer interrupted") as e:
        sources.fetch_named("testdata")
    assert "\n" not in str(e.value)
    assert files_in(cache) == []
    assert "transfer interrupted" in one_line_cli_error(capsys, tmp_path)
    assert files_in(cache) == []


def test_unreachable_server_is_a_one_line_error(server, cache, monkeypatch, tmp_path, capsys):
    serve_dataset(monkeypatch, server, "/good.txt")
    server.stop()
    with pytest.raises(DataError, match="not available offline") as e:
        sources.fetch_named("testdata")
    assert "\n" not in str(e.value)
    assert files_in(cache) == []
    one_line_cli_error(capsys, tmp_path)


def test_offline_with_a_data_dir_set_says_the_file_is_not_in_it(server, cache, monkeypatch,
                                                                 tmp_path):
    """It said to set SCRATCHGPT_DATA_DIR though it was set (to a folder without the file)."""
    serve_dataset(monkeypatch, server, "/good.txt")
    server.stop()
    monkeypatch.delenv("SCRATCHGPT_DATA_DIR", raising=False)
    with pytest.raises(DataError) as e:
        sources.fetch_named("testdata")
    assert str(e.value).endswith("; put testdata.txt in a folder and set SCRATCHGPT_DATA_DIR "
                                 "to it"), e.value
    (tmp_path / "mine").mkdir()
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path / "mine"))
    with pytest.raises(DataError) as e:
        sources.fetch_named("testdata")
    assert str(e.value).endswith(f"; SCRATCHGPT_DATA_DIR is {tmp_path / 'mine'}, which holds "
                                 "no testdata.txt: put it there"), e.value
    assert files_in(cache) == [] and list((tmp_path / "mine").iterdir()) == []


@pytest.mark.parametrize("path, needle", [("/good.txt", None), ("/short.txt", "interrupted"),
                                          ("/status/404", "HTTP 404"), ("/stall.txt", "timed out")])
def test_download_writes_the_whole_file_or_nothing(server, tmp_path, path, needle):
    dest = tmp_path / "dl" / "file.txt"
    dest.parent.mkdir()
    dest.write_bytes(b"the previous good file")
    if needle is None:
        sources.download(server.url + path, dest, timeout=5.0)
        assert dest.read_bytes() == BODY
    else:
        with pytest.raises(DataError, match=needle):
            sources.download(server.url + path, dest, timeout=0.3)
        assert dest.read_bytes() == b"the previous good file"  # bad input never loses data
    assert files_in(tmp_path / "dl") == ["file.txt"]


def test_bad_url_is_a_one_line_error(tmp_path):
    for url in ("not a url", "http://"):
        with pytest.raises(DataError, match="download of .* failed") as e:
            sources.download(url, tmp_path / "f.txt")
        assert "\n" not in str(e.value)
    assert files_in(tmp_path) == []


def serve_archive(monkeypatch, server: Server, member: str, sha256: str = SHA256) -> None:
    monkeypatch.setitem(sources.DATASETS, "zipped", sources.NamedDataset(
        name="zipped", filename="Collection", url=server.url + "/archive.zip", sha256=sha256,
        description="a file inside a zip archive", archive_member=member,
        local_names=("zipped.tsv",)))


def test_a_zip_member_is_extracted_verified_and_cached(server, cache, monkeypatch, tmp_path):
    serve_archive(monkeypatch, server, "Collection")
    path = sources.fetch_named("zipped")
    assert path == cache / "downloads" / "Collection" and path.read_bytes() == BODY
    assert files_in(cache) == ["Collection"]  # the archive itself is not kept
    server.stop()
    assert sources.fetch_named("zipped") == path


def test_a_zip_member_with_another_checksum_or_missing_is_refused(server, cache, monkeypatch):
    serve_archive(monkeypatch, server, "Collection", sha256="0" * 64)
    with pytest.raises(DataError, match="has sha256"):
        sources.fetch_named("zipped")
    assert files_in(cache) == []
    serve_archive(monkeypatch, server, "Nothing")
    with pytest.raises(DataError, match="the archive holds no 'Nothing'"):
        sources.fetch_named("zipped")
    assert files_in(cache) == []


def test_a_local_copy_under_another_name(server, cache, monkeypatch, tmp_path):
    serve_archive(monkeypatch, server, "Collection")
    (tmp_path / "zipped.tsv").write_bytes(BODY)
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path))
    assert sources.fetch_named("zipped") == tmp_path / "zipped.tsv"
    assert server.requests == []


@pytest.mark.parametrize("argv", [["prepare", "--dataset", "nosuch", "--out", "o"],
                                  ["train", "--dataset", "nosuch", "--out", "o"]])
def test_an_unknown_dataset_lists_every_name_that_works(capsys, argv):
    """The offline default is a named dataset too, and is listed with the others."""
    from tests.cli_errors import error_of

    line = error_of(capsys, argv)
    assert all(name in line for name in sources.DATASET_NAMES), line
    assert "python-stdlib" in line


def test_a_folder_named_like_a_dataset_does_not_hide_it(server, cache, monkeypatch, tmp_path):
    """`--dataset testdata` beside a folder of one's own called testdata (raw text, not a
    prepared dataset) takes the named dataset, saying so; a prepared folder still wins."""
    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.data.resolve import resolve_dataset

    serve_dataset(monkeypatch, server, "/good.txt")
    monkeypatch.setattr(sources, "DATASET_NAMES", (*sources.DATASET_NAMES, "testdata"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "testdata").mkdir()
    (tmp_path / "testdata" / "notes.txt").write_text("my own notes")
    said: list[str] = []
    data, name = resolve_dataset("testdata", log=said.append)
    assert name == "testdata" and data.directory.is_relative_to(cache)
    assert "not a prepared dataset" in said[0]
    (tmp_path / "testdata" / "notes.txt").unlink()
    prepare_text("a prepared folder of that name " * 20, tmp_path / "testdata", "char")
    data, _ = resolve_dataset("testdata", log=said.append)
    assert data.directory == Path("testdata")
