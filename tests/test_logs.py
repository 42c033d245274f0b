"""Output handling: the line splitter, the console, log files, the ring, and end to end."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import select
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import PY, REPO, Runner, toml_list, wait_for

from supervisor.engine import logs
from supervisor.engine.logs import MAX_LINE_BYTES, ChildOutput, Console, LineSplitter, LogFile

MB = 1024 * 1024
CLOCK = r"\d\d:\d\d:\d\d\.\d\d\d"
WAIT_S = 30.0  # an upper bound against hanging, never a measure


def script(tmp: Path, name: str, code: str, *args: str) -> str:
    """Write ``code`` to a file and return the TOML argv that runs it (conftest's pyc can't do newlines)."""
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(code))
    return toml_list([PY, str(path), *args])


# ================================================================ LineSplitter


def test_splitter_lines_across_chunks() -> None:
    s = LineSplitter()
    assert s.feed(b"hel") == []
    assert s.feed(b"lo\nwor") == [b"hello"]
    assert s.feed(b"ld\nsecond\nthi") == [b"world", b"second"]
    assert s.feed(b"rd\n") == [b"third"]
    assert s.flush() == []


def test_splitter_many_lines_one_chunk_and_empty_lines() -> None:
    s = LineSplitter()
    assert s.feed(b"a\n\nb\nc\n") == [b"a", b"", b"b", b"c"]
    assert s.feed(b"\n") == [b""]


def test_splitter_crlf() -> None:
    s = LineSplitter()
    out = s.feed(b"one\r\ntwo\r") + s.feed(b"\nthree\r\n")
    # CR LF is one line end, also when the read was cut between the two; no line keeps a \r
    assert out == [b"one", b"two", b"three"]


@pytest.mark.parametrize(("data", "lines"), [
    (b"10%\r20%\r30%\n", [b"10%", b"20%", b"30%"]),  # a readout that redraws in place: a line per redraw
    (b"\r 10%\r 20%\r\n", [b" 10%", b" 20%"]),  # tqdm's way: \r first; the last \r\n adds no empty line
    (b"a\r\r\r\nb\n", [b"a", b"b"]),  # a run of \r makes no empty lines
    (b"a\r\n\r\nb\n", [b"a", b"", b"b"]),  # a blank CR LF line stays one blank line
    (b"\r\r\n", [b""]),  # a line of nothing but \r: one empty line, as a terminal shows it
    (b"a\n\nb\r", [b"a", b"", b"b"]),
    (b"done\rpartial", [b"done", b"partial"]),  # the rest comes out at flush
])
def test_splitter_lone_cr_ends_a_line(data: bytes, lines: list[bytes]) -> None:
    s = LineSplitter()
    assert s.feed(data) + s.flush() == lines


def test_splitter_progress_readout_comes_out_as_it_is_drawn() -> None:
    """Each redraw is a line as soon as its \r arrives, not when 64 KiB have piled up."""
    s = LineSplitter()
    assert s.feed(b"fetching: 1%") == []
    assert s.feed(b"\rfetching: 2%") == [b"fetching: 1%"]
    assert s.feed(b"\r") == [b"fetching: 2%"]
    assert s.feed(b"\n") == []  # the CR LF's LF: that line was given already
    assert s.feed(b"next\n") == [b"next"]


def test_splitter_lines_with_cr_do_not_depend_on_chunking() -> None:
    """Every cut of every short mix of \r, \n and text gives the lines the whole gives (long lines cut too)."""
    alphabet = [b"a", b"bb", b"\r", b"\n", b"\r\n"]
    for length in range(1, 6):
        for parts in itertools.product(alphabet, repeat=length):
            data = b"".join(parts)
            whole = LineSplitter(3)
            expected = whole.feed(data) + whole.flush()
            assert all(b"\r" not in line and len(line) <= 3 for line in expected)
            for cut in range(1, len(data)):
                s = LineSplitter(3)
                assert s.feed(data[:cut]) + s.feed(data[cut:]) + s.flush() == expected, (data, cut)


def test_splitter_empty_input() -> None:
    s = LineSplitter()
    assert s.feed(b"") == []
    assert s.flush() == []
    assert s.feed(b"part") == []
    assert s.feed(b"") == []  # an empty read keeps what was pending
    assert s.flush() == [b"part"]


def test_splitter_flush() -> None:
    s = LineSplitter()
    assert s.feed(b"done\nno newline at the end") == [b"done"]
    assert s.flush() == [b"no newline at the end"]
    assert s.flush() == []
    assert s.feed(b"fresh\n") == [b"fresh"]


def test_splitter_10mb_line_in_one_chunk() -> None:
    data = os.urandom(5 * MB).hex().encode()  # 10 MB, no newline
    assert b"\n" not in data
    s = LineSplitter()
    out = s.feed(data)
    assert out and all(len(piece) <= MAX_LINE_BYTES for piece in out)
    held = len(data) - sum(map(len, out))
    assert held <= MAX_LINE_BYTES
    rest = s.flush()
    assert len(b"".join(rest)) == held
    assert b"".join(out + rest) == data


def test_splitter_10mb_line_fed_like_a_pipe_stays_bounded() -> None:
    data = (b"0123456789abcdef" * (MB // 16)) * 10 + b"tail"  # 10 MB + 4, no newline
    s = LineSplitter()
    fed = emitted = 0
    pieces: list[bytes] = []
    for i in range(0, len(data), 256 * 1024 - 17):  # odd chunk size: pieces straddle chunks
        chunk = data[i : i + 256 * 1024 - 17]
        out = s.feed(chunk)
        fed += len(chunk)
        emitted += sum(map(len, out))
        pieces.extend(out)
        assert all(len(p) <= MAX_LINE_BYTES for p in out)
        assert fed - emitted <= MAX_LINE_BYTES, "the splitter holds more than one line's worth between feeds"
    pieces.extend(s.flush())
    assert b"".join(pieces) == data
    assert all(len(p) <= MAX_LINE_BYTES for p in pieces)


def test_splitter_long_line_then_newline_and_more() -> None:
    s = LineSplitter(10)
    out = s.feed(b"a" * 25 + b"\nshort\n" + b"b" * 12)
    assert out[:3] == [b"a" * 10, b"a" * 10, b"a" * 5]
    assert out[3] == b"short"
    assert all(len(x) <= 10 for x in out)
    assert b"".join(out + s.flush()) == b"a" * 25 + b"short" + b"b" * 12


def test_splitter_output_does_not_depend_on_chunking() -> None:
    """The same bytes give the same lines however the pipe happened to cut them.

    A line of exactly N × max bytes whose newline arrives in a later read must not
    produce an extra empty line.
    """
    max_line = 8
    for length_in_lines in (1, 2, 3):
        data = b"x" * (max_line * length_in_lines) + b"\nnext\n"
        whole = LineSplitter(max_line).feed(data)
        for cut in range(1, len(data)):
            s = LineSplitter(max_line)
            got = s.feed(data[:cut]) + s.feed(data[cut:]) + s.flush()
            assert got == whole, f"{length_in_lines} x max bytes, cut at {cut}"


# ================================================================ Console


def _drain(fd: int, into: bytearray, done: threading.Event) -> threading.Thread:
    def read() -> None:
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            into.extend(data)
        done.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking-fd", "nonblocking-fd"])
def test_console_never_blocks_and_reports_drops(blocking: bool) -> None:
    r, w = os.pipe()
    os.set_blocking(w, blocking)
    console = Console(fd=w)
    said: list[str] = []
    console.notify = said.append  # (supervisor.log in a run)
    total = 20_000
    line_tail = b" " + b"." * 1000 + b"\n"  # ~1 KB lines: 20 MB in all, far beyond the backlog
    slowest = 0.0

    def produce() -> None:
        nonlocal slowest
        for i in range(total):
            t = time.monotonic()
            console.put(b"line %06d" % i + line_tail)
            slowest = max(slowest, time.monotonic() - t)

    producer = threading.Thread(target=produce, daemon=True)
    started = time.monotonic()
    producer.start()
    producer.join(20)
    took = time.monotonic() - started
    try:
        assert not producer.is_alive(), "Console.put blocked while nobody reads the console"
        assert took < 10, f"20k puts took {took:.1f}s"
        assert slowest < 1.0, f"one put took {slowest:.2f}s"
        console.put(b"own line after the flood\n", own=True)
    finally:
        out = bytearray()
        done = threading.Event()
        reader = _drain(r, out, done)  # the reader wakes up now
        console.close(timeout=30)
        os.close(w)
        reader.join(30)
        os.close(r)
    assert done.is_set()
    text = out.decode()
    received = re.findall(r"^line (\d{6}) ", text, flags=re.M)
    notes = re.findall(rf"^{CLOCK} \[supervisor\] console too slow: (\d+) lines dropped here", text, flags=re.M)
    dropped = sum(int(n) for n in notes)
    assert notes, "the drops were never reported"
    assert dropped > 0
    assert len(received) + dropped == total, (len(received), dropped)
    numbers = [int(n) for n in received]
    assert numbers == sorted(numbers) and numbers[0] == 0
    # the supervisor's own lines get extra room, so they pass where children's lines were dropped
    assert "own line after the flood\n" in text
    # Said where it can be read, too: a reader that never reads never sees the console's own note (a reviewer's
    # run: `run | sleep`, and nothing anywhere said that lines were dropped).
    assert said == ["console: stdout takes lines slower than they come (a reader that does not read, a paused "
                    "terminal?): console lines are dropped until it drains; the log files have them",
                    f"console: stdout drains again; {dropped} line(s) were dropped there"], said


@pytest.mark.parametrize("say_every_s", [logs.CONSOLE_SLOW_SAY_S, 0.0], ids=["within-a-minute", "past-it"])
def test_a_console_that_falls_behind_again_is_said_again_only_past_a_minute(
        monkeypatch: pytest.MonkeyPatch, say_every_s: float) -> None:
    # A slow terminal fills and drains its backlog in turn: one pair of lines a minute, never one a drain.
    monkeypatch.setattr(logs, "CONSOLE_SLOW_SAY_S", say_every_s)
    r, w = os.pipe()
    console = Console(fd=w)
    said: list[str] = []
    console.notify = said.append
    line, out = b"." * (64 * 1024 - 1) + b"\n", bytearray()
    try:
        for stretch in (b"first", b"second"):
            for _ in range(2 * logs.CONSOLE_BACKLOG_BYTES // len(line)):  # nobody reads: far past the backlog
                console.put(line)
            console.put(b"end of the " + stretch + b" stretch\n", own=True)  # (own: room kept for it)
            while not out.endswith(b"end of the " + stretch + b" stretch\n"):  # then everything is read
                assert select.select([r], [], [], WAIT_S)[0], "the console wrote nothing more"
                out.extend(os.read(r, 1 << 20))
            time.sleep(0.2)  # (the writer says it drained after its write returned)
    finally:
        console.close(timeout=0.5)
        os.close(w)
        os.close(r)
    slow = [n for n in said if n.startswith("console: stdout takes lines slower")]
    drained = [n for n in said if n.startswith("console: stdout drains again")]
    assert (len(slow), len(drained)) == ((1, 1) if say_every_s else (2, 2)), said
    # Every dropped line is counted in supervisor.log all the same: the stretch not said (within the minute) at
    # the close (it was counted on the console alone before).
    notes = re.findall(rb"\[supervisor\] console too slow: (\d+) lines dropped here", bytes(out))
    counted = re.findall(r"^console: (?:stdout drains again; )?(\d+) line\(s\) were dropped there", "\n".join(said),
                         re.M)
    assert len(notes) == 2 and sum(map(int, counted)) == sum(map(int, notes)), (said, notes)
    at_close = [n for n in said if n.endswith("were dropped there since the last count")]
    assert len(at_close) == (1 if say_every_s else 0), said


def test_a_line_dropped_while_the_console_is_lost_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The console's write hangs, then fails (EIO: it may work again), while lines come faster than it takes them:
    # the lines dropped from the backlog meanwhile are among those said lost when it works again, and must not
    # be counted a second time as dropped (at the close, which counts every drop not yet said). The stretch of
    # drops ended with the loss: a slow stretch after the console came back is said as one of its own (it was
    # not, for good: the first stretch stayed open).
    monkeypatch.setattr(logs, "RETRY_WRITE_S", 1.0)
    monkeypatch.setattr(logs, "CONSOLE_SLOW_SAY_S", 0.0)
    r, w = os.pipe()
    console = Console(fd=w)
    said: list[str] = []
    console.notify = said.append
    hung, real_write = threading.Event(), console._write_rolling
    calls: list[list[bytes]] = []

    def write(chunks: list[bytes]) -> OSError | None:
        calls.append(chunks)
        if len(calls) == 1:  # the first batch: hangs until the backlog has overflowed, then fails
            assert hung.wait(WAIT_S)
            return OSError(errno.EIO, "Input/output error")
        return real_write(chunks)

    def read_until(end: bytes) -> None:
        while not out.endswith(end):
            assert select.select([r], [], [], WAIT_S)[0], f"the console wrote nothing more; said {said}"
            out.extend(os.read(r, 1 << 20))

    console._write_rolling = write  # type: ignore[method-assign]
    line, sent = b"x" * 1023 + b"\n", 2 * logs.CONSOLE_BACKLOG_BYTES // 1024
    out = bytearray()
    try:
        console.put(line)
        assert wait_for(lambda: calls, timeout=WAIT_S)  # the writer took its first batch, and hangs in its write
        for _ in range(sent - 1):
            console.put(line)
        hung.set()
        time.sleep(2 * logs.RETRY_WRITE_S)
        console.put(b"back\n", own=True)  # (a write after RETRY_WRITE_S works: the console is back)
        read_until(b"back\n")
        time.sleep(0.2)  # (the writer says it is back after its write returned)
        back = len(out)
        for _ in range(sent):  # nobody reads again: a stretch of drops of its own
            console.put(line)
        console.put(b"end\n", own=True)
        read_until(b"end\n")
        time.sleep(0.2)  # (the writer says it drained after its write returned)
    finally:
        console.close(timeout=WAIT_S)
        os.close(w)
        os.close(r)
    assert calls[0] == [line] and out[:back].count(line) == 0
    text = "\n".join(said)
    lost = [int(n) for n in re.findall(r"^console: writing stdout works again; (\d+) line", text, re.M)]
    assert lost == [sent], said
    assert len(re.findall(r"^console: stdout takes lines slower", text, re.M)) == 2, said
    dropped = [int(n) for n in re.findall(r"^console: (?:stdout drains again; )?(\d+) line\(s\) were dropped", text,
                                          re.M)]
    notes = [int(n) for n in re.findall(rb"console too slow: (\d+) lines dropped here", bytes(out[back:]))]
    assert notes and sum(dropped) == sum(notes), (said, notes)


def test_a_console_said_to_drain_while_it_still_drops_never_undercounts(monkeypatch: pytest.MonkeyPatch) -> None:
    # A slow reader during a flood: "drains again" came after any batch that carried drops, while the backlog
    # filled again, and what was dropped in the minute after went uncounted in supervisor.log (a reviewer's run).
    # One flood, one stretch: supervisor.log's count is the console's own.
    monkeypatch.setattr(logs, "CONSOLE_BACKLOG_BYTES", 256 * 1024)  # (many batches, each one carrying drops)
    r, w = os.pipe()
    console = Console(fd=w)
    said: list[str] = []
    console.notify = said.append
    out, done = bytearray(), threading.Event()

    def read_slowly() -> None:
        while chunk := os.read(r, 1 << 16):
            out.extend(chunk)
            time.sleep(0.02)  # ~3 MB/s
        done.set()

    reader = threading.Thread(target=read_slowly, daemon=True)
    reader.start()
    line = b"." * 1023 + b"\n"
    for _ in range(400):  # 20 MB at ~10 MB/s: the backlog fills in a second, and drops go on for more
        for _ in range(50):
            console.put(line)
        time.sleep(0.005)
    console.close(timeout=WAIT_S)
    os.close(w)
    reader.join(WAIT_S)
    os.close(r)
    assert done.is_set()
    notes = re.findall(rb"\[supervisor\] console too slow: (\d+) lines dropped here", bytes(out))
    counted = [int(n) for n in re.findall(r"^console: (?:stdout drains again; )?(\d+) line\(s\) were dropped there",
                                          "\n".join(said), re.M)]  # (at a drain, or at the close: once each)
    assert notes and sum(counted) == sum(map(int, notes)), (said, notes)


def test_lines_stdout_never_took_before_the_close_gave_up_are_counted() -> None:
    # stdout stops draining (``run | sleep 25``): the close waits its timeout, then leaves the writer stuck in its
    # write to the exit. The lines queued, and those of the stuck batch not yet written, never reach stdout, and
    # nothing said so (a bug hunter's run: ~106k of ~476k lines went uncounted).
    r, w = os.pipe()
    console = Console(fd=w)
    said: list[str] = []
    console.notify = said.append
    hung, real_write = threading.Event(), console._write_rolling
    calls: list[list[bytes]] = []

    def write(chunks: list[bytes]) -> OSError | None:
        calls.append(chunks)
        if len(calls) > 1:
            return real_write(chunks)
        first = real_write([chunks[0][:9]])  # "line 1\nli": a line and a half reach stdout, then it takes no more
        assert first is None and hung.wait(WAIT_S)
        return real_write([chunks[0][9:], *chunks[1:]])

    console._write_rolling = write  # type: ignore[method-assign]
    try:
        console.put(b"line 1\nline 2\n", b"line 3\n")
        assert wait_for(lambda: calls, timeout=WAIT_S)  # the writer took that batch, and is stuck in its write
        for i in range(100):
            console.put(b"queued %d\n" % i)
        started = time.monotonic()
        console.close(timeout=0.5)
        assert time.monotonic() - started < 0.5 + WAIT_S / 2
    finally:
        hung.set()
        console._thread.join(WAIT_S)
        os.close(w)
        out = os.read(r, 1 << 20)
        os.close(r)
    assert said == ["console: 102 line(s) never reached stdout: it did not drain within 0.5s"], said
    assert out.count(b"\n") == 103  # (the writer let go: everything, the stuck batch first)


def test_console_passes_everything_when_the_reader_keeps_up() -> None:
    r, w = os.pipe()
    out = bytearray()
    done = threading.Event()
    reader = _drain(r, out, done)
    console = Console(fd=w)
    for i in range(2000):
        console.put(b"n %d\n" % i)
    console.close(timeout=10)
    os.close(w)
    reader.join(10)
    os.close(r)
    assert out.decode().splitlines() == [f"n {i}" for i in range(2000)]


def test_console_disabled_writes_nothing() -> None:
    r, w = os.pipe()
    console = Console(fd=w, enabled=False)
    console.put(b"hidden\n")
    console.close()
    os.close(w)
    assert os.read(r, 100) == b""
    os.close(r)


# ================================================================ LogFile


def test_logfile_rolls_over_at_max_bytes(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "c.log"  # created on first write
    f = LogFile(path, max_bytes=100)
    chunk = [bytes([ord("a") + i]) * 40 for i in range(5)]  # aaaa.., bbbb.., ...
    f.write(chunk[0])
    f.write(chunk[1])
    assert path.read_bytes() == chunk[0] + chunk[1]
    assert not path.with_name("c.log.1").exists()
    f.write(chunk[2])  # 120 > 100: roll first
    assert path.with_name("c.log.1").read_bytes() == chunk[0] + chunk[1]
    assert path.read_bytes() == chunk[2]
    f.write(chunk[3])
    f.write(chunk[4])  # rolls again: .1 holds the previous file, older bytes are gone
    assert path.with_name("c.log.1").read_bytes() == chunk[2] + chunk[3]
    assert path.read_bytes() == chunk[4]
    f.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.log", "c.log.1"]


def test_logfile_knows_where_its_own_bytes_begin(tmp_path: Path) -> None:
    """What an earlier run appended comes before; status reads the file's tail from here (status/command.py)."""
    path = tmp_path / "c.log"
    f = LogFile(path, max_bytes=100)
    assert f.ours_from() == 0  # (no file yet)
    path.write_bytes(b"earlier run\n")
    assert f.ours_from() == 12  # before its first write: all of the file is an earlier run's
    f.write(b"x" * 40)
    path.write_bytes(path.read_bytes() + b"y")  # (another writer: where ours began stays)
    assert f.ours_from() == 12
    f.write(b"z" * 80)  # rolls over: the new file is all its own
    assert f.ours_from() == 0
    f.close()
    assert LogFile(tmp_path / "no-such-dir" / "x.log", 0).ours_from() == 0


