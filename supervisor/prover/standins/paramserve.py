"""Stand-in for the parameters' gateway (``https://proofs.filecoin.io/ipfs/<cid>``): a local HTTP server
that answers every path with a file of the set's shape scaled down, for the real ``aria2c`` to fetch.

Usage::

    python -m supervisor.prover.standins.paramserve [--port 0] [--size 8MiB]

prints ``serving parameter files of <size> bytes on http://127.0.0.1:<port>/`` and serves until
SIGTERM/SIGINT. Every ``GET``/``HEAD`` of any path answers ``--size`` bytes (default
``$STANDIN_PARAM_BYTES``, else 1 MiB) of the same content the paramfetch stand-in writes, with
``Accept-Ranges: bytes`` and ``206`` answers to a ``Range`` (aria2c's ``-x16 -s16`` fetches one file
over several connections, and ``--continue`` resumes with a Range). Tests start it in-process
(``ParamServer``).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import knobs, output

_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)$")
# Bytes written to the socket at once.
SEND_CHUNK = 256 * 1024
# A slow patch of the link (``ParamServer.slow_below``): this much at full speed, then TRICKLE_BYTES every
# TRICKLE_EVERY_S (4 KiB/s, under aria2c's --lowest-speed-limit 16K: the real aria2c gives up on it, exit 5).
SLOW_AFTER_BYTES = 1024 * 1024
TRICKLE_BYTES = 1024
TRICKLE_EVERY_S = 0.25


def content(offset: int, n: int) -> bytes:
    """The file's bytes from ``offset`` (the paramfetch stand-in's pattern: the same file either way)."""
    pattern = bytes(range(256))
    start = offset % 256
    reps = (n + start) // 256 + 1
    return (pattern * reps)[start:start + n]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the console is the test's
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        size = self.server.size
        start, end = 0, size - 1
        wanted = self.headers.get("Range")
        found = _RANGE_RE.match(wanted.strip()) if wanted else None
        if found and (found.group(1) or found.group(2)):
            if found.group(1):
                start = int(found.group(1))
                end = min(size - 1, int(found.group(2))) if found.group(2) else size - 1
            else:
                start = max(0, size - int(found.group(2)))
            if start > end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if not body:
            return
        slow = start < self.server.slow_below
        offset = start
        try:
            while offset <= end:
                trickle = slow and offset - start >= SLOW_AFTER_BYTES
                n = min(TRICKLE_BYTES if trickle else SEND_CHUNK, end - offset + 1)
                self.wfile.write(content(offset, n))
                offset += n
                if trickle:
                    self.wfile.flush()
                    time.sleep(TRICKLE_EVERY_S)
        except output.HANGUPS:
            return


class _Server(output.QuietHangups, ThreadingHTTPServer):
    daemon_threads = True
    size: int
    slow_below = 0  # an answer from an offset below this becomes a slow patch after its first MiB


class ParamServer:
    """The server on 127.0.0.1 in a thread of its own: ``url`` while started; ``close`` ends it."""

    def __init__(self, size: int, port: int = 0, slow_below: int = 0) -> None:
        """``slow_below``: an answer that starts below this offset trickles after its first MiB, a slow patch of
        the link (a download that resumes with a Range gets one MiB further each time, then fast past it)."""
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.size = size
        self._server.slow_below = slow_below
        self._thread = threading.Thread(target=self._server.serve_forever, name="paramserve", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def start(self) -> ParamServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def main(argv: list[str] | None = None) -> int:
    output.init_streams()
    parser = argparse.ArgumentParser(prog="paramserve", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--size", default="")
    args = parser.parse_args(argv)
    try:
        size = knobs.parse_size(args.size) if args.size else \
            knobs.env_size("STANDIN_PARAM_BYTES", 1024 * 1024)
    except ValueError as exc:
        output.err(f"paramserve: --size: {exc}")
        return 2
    size = max(1, size)  # a file of no bytes is not a download: serve one, and say so
    server = ParamServer(size, args.port)
    # The stop signals are waited for, not handled: a handler setting an Event the main thread waits on could
    # run while that wait holds the Event's lock, and deadlock. (The server's threads inherit them blocked.)
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    server.start()
    output.out(f"serving parameter files of {size} bytes on {server.url}")
    signal.sigwait(stops)
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
