"""supervisor.state.files on a real temp dir: a file replaced whole or not at all (mode 0600, no temporary copy
left behind, even when the replace fails), and read back bounded, whatever stands at the path (a FIFO with no
writer, /dev/zero behind a link, a directory, a file bigger than the limit); a JSON state file loaded (a JSON
object, then the file's own parse) or refused in one line that says whether it could not be read or is not
what the file holds."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from supervisor.state.files import StateFileError, load_json, read_regular_file, save_json, write_atomically


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_new_file_is_written_whole_and_for_roots_eyes_only(tmp_path: Path) -> None:
    old = os.umask(0)  # even a permissive umask must not widen it
    try:
        write_atomically(tmp_path / "status.json", b'{"a": 1}')
    finally:
        os.umask(old)
    assert (tmp_path / "status.json").read_bytes() == b'{"a": 1}'
    assert stat.S_IMODE((tmp_path / "status.json").stat().st_mode) == 0o600
    assert leftovers(tmp_path) == []


def test_the_rename_is_made_durable_by_syncing_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the directory is fsynced a host's crash may lose the rename: a lost give-up marker runs a given-up
    instance again. The real fsync runs; what it was called on is noted."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomically(tmp_path / "given-up.json", b"{}")
    assert len(synced) == 2 and synced[0].endswith(".tmp"), synced  # the file's bytes, then ...
    assert synced[1] == str(tmp_path), synced  # ... the directory, after the rename


def test_an_existing_file_is_replaced_not_rewritten_in_place(tmp_path: Path) -> None:
    """A reader holding the old file open keeps reading the old bytes: the new file is another inode."""
    path = tmp_path / "resume.json"
    path.write_bytes(b"old content, longer than the new")
    with path.open("rb") as reader:
        write_atomically(path, b"new")
        assert reader.read() == b"old content, longer than the new"
    assert path.read_bytes() == b"new"
    assert leftovers(tmp_path) == []


def test_a_link_at_the_path_is_replaced_and_its_target_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not ours")
    (tmp_path / "status.json").symlink_to(target)
    write_atomically(tmp_path / "status.json", b"ours")
    assert target.read_bytes() == b"not ours"
    assert not (tmp_path / "status.json").is_symlink()
    assert (tmp_path / "status.json").read_bytes() == b"ours"


def test_a_failed_replace_leaves_the_old_thing_and_no_temporary_copy(tmp_path: Path) -> None:
    """A directory where the file should be: rename fails after the copy was written; the copy goes (a full
    disk needs its space back) and the error is the caller's."""
    (tmp_path / "status.json").mkdir()
    (tmp_path / "status.json" / "keep").write_text("x")
    with pytest.raises(OSError):
        write_atomically(tmp_path / "status.json", b"data")
    assert (tmp_path / "status.json" / "keep").read_text() == "x"
    assert leftovers(tmp_path) == []


def test_a_missing_directory_raises_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "gone" / "status.json", b"data")
    assert list(tmp_path.iterdir()) == []


def test_the_temporary_copy_is_hidden_and_named_for_this_process(tmp_path: Path) -> None:
    """A stale copy of another pid (a SIGKILL mid-write) is neither read nor clobbered by this one."""
    stale = tmp_path / f".status.json.{os.getpid() + 1}.tmp"
    stale.write_bytes(b"half")
    write_atomically(tmp_path / "status.json", b"whole")
    assert stale.read_bytes() == b"half"
    assert (tmp_path / "status.json").read_bytes() == b"whole"


def test_reading_back_what_was_written(tmp_path: Path) -> None:
    write_atomically(tmp_path / "f", b"0123456789")
    assert read_regular_file(tmp_path / "f", 10) == b"0123456789"
    assert read_regular_file(tmp_path / "f", 1000) == b"0123456789"


def test_a_file_bigger_than_the_limit_is_refused_naming_both_sizes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 11)
    with pytest.raises(ValueError, match=r"^11 bytes, more than the 10 it can be$"):
        read_regular_file(tmp_path / "f", 10)


def test_an_empty_file_reads_as_no_bytes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    assert read_regular_file(tmp_path / "f", 0) == b""


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "none", 10)


def test_a_fifo_with_no_writer_does_not_hang_the_reader(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "status.json")
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular_file(tmp_path / "status.json", 10)


def test_dev_zero_behind_a_link_does_not_fill_memory(tmp_path: Path) -> None:
    (tmp_path / "status.json").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular_file(tmp_path / "status.json", 10)


def test_a_directory_is_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "status.json").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular_file(tmp_path / "status.json", 10)


def test_a_dangling_link_is_file_not_found(tmp_path: Path) -> None:
    (tmp_path / "status.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "status.json", 10)


def test_reading_leaks_no_descriptor(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    os.mkfifo(tmp_path / "fifo")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        read_regular_file(tmp_path / "f", 10)
        with pytest.raises(ValueError):
            read_regular_file(tmp_path / "fifo", 10)
        with pytest.raises(ValueError):
            read_regular_file(tmp_path / "f", 1)
    assert len(os.listdir("/proc/self/fd")) == before


# ---------------------------------------------------------------- a JSON state file


def positive(data: dict[str, Any]) -> int:
    """A stand-in file's parse: its "n", a positive whole number."""
    if not isinstance(data["n"], int) or data["n"] <= 0:
        raise ValueError(f"n: {data['n']!r} is not a positive whole number")
    return data["n"]


def test_a_state_file_saved_is_loaded_back_through_its_parse(tmp_path: Path) -> None:
    save_json(tmp_path / "s.json", {"n": 3, "at": Path("/x")})  # (a value JSON has no form for: its text)
    assert json.loads((tmp_path / "s.json").read_text()) == {"n": 3, "at": "/x"}
    assert stat.S_IMODE((tmp_path / "s.json").stat().st_mode) == 0o600
    assert load_json(tmp_path / "s.json", 100, "a count", positive) == 3


def test_no_state_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_json(tmp_path / "none.json", 100, "a count", positive)


@pytest.mark.parametrize(("content", "cause"), [
    (b"{not json", "JSONDecodeError"),
    (b"\xff\xfe{", "UnicodeDecodeError"),
    (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),  # nested past the parser's depth: said, never raised
    (b" " * 101, "ValueError"),  # bigger than its bound
])
def test_a_state_file_that_cannot_be_read_says_so_in_one_line(tmp_path: Path, content: bytes, cause: str) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(StateFileError) as raised:
        load_json(path, len(content) - 1 if cause == "ValueError" else len(content), "a count", positive)
    assert not raised.value.readable and type(raised.value.cause).__name__ == cause
    assert str(raised.value).startswith(f"{path} is unreadable ({cause}: ") and "\n" not in str(raised.value)


def test_a_fifo_at_a_state_file_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "s.json")
    with pytest.raises(StateFileError, match=r"is unreadable \(ValueError: not a regular file\)$"):
        load_json(tmp_path / "s.json", 100, "a count", positive)


@pytest.mark.parametrize(("content", "problem"), [
    ("[1, 2]", "a JSON array, not an object"),
    ("null", "a JSON null, not an object"),
    ('{"n": -1}', "n: -1 is not a positive whole number"),
    ('{"m": 1}', "'n'"),  # the parse's own KeyError
])
def test_a_state_file_of_another_shape_says_where(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(StateFileError) as raised:
        load_json(path, 100, "a count", positive)
    assert raised.value.readable
    assert str(raised.value) == f"{path} does not hold a count ({problem})"