def test_a_roll_finishes_the_line_under_way_first(tmp_path: Path) -> None:
    # A block-buffered child writes 4 KiB blocks that end anywhere in a line: the roll came at a block's edge,
    # and the new file began with the rest of a line the old one ended with.
    path = tmp_path / "gen.log"
    f = LogFile(path, max_bytes=20_000)
    text = b"".join(b"line %05d %s\n" % (i, b"x" * 37) for i in range(1000))
    for at in range(0, len(text), 4096):
        f.write(text[at : at + 4096])
    f.close()
    rolled, current = path.with_name("gen.log.1").read_bytes(), path.read_bytes()
    assert rolled.endswith(b"\n") and current.startswith(b"line "), "a line torn across the roll"
    assert text.endswith(rolled + current) and len(rolled) <= 20_000 + 4096


def test_an_fd_kept_on_the_log_follows_it_across_rolls(tmp_path: Path) -> None:
    # A fatal fault's last words go through an fd of their own (faulthandler's): after two rolls it pointed at a
    # deleted file, and a crash's traceback was lost. It is kept on the present file.
    path = tmp_path / "supervisor.log"
    f = LogFile(path, max_bytes=100)
    f.write(b"a" * 60)
    last_words = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        f.keep_on_this_file(last_words)
        for chunk in (b"b" * 60, b"c" * 60, b"d" * 60):  # three rolls
            f.write(chunk)
        os.write(last_words, b"Fatal Python error: Segmentation fault\n")
        assert path.read_bytes() == b"d" * 60 + b"Fatal Python error: Segmentation fault\n"
        assert not os.get_inheritable(last_words)  # (no child inherits it)
        assert os.readlink(f"/proc/self/fd/{last_words}") == str(path)
    finally:
        os.close(last_words)
        f.close()

