"""What aria2c prints and leaves beside a file, for the paramfetch stand-in where the real one is not installed
(measured with aria2 1.36.0, stdout a pipe; shared/domain/production.md): the readout line, the coloured NOTICE, the
``<file>.aria2`` control file kept while the file is incomplete (here: the offset reached, as text; the real
one is binary), the preallocation, and how its output reaches a pipe: the NOTICE lines at once, the readouts
block-buffered (``Readouts``), so a supervisor reading the pipe sees nothing of them until the next progress
summary (every ``--summary-interval``, 60 s unless its configuration file says otherwise), the buffer fills or
the file is done.
"""

from __future__ import annotations

import os
import sys
import time

from . import output

CONTROL_SUFFIX = ".aria2"  # aria2c's control file beside a file it has not completed
NOTICE = "\x1b[1;32mNOTICE\x1b[0m"  # aria2c colours its level words
ERROR = "\x1b[1;31mERROR\x1b[0m"
# curio's --lowest-speed-limit 16K: a link slower than this is given up after about TOO_SLOW_S (exit 5,
# "Too slow"), -m100 notwithstanding; the file and its control file stay for --continue (measured here).
LOWEST_SPEED = 16 * 1024
TOO_SLOW_S = 10.0


def resumed_offset(path: str, control: str, size: int) -> int:
    """Where a download resumes (``--continue``): the control file's offset, else the file's length."""
    try:
        with open(control) as fh:
            return max(0, min(size, int(fh.read().strip() or 0)))
    except (OSError, ValueError):
        pass
    try:
        length = os.path.getsize(path)
    except OSError:
        return 0
    return length if length < size else 0


# The buffer of a stdout that is a pipe (glibc's stdio: the pipe's st_blksize).
PIPE_BUFFER = 4096
# aria2c's --summary-interval when nothing sets it: a progress summary a minute.
SUMMARY_INTERVAL_S = 60
# The width of the summary's rules into a pipe (no terminal to size them by).
RULE = 79


def summary_interval() -> int:
    """aria2c's ``--summary-interval`` as the aria2c that curio runs finds it (curio passes none): the
    ``summary-interval=`` of its configuration file, ``$HOME/.aria2/aria2.conf`` where there is one, else
    ``$XDG_CONFIG_HOME/aria2/aria2.conf`` (``~/.config``); else SUMMARY_INTERVAL_S. 0: no summary."""
    home = os.path.expanduser("~")
    config = os.path.join(home, ".aria2", "aria2.conf")
    if not os.path.exists(config):
        config = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "aria2", "aria2.conf")
    try:
        with open(config) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return SUMMARY_INTERVAL_S
    every = SUMMARY_INTERVAL_S
    for line in lines:
        name, equals, value = line.partition("=")
        if equals and name.strip() == "summary-interval" and value.strip().isdigit():
            every = int(value.strip())
    return every


def summary(readout_line: str, path: str) -> str:
    """aria2c's progress summary of one download (measured with aria2 1.36.0, stdout a pipe): a header with the time,
    a rule, the download's readout again, its file, a rule, and an empty line. Nothing in it is news."""
    when = time.strftime("%a %b %e %H:%M:%S %Y")
    return (f" *** Download Progress Summary as of {when} *** \n{'=' * RULE}\n{readout_line}\nFILE: {path}\n"
            f"{'-' * RULE}\n")


