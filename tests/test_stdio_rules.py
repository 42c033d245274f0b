"""supervisor.text.stdio in-process: ``say`` writes each line whole after what Python's stream holds, encoded for the
stream; a stream that fails (a pipe whose reader is gone, /dev/full, a non-blocking pipe that takes nothing, a
closed Python stream) is lost quietly, once, with its reason; a broken pipe's fd is pointed at /dev/null. Each
test gives ``say`` a pipe or file of its own as "stdout" (the module's STDOUT/STDERR and sys.stdout/sys.stderr
are patched), so pytest's own fds are never touched. ``keep_std_fds_open`` runs in a real child with fd 1
closed."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, REPO, clean_env

from supervisor.text import stdio


class Pipe:
    """A pipe whose write end is ``say``'s stdout; each end closed once, by the test or at teardown."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self._open = {self.r, self.w}

    def close_reader(self) -> None:
        os.close(self.r)
        self._open.discard(self.r)

    def close_writer(self) -> None:
        os.close(self.w)
        self._open.discard(self.w)

    def drain(self) -> bytes:
        """Everything written, once the write end is closed."""
        self.close_writer()
        return drain_until_eof(self.r)

    def close(self) -> None:
        for fd in self._open:
            os.close(fd)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    lost: dict[int, str] = {}
    monkeypatch.setattr(stdio, "_lost", lost)
    return lost


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch, fresh: dict[int, str]) -> Iterator[Pipe]:
    """``say``'s stdout and stderr: two pipes of the test's own (no Python streams in front of them)."""
    out, err = Pipe(), Pipe()
    monkeypatch.setattr(stdio, "STDOUT", out.w)
    monkeypatch.setattr(stdio, "STDERR", err.w)
    monkeypatch.setattr("sys.stdout", None)
    monkeypatch.setattr("sys.stderr", None)
    yield out
    out.close()
    err.close()


def is_devnull(fd: int) -> bool:
    here, null = os.fstat(fd), os.stat(os.devnull)
    return stat.S_ISCHR(here.st_mode) and here.st_rdev == null.st_rdev


def test_say_writes_each_line_with_its_newline(pipe: Pipe) -> None:
    w = pipe.w
    stdio.say("one")
    stdio.say("two\nthree")
    assert pipe.drain() == b"one\ntwo\nthree\n"
    assert stdio.lost(w) is None


