"""Reading ``curio fetch-params``'s output (``parse = "paramfetch"``): aria2c's lines passed through, and
paramfetch's own, so the core's progress watch knows what the download has got (progresswatch.py).

aria2c (shared/domain/production.md; measured with aria2 1.36.0, stdout a pipe) prints, one aria2c for each file::

    [#896ec2 8.2MiB/57MiB(14%) CN:1 DL:4.0MiB ETA:12s]        a readout line a second, block-buffered
    12/01 14:43:51 [NOTICE] Download complete: /var/tmp/filecoin-proof-parameters/v28-....params
    Download Results:
    gid   |stat|avg speed  |path/URI
    ======+====+===========+=====================
    896ec2|OK  |   0.9MiB/s|/var/tmp/filecoin-proof-parameters/v28-....params
    12/01 14:43:51 [ERROR] CUID#7 - Download aborted. URI=...    (level words ANSI-coloured)

curio starts every file's aria2c at once (lib/fastparamfetch: a goroutine each), all on its one stdout: the
readouts of several files come mixed, each named by its download's gid, and a file done in under a second
has none. So what is under way is the sum of each gid's latest readout, and a complete file's size is its
gid's, which the results table's row (gid and path) names: never the latest readout's, which may be another
file's (a 45 GiB file's size given to a small one, then thrown away with it, would end a healthy download as
too slow). A file with no readout counts complete with its size unknown.

and paramfetch ``Parameter file <path> is ok`` once a file is checked (or found complete), or, when a file it has
just fetched fails its check, ``sanity checking fetched file failed, removing and retrying: checksum mismatch in
param file <path>, <got> != <want>`` (curio's ``lib/fastparamfetch/paramfetch.go``; go-log's ERROR line): the
file is deleted and fetched again, so it is no longer complete and the reading counts a restart, with the bad
copy's size as aria2c said it (``thrown_bytes``; 0 without aria2c's lines): the progress watch takes those
bytes off, as no progress. Into a pipe the
readouts are block-buffered: they arrive in bursts, with aria2c's progress summary (every --summary-interval,
60 s) and when the file is done, so what they say corrects the figure afterwards; what the download has got
meanwhile is its processes' writes (progresswatch.py). The readout's
first figure is the bytes of its file got so far; a results row adds that file's size (its readout's second
figure) to what is done, and takes its gid out of what is under way; a file downloaded again in the same
attempt (paramfetch fetches a file whose check failed once more) counts once, at its last size, and not at
all from its mismatch until it is complete again. The
command's exit status judges it (the result never fails it); the last ERROR line is kept for the log.

It marks the lines that say nothing moved (``idle_lines``; lifecycle/hooks.py's MarksIdleLines): a line of
readouts each with the figures its download's last had (one not seen before: against ``0B/0B``) and no speed
(``[#8ccb3d 0B/0B CN:1 DL:0B]``, or ``8.2MiB/57MiB(14%) … DL:0B`` again and again), and the lines of the progress
summary around them (its header, its rules, ``FILE: <path>``, an empty line). An aria2c waiting on a gateway that
takes the connection and never answers (or answers 504: either is tried again silently, -m100) prints nothing
else: a burst of some 60 of them every minute, for up to two hours, which the stall watch must not take for life.
Anything else is life: a NOTICE or ERROR line, a readout that moved or has a speed, paramfetch's lines, a line it
does not know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..lifecycle.hooks import ProgressReading
from ..text.ansi import strip_ansi

# aria2c allocates its file before a byte is got and makes the file's control file (<file>.aria2) only after: where
# the filesystem refuses fallocate (ZFS before 2.2, NFSv3, many FUSE mounts) by writing it whole with zeros, at disk
# speed, then flushing them (measured with aria2 1.36.0: "Allocating disk space" said, 2 GiB of zeros in 10 s, 1 s
# of fsync, the control file, then the first byte got). curio runs one aria2c for each file. Its process name is
# registered (plugin.py) so that the core tells those zeros from what it got (evidence/iowatch.py).
ALLOCATORS = frozenset({"aria2c"})
_SIZE = r"(\d+(?:\.\d+)?)(B|KiB|MiB|GiB|TiB)"
_READOUT_RE = re.compile(r"\[#([0-9a-f]+) " + _SIZE + "/" + _SIZE + r"\(\d+%\)")
# Every readout of a line, its size known or not yet (``[#8ccb3d 0B/0B CN:1 DL:0B]``: no answer yet), and its speed:
# what tells whether it moved. aria2c fetching several at once shows them on one line after the overall speed
# (``[DL:1.2MiB][#8ccb3d 1.0MiB/57MiB(1%)][#2a6c95 …]``).
_FIGURES_RE = re.compile(r"\[#([0-9a-f]+) " + _SIZE + "/" + _SIZE + r"[^\]]*\]")
_SPEED_RE = re.compile(r"\bDL:" + _SIZE)
_OVERALL_RE = re.compile(r"\[(?:DL|UL):[^\]]*\]")
# The lines of aria2c's progress summary around its readout: the header, the rules, the file, an empty line.
_SUMMARY_RE = re.compile(r"\*\*\* Download Progress Summary as of .* \*\*\*|=+|-+|FILE: .*|")
_COMPLETE_RE = re.compile(r"\bDownload complete: (\S.*?)\s*$")
# A row of the results table: the download's gid (a readout's, abbreviated alike), its status, its file.
_RESULT_RE = re.compile(r"^([0-9a-f]{6})\|(OK|ERR|RM|INPR)\s*\|[^|]*\|(\S.*?)\s*$")
_OK_RE = re.compile(r"\bParameter file (\S+) is ok\b")
_MISMATCH_RE = re.compile(r"\bchecksum mismatch in param file (\S+?),?(?:\s|$)")
# The words of curio's line when the mismatching file was just fetched and is deleted to be fetched again (a
# mismatch found before fetching keeps the file: aria2c --continue takes it up).
_REMOVED = "removing and retrying"
_ERROR_RE = re.compile(r"\[ERROR\]\s*(.*?)\s*$")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# A kept ERROR line is cut to this many characters.
ERROR_CHARS = 200


def aria2_size(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


@dataclass
class FetchResult:
    completed: dict[str, int] = field(default_factory=dict)  # path → size, of the files aria2c said were complete
    under_way: dict[str, tuple[int, int]] = field(default_factory=dict)  # gid → (got, size), by its latest readout
    files: set[str] = field(default_factory=set)  # complete or found ok
    readouts: int = 0
    restarts: int = 0  # files deleted after a failed check, to be fetched again
    thrown: int = 0  # their bytes, where aria2c said their size (their gid's readout, named by a results row)
    last_error: str | None = None

    @property
    def in_flight(self) -> int:
        """The bytes got of the files under way, each by its latest readout."""
        return sum(got for got, _ in self.under_way.values())

    @property
    def completed_bytes(self) -> int:
        """The bytes of the files complete in this attempt, each file once."""
        return sum(self.completed.values())

    def progress(self) -> ProgressReading | None:
        """The core's reading (hooks.ReadsProgress); None until aria2c or paramfetch said anything of it (a
        restart is something: without aria2c, curio's Go fetch prints no readout, and its first word may be
        that the file it fetched was bad)."""
        if not self.readouts and not self.files and not self.restarts:
            return None
        return ProgressReading(self.in_flight, self.completed_bytes + self.in_flight, len(self.files), self.restarts,
                               self.thrown)

    def problem(self) -> str | None:
        return None  # curio fetch-params exits non-zero when a file cannot be fetched: its status judges

    def describe(self) -> str:
        error = f", last error: {self.last_error}" if self.last_error else ""
        return f"{len(self.files)} file(s) complete, {self.completed_bytes} bytes downloaded{error}"


class FetchParser:
    def __init__(self) -> None:
        self.result = FetchResult()
        self.idle_lines = 0  # the lines read that said nothing moved (MarksIdleLines)
        self._figures: dict[str, tuple[int, int]] = {}  # gid → (got, size) of its latest readout, known size or not

    def feed(self, lines: list[bytes]) -> None:
        for raw in lines:
            if self.feed_line(strip_ansi(raw).decode("utf-8", errors="replace")):
                self.idle_lines += 1

    def feed_line(self, line: str) -> bool:
        """Read ``line``; whether it said nothing moved (an idle line: no sign of life)."""
        if _SUMMARY_RE.fullmatch(line.strip()):
            return True
        idle = self._unmoved(line)
        r = self.result
        readout = _READOUT_RE.search(line)
        if readout:
            r.readouts += 1
            r.under_way[readout.group(1)[:6]] = (aria2_size(readout.group(2), readout.group(3)),
                                                 aria2_size(readout.group(4), readout.group(5)))
            return idle
        self._read(line)
        return idle

    def _unmoved(self, line: str) -> bool:
        """Whether ``line`` is readouts alone, each with its download's last figures (one not seen before: 0B/0B)
        and no speed; each readout's figures are kept for the next."""
        readouts = _FIGURES_RE.findall(line)
        moved = False
        for gid, got, got_unit, size, size_unit in readouts:
            figures = (aria2_size(got, got_unit), aria2_size(size, size_unit))
            moved |= self._figures.get(gid[:6], (0, 0)) != figures
            self._figures[gid[:6]] = figures
        speeds = [aria2_size(number, unit) for number, unit in _SPEED_RE.findall(line)]
        alone = not _OVERALL_RE.sub("", _FIGURES_RE.sub("", line)).strip()
        return bool(readouts) and alone and not moved and not any(speeds)

    def _read(self, line: str) -> None:
        """A line that is no readout: a file complete, a results row, paramfetch's word on a file, an error."""
        r = self.result
        complete = _COMPLETE_RE.search(line)
        if complete:
            r.files.add(complete.group(1))
            r.completed.setdefault(complete.group(1), 0)  # (its size comes with its row of the results)
            return
        result = _RESULT_RE.search(line)
        if result:
            got, size = r.under_way.pop(result.group(1), (0, 0))
            if result.group(2) == "OK":
                r.completed[result.group(3)] = max(size, got, r.completed.get(result.group(3), 0))
            return
        ok = _OK_RE.search(line)
        if ok:
            r.files.add(ok.group(1))
            return
        mismatch = _MISMATCH_RE.search(line)
        if mismatch:
            r.files.discard(mismatch.group(1))
            size = r.completed.pop(mismatch.group(1), 0)
            if _REMOVED in line:
                r.restarts += 1
                r.thrown += size
            return
        error = _ERROR_RE.search(line)
        if error:
            r.last_error = error.group(1)[:ERROR_CHARS]