class Readouts:
    """aria2c's readout lines as they reach a pipe: held in a PIPE_BUFFER-byte buffer that is written out
    when it is full (exactly that many bytes: a line may be cut, its rest comes with the next), with each
    progress summary (``readout``: aria2c flushes its console after one) or when a NOTICE line follows
    (``flush``: aria2c's logger flushes); to a terminal each line at once. ``path``: the download's file, which
    the summary names."""

    def __init__(self, path: str) -> None:
        self._held = bytearray()
        self._pipe = not sys.stdout.isatty()
        self._path = path
        self._every = summary_interval()
        self._summarised = time.monotonic()

    def readout(self, line: str) -> None:
        """A readout (one a second), after the progress summary where one is due: aria2c's readouts go out with
        each summary, every ``--summary-interval``; the second's readout after it mostly with the next (measured:
        a download stuck on a dead gateway prints the same figures in a burst a minute for as long as it waits)."""
        now = time.monotonic()
        if self._every and now - self._summarised >= self._every:
            self._summarised = now
            self.add(summary(line, self._path))
            self.flush()
        self.add(line)

    def add(self, line: str) -> None:
        if not self._pipe:
            output.out(line)
            return
        self._held += (line + "\n").encode()
        while len(self._held) >= PIPE_BUFFER:
            self._write(bytes(self._held[:PIPE_BUFFER]))
            del self._held[:PIPE_BUFFER]

    def flush(self) -> None:
        if self._held:
            self._write(bytes(self._held))
            self._held.clear()

    @staticmethod
    def _write(data: bytes) -> None:
        if output.silenced():
            return
        try:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (OSError, ValueError):
            pass  # the reader went away: as output.out does


def write_control(control: str, done: int) -> None:
    with open(control, "w") as fh:
        fh.write(str(done))


def preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)  # aria2c's default --file-allocation=prealloc: the blocks too
    except OSError:
        os.ftruncate(fd, size)


def stamp() -> str:
    return time.strftime("%m/%d %H:%M:%S")


def aria2_size(n: float) -> str:
    """aria2c's sizes: ``57MiB``, ``8.2MiB``, ``16KiB``, ``512B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{int(n)}B"


def readout(gid: str, done: int, total: int, rate: float) -> str:
    """``[#896ec2 8.2MiB/57MiB(14%) CN:1 DL:4.0MiB ETA:12s]``"""
    eta = int((total - done) / rate) if rate > 0 else 0
    left = f" ETA:{eta // 60}m{eta % 60}s" if eta >= 60 else (f" ETA:{eta}s" if eta else "")
    return f"[#{gid} {aria2_size(done)}/{aria2_size(total)}({done * 100 // max(1, total)}%) CN:1 " \
           f"DL:{aria2_size(rate)}{left}]"


def unanswered(gid: str) -> str:
    """The readout of a download no answer came for yet (its size unknown): ``[#896ec2 0B/0B CN:1 DL:0B]``."""
    return f"[#{gid} 0B/0B CN:1 DL:0B]"


def too_slow(rate: float) -> str:
    """What aria2c prints as it gives a slow link up (before its results table; it then exits 5)."""
    return (f"\n{stamp()} [{ERROR}] CUID#7 - Download aborted.\nException: [AbstractCommand.cc:351] errorCode=5\n"
            f"  -> [DownloadCommand.cc:309] errorCode=5 Too slow Downloading speed: {int(rate)} <= {LOWEST_SPEED}(B/s)")


def results(gid: str, path: str, ok: bool) -> str:
    """What aria2c prints as it ends (measured with aria2 1.36.0): its results table, the download's row named
    by its gid (a readout's); a download it gave up is said not complete first, and to be resumed."""
    status, legend = ("OK", "download completed.") if ok else ("ERR", "error occurred.")
    notice = f"Download complete: {path}" if ok else f"Download GID#{gid}{'0' * 10} not complete: {path}"
    table = (f"\n{stamp()} [{NOTICE}] {notice}\n\nDownload Results:\ngid   |stat|avg speed  |path/URI\n"
             f"======+====+===========+{'=' * 55}\n{gid}|{status:<4}|{'':>11}|{path}\n\nStatus Legend:\n"
             f"({status}):{legend}")
    if ok:
        return table
    return (f"{table}\n\naria2 will resume download if the transfer is restarted.\n"
            "If there are any errors, then see the log file. See '-l' option in help/man page for details.")
