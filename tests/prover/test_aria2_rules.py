"""What the stand-in aria2c prints and leaves (standins/aria2.py), in-process on a real temp dir.

Promises: a download resumes (``--continue``) at its control file's offset, clamped to the file, else at the
length of a file shorter than the whole, else from 0; the readout is aria2c's own line, which the supervisor's
reader (prover/fetchlines.py) reads back to the same figures, within the rounding aria2c prints with; the
readouts reach a pipe with each progress summary, every ``summary-interval`` of aria2c's configuration file.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from profilekit import parsed

from supervisor.prover import fetchlines
from supervisor.prover.standins import aria2

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def paths(tmp_path: Path) -> tuple[str, str]:
    target = tmp_path / "v28-proof.params"
    return str(target), str(target) + aria2.CONTROL_SUFFIX


def test_resume_at_the_control_files_offset_clamped_to_the_file(tmp_path: Path) -> None:
    target, control = paths(tmp_path)
    Path(target).write_bytes(b"\0" * 1000)  # preallocated: its length says nothing of what was fetched
    aria2.write_control(control, 300)
    assert Path(control).read_text() == "300"
    assert aria2.resumed_offset(target, control, 1000) == 300
    aria2.write_control(control, 5000)
    assert aria2.resumed_offset(target, control, 1000) == 1000
    aria2.write_control(control, -7)
    assert aria2.resumed_offset(target, control, 1000) == 0


def test_without_a_readable_control_file_a_short_file_resumes_at_its_length(tmp_path: Path) -> None:
    target, control = paths(tmp_path)
    Path(target).write_bytes(b"x" * 400)
    assert aria2.resumed_offset(target, control, 1000) == 400  # no control file
    Path(control).write_text("not a number")
    assert aria2.resumed_offset(target, control, 1000) == 400
    Path(control).write_text("")
    assert aria2.resumed_offset(target, control, 1000) == 0  # an empty control file: offset 0


def test_a_whole_file_without_a_control_file_starts_again_and_no_file_starts_at_zero(tmp_path: Path) -> None:
    target, control = paths(tmp_path)
    assert aria2.resumed_offset(target, control, 1000) == 0
    Path(target).write_bytes(b"x" * 1000)
    assert aria2.resumed_offset(target, control, 1000) == 0


def test_preallocate_gives_the_file_its_whole_size(tmp_path: Path) -> None:
    target, _ = paths(tmp_path)
    fd = os.open(target, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        aria2.preallocate(fd, 3 * MIB)
    finally:
        os.close(fd)
    assert os.path.getsize(target) == 3 * MIB


def test_sizes_as_aria2c_prints_them() -> None:
    assert [aria2.aria2_size(n) for n in (0, 512, 16 * KIB, int(8.2 * MIB), 57 * MIB, int(1.5 * GIB), 64 * GIB)] == \
        ["0B", "512B", "16KiB", "8.2MiB", "57MiB", "1.5GiB", "64GiB"]
    assert aria2.aria2_size(1023) == "1023B" and aria2.aria2_size(1024) == "1.0KiB"


def test_the_readout_line_and_its_eta() -> None:
    assert aria2.readout("896ec2", int(8.2 * MIB), 57 * MIB, 4 * MIB) == \
        "[#896ec2 8.2MiB/57MiB(14%) CN:1 DL:4.0MiB ETA:12s]"
    assert aria2.readout("0a", 0, 60 * MIB, MIB) == "[#0a 0B/60MiB(0%) CN:1 DL:1.0MiB ETA:1m0s]"
    assert aria2.readout("0a", 10, 10, 5) == "[#0a 10B/10B(100%) CN:1 DL:5B]"  # nothing left: no ETA
    assert aria2.readout("0a", 0, 0, 0) == "[#0a 0B/0B(0%) CN:1 DL:0B]"  # no rate, no size: no division


def test_the_supervisors_reader_reads_the_readout_back() -> None:
    for done, total in ((16 * KIB, 6 * MIB), (int(8.2 * MIB), 57 * MIB), (3 * GIB, 32 * GIB), (512, 2048)):
        result = parsed("paramfetch", aria2.readout("00ad52", done, total, MIB) + "\n")
        assert result.readouts == 1
        # aria2c prints one decimal below 10 of a unit and none above: the figures agree to that rounding.
        got, size = result.under_way["00ad52"]
        assert got == result.in_flight and abs(got - done) <= max(1, done) * 0.06
        assert abs(size - total) <= max(1, total) * 0.06


def test_the_notice_and_stamp_are_what_the_reader_takes_for_a_complete_file() -> None:
    line = f"{aria2.stamp()} [{aria2.NOTICE}] Download complete: /p/v28-proof.params"
    assert re.fullmatch(r"\d\d/\d\d \d\d:\d\d:\d\d \[.*NOTICE.*\] Download complete: /p/v28-proof\.params", line)
    parser = fetchlines.FetchParser()
    parser.feed([line.encode()])
    assert parser.result.files == {"/p/v28-proof.params"}


def test_the_progress_summary_is_aria2cs_own_block() -> None:
    # Measured with aria2 1.36.0 into a pipe (a dead gateway, --summary-interval=2), the time aside.
    measured = [" *** Download Progress Summary as of Mon Dec  7 21:35:07 2026 *** ", "=" * 79,
                "[#37ca76 0B/0B CN:1 DL:0B]", "FILE: c/f.params", "-" * 79, ""]
    block = aria2.summary(aria2.unanswered("37ca76"), "c/f.params").split("\n")
    assert re.fullmatch(r" \*\*\* Download Progress Summary as of \w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} \*\*\* ",
                        block[0]), block
    assert block[1:] == measured[1:], block


def test_the_summary_interval_is_read_where_aria2c_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert aria2.summary_interval() == 60  # no configuration file: aria2c's default
    (xdg / "aria2").mkdir(parents=True)
    (xdg / "aria2" / "aria2.conf").write_text("# mine\nmax-tries=5\nsummary-interval=2\n")
    assert aria2.summary_interval() == 2
    (home / ".aria2").mkdir(parents=True)
    (home / ".aria2" / "aria2.conf").write_text("summary-interval = 0\n")
    assert aria2.summary_interval() == 0  # $HOME/.aria2/aria2.conf first, where there is one; 0: none
    (home / ".aria2" / "aria2.conf").write_text("summary-interval=soon\n")
    assert aria2.summary_interval() == 60  # (a value aria2c would refuse: the default)


def test_readouts_reach_a_pipe_with_each_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(aria2, "time", SimpleNamespace(monotonic=lambda: clock[0], strftime=time.strftime))
    monkeypatch.setattr(aria2, "summary_interval", lambda: 3)
    written: list[bytes] = []
    monkeypatch.setattr(aria2.Readouts, "_write", staticmethod(written.append))
    readouts = aria2.Readouts("c/f.params")
    readouts._pipe = True  # (as into the supervisor's pipe, whatever pytest's stdout is)
    for _ in range(2):
        clock[0] += 1
        readouts.readout(aria2.unanswered("37ca76"))
    assert written == []  # held: nothing moved them out
    clock[0] += 1
    readouts.readout(aria2.unanswered("37ca76"))
    [burst] = written
    lines, readout = burst.decode().split("\n"), aria2.unanswered("37ca76")
    assert lines[:2] == [readout] * 2, lines  # the seconds before, then the summary (this second's readout is held)
    assert "*** Download Progress Summary as of" in lines[2] and lines[3:] == ["=" * 79, readout, "FILE: c/f.params",
                                                                              "-" * 79, "", ""], lines
    for _ in range(3):
        clock[0] += 1
        readouts.readout(aria2.unanswered("37ca76"))
    assert len(written) == 2 and written[1].decode().split("\n")[:3] == [readout] * 3, written  # at the next one
