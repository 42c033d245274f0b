"""The parameters' gateway stand-in (standins/paramserve.py): a real server on 127.0.0.1, in-process, and
its command line as a real child.

Promises: every GET/HEAD of any path answers ``size`` bytes of the paramfetch stand-in's own content, with
``Accept-Ranges: bytes``; a ``Range`` (first-last, first-, or a suffix -n) gets a 206 with its
``Content-Range``, a range that starts past the end a 416; one connection serves request after request
(HTTP/1.1, as aria2c keeps its connections); the CLI prints where it serves and ends on SIGTERM, and a bad
``--size`` is one line and exit 2.
"""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
from collections.abc import Iterator

import pytest
from helpers import PY, REPO

from supervisor.prover.standins import paramfetch, paramserve
from supervisor.prover.standins.paramserve import ParamServer, content

SIZE = 1000


@pytest.fixture
def server() -> Iterator[ParamServer]:
    srv = ParamServer(SIZE).start()
    yield srv
    srv.close()


def request(srv: ParamServer, method: str = "GET", path: str = "/ipfs/QmX", rng: str | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    port = int(srv.url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers={"Range": rng} if rng is not None else {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_content_is_the_paramfetch_standins_bytes_and_continues_across_offsets() -> None:
    whole = content(0, 1300)
    assert whole == paramfetch._chunk_bytes(0, 1300)
    assert whole[:256] == bytes(range(256)) and whole[256:512] == bytes(range(256))
    # Any split gives the same file: a Range answer fits the file a resumed download already has.
    for cut in (1, 255, 256, 257, 999):
        assert content(0, cut) + content(cut, 1300 - cut) == whole
    assert content(77, 0) == b""


def test_get_of_any_path_is_the_whole_file(server: ParamServer) -> None:
    for path in ("/", "/ipfs/QmAbc", "/v28-stacked-proof-of-replication.params?x=1"):
        code, headers, body = request(server, path=path)
        assert code == 200
        assert headers["accept-ranges"] == "bytes"
        assert headers["content-type"] == "application/octet-stream"
        assert headers["content-length"] == str(SIZE)
        assert body == content(0, SIZE)


def test_head_says_the_size_and_sends_no_body(server: ParamServer) -> None:
    code, headers, body = request(server, "HEAD")
    assert (code, headers["content-length"], body) == (200, str(SIZE), b"")
    code, headers, body = request(server, "HEAD", rng="bytes=900-")
    assert (code, headers["content-range"], headers["content-length"], body) == (206, "bytes 900-999/1000", "100", b"")


def test_a_closed_range_is_a_206_with_those_bytes(server: ParamServer) -> None:
    code, headers, body = request(server, rng="bytes=300-555")
    assert code == 206
    assert headers["content-range"] == "bytes 300-555/1000" and headers["content-length"] == "256"
    assert body == content(300, 256)


def test_an_open_range_runs_to_the_end_and_a_long_one_is_cut_there(server: ParamServer) -> None:
    code, headers, body = request(server, rng="bytes=990-")
    assert (code, headers["content-range"], body) == (206, "bytes 990-999/1000", content(990, 10))
    code, headers, body = request(server, rng="bytes=995-5000")
    assert (code, headers["content-range"], body) == (206, "bytes 995-999/1000", content(995, 5))


def test_a_suffix_range_is_the_last_bytes_and_a_long_suffix_the_whole_file(server: ParamServer) -> None:
    code, headers, body = request(server, rng="bytes=-4")
    assert (code, headers["content-range"], body) == (206, "bytes 996-999/1000", content(996, 4))
    code, headers, body = request(server, rng="bytes=-5000")
    assert (code, headers["content-range"], body) == (206, "bytes 0-999/1000", content(0, SIZE))


def test_a_range_past_the_end_is_416_with_the_size(server: ParamServer) -> None:
    for rng in ("bytes=1000-", "bytes=2000-3000", "bytes=-0"):
        code, headers, body = request(server, rng=rng)
        assert (code, headers["content-range"], headers["content-length"], body) == (416, "bytes */1000", "0", b""), rng


def test_a_range_it_cannot_read_is_ignored_for_the_whole_file(server: ParamServer) -> None:
    for rng in ("bytes=-", "items=0-10", "bytes=0-10,20-30", "garbage"):
        code, headers, body = request(server, rng=rng)
        assert code == 200 and "content-range" not in headers and body == content(0, SIZE), rng


def test_one_connection_serves_several_requests(server: ParamServer) -> None:
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        bodies = []
        for rng in ("bytes=0-99", "bytes=100-199", "bytes=200-"):
            conn.request("GET", "/ipfs/QmX", headers={"Range": rng})
            resp = conn.getresponse()
            assert resp.status == 206 and not resp.will_close
            bodies.append(resp.read())
        assert b"".join(bodies) == content(0, SIZE)
    finally:
        conn.close()


def test_a_file_larger_than_one_send_chunk_arrives_whole() -> None:
    size = paramserve.SEND_CHUNK * 2 + 123
    srv = ParamServer(size).start()
    try:
        code, _, body = request(srv)
        assert code == 200 and len(body) == size and body == content(0, size)
        code, _, body = request(srv, rng=f"bytes={paramserve.SEND_CHUNK - 7}-")
        assert code == 206 and body == content(paramserve.SEND_CHUNK - 7, size - paramserve.SEND_CHUNK + 7)
    finally:
        srv.close()


def test_the_command_line_serves_until_sigterm() -> None:
    proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.paramserve", "--size", "4KiB"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.fullmatch(r"serving parameter files of 4096 bytes on (http://127\.0\.0\.1:(\d+)/)\n", line)
        assert found, line
        conn = http.client.HTTPConnection("127.0.0.1", int(found.group(2)), timeout=10)
        conn.request("GET", "/ipfs/Qm1")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == content(0, 4096)
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_line_says_the_size_it_serves() -> None:
    """``--size 0`` cannot be served (a file has at least a byte): the line names the size it does serve."""
    proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.paramserve", "--size", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.fullmatch(r"serving parameter files of (\d+) bytes on http://127\.0\.0\.1:(\d+)/\n", line)
        assert found, line
        conn = http.client.HTTPConnection("127.0.0.1", int(found.group(2)), timeout=10)
        conn.request("HEAD", "/")
        assert conn.getresponse().getheader("Content-Length") == found.group(1)
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_bad_size_is_one_line_and_exit_2() -> None:
    done = subprocess.run([PY, "-m", "supervisor.prover.standins.paramserve", "--size", "lots"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("paramserve: --size: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