def test_what_pythons_stream_holds_goes_out_first(pipe: Pipe, monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse writes to sys.stdout (buffered); a ``say`` after it must not overtake it."""
    w = pipe.w
    stream = io.TextIOWrapper(io.FileIO(os.dup(w), "w", closefd=True), encoding="utf-8")
    monkeypatch.setattr("sys.stdout", stream)
    stream.write("usage: held in Python's buffer\n")
    stdio.say("then say's line")
    stream.close()
    assert pipe.drain() == b"usage: held in Python's buffer\nthen say's line\n"


def test_err_goes_to_stderr_not_stdout(pipe: Pipe, monkeypatch: pytest.MonkeyPatch) -> None:
    err = Pipe()
    try:
        monkeypatch.setattr(stdio, "STDERR", err.w)
        stdio.say("to stderr", err=True)
        stdio.say("to stdout")
        assert err.drain() == b"to stderr\n"
        assert pipe.drain() == b"to stdout\n"
    finally:
        err.close()


def test_a_line_the_streams_encoding_cannot_hold_is_escaped(pipe: Pipe,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHONIOENCODING=ascii and a non-ASCII path: the line goes out escaped, it does not raise."""
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    stdio.say("state_dir /données/é")
    assert pipe.drain() == b"state_dir /donn\\xe9es/\\xe9\n"


def test_an_encoding_python_does_not_know_falls_back_to_utf8(pipe: Pipe,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    class Odd(io.StringIO):
        encoding = "no-such-codec"  # type: ignore[assignment]

    monkeypatch.setattr("sys.stdout", Odd())
    stdio.say("é")
    assert pipe.drain() == "é\n".encode()


def test_a_line_bigger_than_a_pipe_arrives_whole_through_partial_writes(pipe: Pipe) -> None:
    w = pipe.w
    os.set_blocking(w, False)  # a program sharing the fd made it non-blocking: os.write takes part, then EAGAIN
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(drain_until_eof(pipe.r)), daemon=True)
    reader.start()
    line = "".join(f"{i:07d}," for i in range(60_000))  # 480 kB, many times a pipe's 64 kB
    stdio.say(line)
    assert stdio.lost(w) is None
    pipe.close_writer()  # the reader's EOF
    reader.join(timeout=30)
    assert got == [(line + "\n").encode()]


def drain_until_eof(r: int) -> bytes:
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_non_blocking_pipe_that_takes_nothing_is_lost(pipe: Pipe, monkeypatch: pytest.MonkeyPatch,
                                                       fresh: dict[int, str]) -> None:
    """A terminal paused with Ctrl-S, a reader that stopped reading: the command is not held up by it."""
    w = pipe.w
    os.set_blocking(w, False)
    while True:  # fill the pipe
        try:
            os.write(w, b"x" * 65536)
        except BlockingIOError:
            break
    monkeypatch.setattr(stdio, "SAY_STALL_S", 0.0)
    stdio.say("nobody reads this")
    assert stdio.lost(w) == "it takes nothing"
    assert not is_devnull(w), "only a broken pipe is pointed at /dev/null"
    before = len(drain_until_eof_nonblocking(pipe.r))
    stdio.say("nor this")  # lost: not even tried
    assert drain_until_eof_nonblocking(pipe.r) == b"" and before > 0


def drain_until_eof_nonblocking(r: int) -> bytes:
    os.set_blocking(r, False)
    chunks = []
    while True:
        try:
            chunk = os.read(r, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_pipe_whose_reader_is_gone_is_lost_and_pointed_at_devnull(pipe: Pipe) -> None:
    w = pipe.w
    pipe.close_reader()
    stdio.say("into a broken pipe")  # Python ignores SIGPIPE: os.write raises BrokenPipeError
    assert stdio.lost(w) == os.strerror(32)
    assert is_devnull(w), "a later flush at exit or a child's inherited fd must not meet the broken pipe"
    stdio.say("after")  # quietly nothing
    os.write(w, b"a direct write no longer fails\n")


def test_a_full_disk_loses_the_stream_but_keeps_its_fd(fresh: dict[int, str], monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        monkeypatch.setattr(stdio, "STDOUT", fd)
        monkeypatch.setattr("sys.stdout", None)
        stdio.say("no space for this")
        assert stdio.lost(fd) == os.strerror(28)
        assert not is_devnull(fd)
    finally:
        os.close(fd)


def test_a_lost_stream_is_lost_once_with_its_first_reason(pipe: Pipe, fresh: dict[int, str]) -> None:
    w = pipe.w
    pipe.close_reader()
    stdio.say("first")
    reason = stdio.lost(w)
    stdio.say("second")  # not tried again: its reason stays the first one
    assert stdio.lost(w) == reason and list(fresh) == [w]


def test_flush_last_contains_a_python_stream_that_cannot_flush(pipe: Pipe,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The "Exception ignored ... BrokenPipeError" at interpreter exit: flushed here, contained, and the
    buffer emptied into /dev/null so the stream's own close does not raise again."""
    w = pipe.w
    stream = io.TextIOWrapper(io.FileIO(w, "w", closefd=False), encoding="utf-8")
    monkeypatch.setattr("sys.stdout", stream)
    stream.write("buffered, never delivered\n")
    pipe.close_reader()
    stdio.flush_last()
    assert stdio.lost(w) == os.strerror(32)
    assert is_devnull(w)
    stream.close()  # would raise BrokenPipeError had the buffer been kept for the broken pipe


def test_a_closed_python_stream_is_lost_and_say_writes_nothing(pipe: Pipe,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    w = pipe.w
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    stream.close()
    monkeypatch.setattr("sys.stdout", stream)
    stdio.say("after the stream was closed")
    assert stdio.lost(w) == "I/O operation on closed file."
    assert is_devnull(w)
    assert pipe.drain() == b""


def test_flush_last_with_no_python_streams_at_all(fresh: dict[int, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """pythonw, or a program that set sys.stdout to None: nothing to flush, nothing lost."""
    monkeypatch.setattr("sys.stdout", None)
    monkeypatch.setattr("sys.stderr", None)
    stdio.flush_last()
    assert fresh == {}


KEEP = """
import json, os, sys
from supervisor.text import stdio
closed = stdio.keep_std_fds_open()
opened = os.open(os.devnull, os.O_RDONLY)  # a file opened later must not take a standard fd's number
stdio.say("to the fd that was closed")
result = {"closed": closed, "opened": opened, "lost": [stdio.lost(fd) for fd in (0, 1, 2)],
          "fstat_ok": [os.fstat(fd) is not None for fd in (0, 1, 2)], "again": stdio.keep_std_fds_open()}
with open(sys.argv[1], "w") as f:
    json.dump(result, f)
"""


@pytest.mark.parametrize(("closing", "closed", "lost"), [
    ("1>&-", [1], [None, "closed at start", None]),
    ("0<&- 2>&-", [0, 2], [None, None, "closed at start"]),
])
def test_closed_standard_fds_are_pointed_at_devnull(tmp_path: Path, closing: str, closed: list[int],
                                                    lost: list[str | None]) -> None:
    """``run >&-``: fd 1 is closed at start; pointed at /dev/null, so the next file opened gets 3 or above
    (the console would write into it otherwise). A closed stdin is not a lost output stream."""
    import json
    out = tmp_path / "out.json"
    script = tmp_path / "keep.py"
    script.write_text(KEEP)
    done = subprocess.run(["bash", "-c", f'exec {closing}; exec "$0" "$1" "$2"', PY, str(script), str(out)],
                          cwd=REPO, env=clean_env({"PYTHONPATH": str(REPO)}), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["closed"] == closed and result["opened"] >= 3, result
    assert result["lost"] == lost and result["fstat_ok"] == [True, True, True], result
    assert result["again"] == [], "once open, a second call finds nothing closed"