def test_logfile_exactly_max_bytes_does_not_roll(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    f = LogFile(path, max_bytes=100)
    f.write(b"x" * 60)
    f.write(b"y" * 40)
    f.close()
    assert path.read_bytes() == b"x" * 60 + b"y" * 40
    assert not path.with_name("c.log.1").exists()


def test_logfile_oversized_write_kept_whole(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    f = LogFile(path, max_bytes=10)
    f.write(b"z" * 50)  # into an empty file: written whole, not split, no empty .1
    assert path.read_bytes() == b"z" * 50
    assert not path.with_name("c.log.1").exists()
    f.write(b"next")
    assert path.read_bytes() == b"next"
    assert path.with_name("c.log.1").read_bytes() == b"z" * 50
    f.close()


def test_logfile_zero_means_no_rollover_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    path.write_bytes(b"earlier run\n")
    f = LogFile(path, max_bytes=0)
    for _ in range(100):
        f.write(b"0123456789")
    f.close()
    assert path.read_bytes() == b"earlier run\n" + b"0123456789" * 100
    assert not path.with_name("c.log.1").exists()


def test_logfile_counts_existing_size(tmp_path: Path) -> None:
    path = tmp_path / "c.log"
    path.write_bytes(b"o" * 90)
    f = LogFile(path, max_bytes=100)
    f.write(b"n" * 20)  # 90 already there + 20 > 100
    f.close()
    # (the line an earlier writer left open is ended where it is, in the old file: the new one begins with ours)
    assert path.with_name("c.log.1").read_bytes() == b"o" * 90 + b"\n"
    assert path.read_bytes() == b"n" * 20


# ================================================================ ChildOutput


def test_child_output_ring_keeps_last_lines(tmp_path: Path) -> None:
    out = ChildOutput("p/c", Console(enabled=False), LogFile(tmp_path / "p.c.log", 0), ring_lines=3)
    out.feed("stdout", b"l1\nl2\nl3\nl4\n")
    out.feed("stdout", b"l5\nl6 partial")
    assert out.last_lines() == ["l3", "l4", "l5"]
    assert out.last_lines(2) == ["l4", "l5"]
    out.close_stream("stdout")  # the partial line counts once the stream ends
    assert out.last_lines() == ["l4", "l5", "l6 partial"]
    out.file.close()
    assert (tmp_path / "p.c.log").read_bytes() == b"l1\nl2\nl3\nl4\nl5\nl6 partial"
    assert out.bytes_seen == len(b"l1\nl2\nl3\nl4\nl5\nl6 partial")


def test_child_output_streams_split_separately(tmp_path: Path) -> None:
    out = ChildOutput("p/c", Console(enabled=False), LogFile(tmp_path / "p.log", 0), ring_lines=10)
    out.feed("stdout", b"out-a")
    out.feed("stderr", b"err line\n")
    out.feed("stdout", b"out-b\n")
    assert out.last_lines() == ["err line", "out-aout-b"]
    out.file.close()


def test_a_line_one_stream_left_open_is_ended_in_the_file_before_another_streams_bytes(tmp_path: Path) -> None:
    # stdout and stderr share the file: a block-buffered stdout's partial line and the stderr line after it were one
    # line there ("partialerr line"), where the console and the ring split each stream on its own.
    out = ChildOutput("p/c", Console(enabled=False), LogFile(tmp_path / "p.log", 0), ring_lines=10)
    out.feed("stdout", b"partial")
    out.feed("stderr", b"err line\n")
    out.feed("stdout", b" rest\nnext")
    out.feed("stdout", b" line\n")
    out.feed("stderr", b"err begun")
    out.feed("stderr", b" and ended\n")
    out.close_stream("stdout")
    out.close_stream("stderr")
    out.file.close()
    assert (tmp_path / "p.log").read_bytes() == b"partial\nerr line\n rest\nnext line\nerr begun and ended\n"
    assert out.last_lines() == ["err line", "partial rest", "next line", "err begun and ended"]


def test_a_log_file_begins_its_own_bytes_on_a_line_of_their_own(tmp_path: Path) -> None:
    # Each attempt writes the phase's file through a LogFile of its own: an attempt that died in the middle of a
    # line had the next attempt's first line glued to it.
    path = tmp_path / "p.log"
    first = LogFile(path, 0)
    first.write(b"line\ncrashed mid")
    first.close()
    second = LogFile(path, 0)
    second.write(b"next attempt\n")
    second.close()
    third = LogFile(path, 0)
    third.write(b"after a whole line\n")
    third.close()
    assert path.read_bytes() == b"line\ncrashed mid\nnext attempt\nafter a whole line\n"


def test_child_output_decodes_and_strips_cr(tmp_path: Path) -> None:
    r, w = os.pipe()
    console = Console(fd=w)
    out = ChildOutput("ph/dm", console, LogFile(tmp_path / "ph.dm.log", 0), ring_lines=5)
    raw = b"crlf line\r\nbad \xff\xfe bytes\n"
    out.feed("stdout", raw)
    console.close(timeout=10)
    os.close(w)
    shown = os.read(r, 1 << 16)
    os.close(r)
    out.file.close()
    assert out.last_lines() == ["crlf line", "bad \ufffd\ufffd bytes"]
    assert (tmp_path / "ph.dm.log").read_bytes() == raw  # the file has the exact bytes
    lines = shown.split(b"\n")
    assert re.fullmatch(rb"\d\d:\d\d:\d\d\.\d\d\d \[ph/dm\] crlf line", lines[0])
    assert re.fullmatch(rb"\d\d:\d\d:\d\d\.\d\d\d \[ph/dm\] bad \xff\xfe bytes", lines[1])
    assert b"\r" not in shown


# ================================================================ end to end


def test_e2e_huge_line_binary_and_normal_line(sup: Runner) -> None:
    big = 10 * MB
    binary = bytes(range(256)) + b"\xc3\x28 \xe2\x82 not utf-8 \x1b[31m\r\n"
    cmd = script(sup.tmp, "big", f"""
        import sys, time
        out = sys.stdout.buffer
        out.write(b"x" * {big})
        out.write({binary!r})
        out.flush()
        time.sleep(0.3)  # let the console catch up so the last line is surely shown
        out.write(b"after the big line\\n")
        out.flush()
    """)
    config = sup.write(f"""
        [[phases]]
        name = "big"
        command = {cmd}
    """)
    # The console passes the child's bytes through as they are: read it as bytes (conftest's runner decodes).
    proc = subprocess.Popen(sup.argv(config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=REPO, start_new_session=True)
    sup.procs.append(proc)  # type: ignore[arg-type]  # cleaned up by the fixture
    raw, _ = proc.communicate(timeout=60)
    output = raw.decode("utf-8", errors="replace")
    assert proc.returncode == 0, output[-3000:]
    expected = b"x" * big + binary + b"after the big line\n"
    logged = (sup.log_dir / "big.log").read_bytes()
    assert len(logged) == len(expected)
    assert logged == expected
    assert re.search(rf"^{CLOCK} \[big/big\] after the big line$", output, flags=re.M), output[-2000:]
    assert re.search(r"\[supervisor\] ended: phase=big child=big pid=\d+ reason=exit_code exit_code=0 ", output)
    assert "lifecycle complete" in output
    # the console never got a line longer than one piece (+ its prefix)
    assert max(len(line) for line in raw.split(b"\n")) <= MAX_LINE_BYTES + 100


def test_e2e_daemon_log_file_name(sup: Runner) -> None:
    daemon = script(sup.tmp, "d", """
        import sys, time
        print("daemon out", flush=True)
        print("daemon err", file=sys.stderr, flush=True)
        time.sleep(30)
    """)
    cmd = script(sup.tmp, "c", """
        import time
        time.sleep(0.5)
        print("command out")
    """)
    config = sup.write(f"""
        [[phases]]
        name = "ph"
        command = {cmd}
        [[phases.daemons]]
        name = "helper"
        command = {daemon}
        stop_grace_s = 1
    """)
    res = sup.run(config, timeout=30)
    assert res.returncode == 0, res.output
    assert (sup.log_dir / "ph.log").read_bytes() == b"command out\n"
    daemon_log = (sup.log_dir / "ph.helper.log").read_bytes()
    assert sorted(daemon_log.splitlines()) == [b"daemon err", b"daemon out"]
    assert re.search(rf"^{CLOCK} \[ph/helper\] daemon out$", res.output, flags=re.M)
    assert re.search(rf"^{CLOCK} \[ph/ph\] command out$", res.output, flags=re.M)


def test_e2e_console_false_keeps_the_supervisors_own_lines(sup: Runner) -> None:
    """``console = false`` leaves the children's lines out of stdout, not the supervisor's own: its verdict and exit
    status are all `docker logs` has (a bug hunter's run: nothing at all on stdout, the verdict in supervisor.log
    alone)."""
    config = sup.write(sup.header(extra="console = false") + textwrap.dedent("""
        [[phases]]
        name = "p"
        command = ["sh", "-c", "echo boom; exit 3"]
    """), header=False)
    res = sup.run(config, timeout=30)
    assert res.returncode == 3, res.output
    assert "[p/p]" not in res.output, res.output
    assert re.search(rf"^{CLOCK} \[supervisor\] FAILED: ", res.output, flags=re.M), res.output
    assert re.search(rf"^{CLOCK} \[supervisor\] exiting with status 3$", res.output, flags=re.M), res.output
    assert (sup.log_dir / "p.log").read_bytes() == b"boom\n"


def test_e2e_the_log_file_glues_no_line_of_one_stream_or_attempt_to_another(sup: Runner) -> None:
    """A child's stdout line left open (block-buffered output ends anywhere), a stderr line after it, and a last line
    that a crash left unended, in two attempts: each waits until the supervisor wrote its bytes, so the order in the
    file is known. The file ends each open line before another stream's or attempt's bytes; the console and the
    ring split each stream on its own (the stdout line whole, after the stderr one)."""
    log = sup.log_dir / "p.log"
    cmd = script(sup.tmp, "mixed", f"""
        import os, sys, time
        def written() -> int:
            return os.path.getsize({str(log)!r}) if os.path.exists({str(log)!r}) else 0
        def say(stream, text: str) -> None:
            before = written()
            stream.write(text)
            stream.flush()
            deadline = time.monotonic() + {WAIT_S}
            while written() < before + len(text) and time.monotonic() < deadline:
                time.sleep(0.01)
        say(sys.stdout, "partial")
        say(sys.stderr, "err\\n")
        say(sys.stdout, " rest\\n")
        sys.stdout.write("crashed mid")
        sys.exit(3)
    """)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        retries = 1
        command = {cmd}
    """)
    res = sup.run(config, timeout=60)
    assert res.returncode == 3, res.output
    assert log.read_bytes() == b"partial\nerr\n rest\ncrashed mid\n" b"partial\nerr\n rest\ncrashed mid"
    shown = re.findall(rf"^{CLOCK} \[p/p\] (.*)$", res.output, flags=re.M)
    assert shown == ["err", "partial rest", "crashed mid"] * 2, res.output


def test_e2e_fast_writer_not_throttled_by_slow_console(sup: Runner) -> None:
    total_mb = 200
    marker = sup.tmp / "writer.done"
    cmd = script(sup.tmp, "flood", f"""
        import sys, time
        t = time.monotonic()
        out = sys.stdout.buffer
        block = (b"y" * 1023 + b"\\n") * 1024  # 1 MiB of 1 KiB lines
        for _ in range({total_mb}):
            out.write(block)
        out.flush()
        with open({str(marker)!r}, "w") as f:
            f.write(str(time.monotonic() - t))
    """)
    config = sup.write(sup.header(extra="log_file_max_bytes = 16000000") + textwrap.dedent(f"""
        [[phases]]
        name = "flood"
        command = {cmd}
    """), header=False)
    proc = sup.start(config)
    # Nobody reads the supervisor's stdout until the child is done: the pipe fills at once.
    sup_proc = psutil.Process(proc.pid)
    peak_rss = 0

    def child_done() -> bool:
        nonlocal peak_rss
        with contextlib.suppress(psutil.Error):
            peak_rss = max(peak_rss, sup_proc.memory_info().rss)
        return marker.exists() and marker.read_text() != ""

    wait_for(child_done, timeout=60, interval=0.05)
    child_took = float(marker.read_text())
    assert proc.poll() is None or proc.returncode == 0
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
    assert child_took < 45, f"the writer took {child_took:.1f}s for {total_mb} MB"
    notes = re.findall(r"\[supervisor\] console too slow: (\d+) lines dropped", out)
    assert notes and sum(map(int, notes)) > 0, out[-3000:]
    assert 0 < peak_rss < 200 * MB, f"supervisor RSS reached {peak_rss / MB:.0f} MB"
    # the log files (rolled at 16 MB) hold complete lines of the flood
    logged = (sup.log_dir / "flood.log").read_bytes()
    assert logged and set(logged) <= set(b"y\n")
    assert "lifecycle complete" in out
