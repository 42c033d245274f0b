"""Kernel files that hold what no kernel writes: bytes that are not text, a word where a number goes, a FIFO
in a file's place, a cgroupfs that never answers. Each reading is evidence unavailable, said once a file; the
start goes on, and nothing blocks it.

Tested against directories laid out like cgroupfs (as tests/test_cgroups.py does), the whole supervisor on
one laid out for its own /proc/self/cgroup, and a real hung FUSE mount (tests/hungmount.py) as the cgroup root.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, Runner, toml_list, toml_str
from hungmount import hung_mount

from supervisor.engine.loop import EventLoop
from supervisor.engine.ports import _name
from supervisor.evidence.cgroups import MemoryCgroup, discover, read_small
from supervisor.evidence.memory import MemoryEvidence
from supervisor.text.units import MIB

NOT_TEXT = b"\xff\xfe\x80 12\n"


def lay_out(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def v1_files(**spoilt: bytes) -> dict[str, bytes]:
    files = {
        "memory.oom_control": b"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        "memory.limit_in_bytes": f"{256 * MIB}\n".encode(), "memory.usage_in_bytes": f"{7 * MIB}\n".encode(),
        "memory.max_usage_in_bytes": f"{9 * MIB}\n".encode(), "memory.failcnt": b"0\n", "cgroup.procs": b"",
        "memory.stat": b"cache 0\ntotal_inactive_file 1048576\n",
    }
    return {**files, **{name.replace("_", ".", 1): data for name, data in spoilt.items()}}


def fake_v1(tmp: Path, **spoilt: bytes) -> tuple[Path, Path, Path]:
    """A v1 root whose ``memory`` controller holds our cgroup at /box (its own files good); returns
    (root, proc_cgroup file, cgroup dir). ``memory_stat=b"..."`` spoils the cgroup's ``memory.stat``."""
    root = tmp / "v1root"
    lay_out(root / "memory", v1_files())
    cgroup = lay_out(root / "memory" / "box", v1_files(**spoilt))
    proc = tmp / "proc-self-cgroup"
    proc.write_text("4:memory:/box\n")
    return root, proc, cgroup


def evidence_of(root: Path, proc: Path, lines: list[str], mode: str = "shared", **kw: Any) -> MemoryEvidence:
    return MemoryEvidence(EventLoop(), lines.append, mode=mode, root=root, proc_cgroup=proc, **kw)


def said(lines: list[str], needle: str) -> list[str]:
    return [line for line in lines if needle in line]


# ================================================================ bytes that are not text


def test_read_small_refuses_bytes_that_are_not_text_and_what_is_no_file(tmp_path: Path) -> None:
    (tmp_path / "good").write_bytes(b"12\n")
    (tmp_path / "bad").write_bytes(NOT_TEXT)
    (tmp_path / "big").write_bytes(b"1" * (1 << 20))
    os.mkfifo(tmp_path / "fifo")
    assert read_small(tmp_path / "good") == "12\n"
    assert read_small(tmp_path / "absent") is None
    for name, why in (("bad", "bytes that are not text"), ("big", "over 65536 bytes"), ("fifo", "not a regular file")):
        with pytest.raises(ValueError, match=why):
            read_small(tmp_path / name)


@pytest.mark.parametrize("spoilt", ["memory_usage_in_bytes", "memory_limit_in_bytes", "memory_max_usage_in_bytes"])
def test_bytes_that_are_not_text_in_a_size_are_unavailable_and_said_once(tmp_path: Path, spoilt: str) -> None:
    root, proc, cgroup = fake_v1(tmp_path, **{spoilt: NOT_TEXT})
    lines: list[str] = []
    evidence = evidence_of(root, proc, lines)
    assert evidence.mode == "shared" and evidence.shared is not None and evidence.shared.path == cgroup
    snaps = [evidence.shared.snapshot() for _ in range(5)]
    assert snaps[0].oom_kills == 3  # the rest of the evidence stands
    file = spoilt.replace("_", ".", 1)
    field = {"memory.usage_in_bytes": "usage", "memory.limit_in_bytes": "limit",
             "memory.max_usage_in_bytes": "peak"}[file]
    assert all(getattr(snap, field) is None for snap in snaps)
    told = said(lines, str(cgroup / file))
    assert len(told) == 1, lines  # once, though it is read again and again
    assert "bytes that are not text" in told[0] and "unavailable" in told[0], told


def test_bytes_that_are_not_text_in_the_oom_counter_leave_the_cgroup_unread(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v1(tmp_path, memory_oom_control=b"oom_kill \xff\xff\n")
    lines: list[str] = []
    found = discover(root, proc, lambda path, why: lines.append(f"{path} {why}"))
    assert found.cgroup is not None and found.cgroup.path == root / "memory"  # the next candidate, as before
    assert said(lines, str(cgroup / "memory.oom_control")), lines

    (root / "memory" / "memory.oom_control").write_bytes(NOT_TEXT)
    lines.clear()
    evidence = evidence_of(root, proc, lines)
    assert evidence.mode == "unavailable" and "never guessed" in evidence.why, evidence.why
    assert len(said(lines, "memory.oom_control")) == 2, lines  # each file once


def test_a_word_where_a_number_goes_is_said_once_too(tmp_path: Path) -> None:
    root, proc, _cgroup = fake_v1(tmp_path, memory_usage_in_bytes=b"lots\n")
    lines: list[str] = []
    evidence = evidence_of(root, proc, lines)
    assert evidence.shared is not None
    assert evidence.shared.snapshot().usage is None and evidence.shared.snapshot().usage is None
    told = said(lines, "memory.usage_in_bytes")
    assert len(told) == 1 and "'lots' where a number goes" in told[0], lines


def test_memory_stat_gone_bad_during_the_run_costs_the_working_set_said_once(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v1(tmp_path)
    lines: list[str] = []
    evidence = evidence_of(root, proc, lines)
    shared, _where = evidence.cgroup_of("any")
    assert shared is not None and shared.working_set() == 6 * MIB
    (cgroup / "memory.stat").write_bytes(b"total_inactive_file \xc3\x28\n")
    for _tick in range(10):
        shared.working_set()
    assert len(said(lines, "memory.stat")) == 1, lines


def test_a_process_named_in_bytes_that_are_not_text_is_shown_not_fatal() -> None:
    """A port's holder is named from /proc/PID/comm, which a process sets to any bytes it likes."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child names itself, says so, and waits to be read
        ctypes.CDLL(None).prctl(15, b"odd\xff\xfename", 0, 0, 0)  # PR_SET_NAME
        os.write(writer, b"x")
        time.sleep(30)
        os._exit(0)
    try:
        os.read(reader, 1)
        assert _name(pid, "/proc") == "odd\ufffd\ufffdname"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(reader)
        os.close(writer)


# ================================================================ a file that blocks


def test_a_fifo_in_place_of_a_cgroup_file_does_not_hang_the_start(tmp_path: Path) -> None:
    # (The start reads the limit of each cgroup up the tree, alone: memory.limit_in_bytes is the file it opens.)
    root, proc, cgroup = fake_v1(tmp_path)
    (cgroup / "memory.limit_in_bytes").unlink()
    os.mkfifo(cgroup / "memory.limit_in_bytes")
    lines: list[str] = []
    made: list[MemoryEvidence] = []

    def start() -> None:  # as the start does (startup.build_core): made, then described
        made.append(evidence_of(root, proc, lines))
        lines.append(made[0].describe())

    builder = threading.Thread(target=start, daemon=True)
    builder.start()
    builder.join(10)
    if builder.is_alive():  # let the reader go (it waits for a writer), then fail
        os.close(os.open(cgroup / "memory.limit_in_bytes", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the start hung on a FIFO in place of memory.limit_in_bytes")
    assert made and made[0].mode == "shared"
    assert said(lines, "memory.limit_in_bytes is not a regular file"), lines


def test_a_cgroupfs_that_never_answers_costs_the_evidence_not_the_start(tmp_path: Path) -> None:
    with hung_mount(tmp_path / "hung") as hung:
        proc = tmp_path / "proc-self-cgroup"
        proc.write_text("4:memory:/box\n")
        lines: list[str] = []
        started = time.monotonic()
        evidence = evidence_of(hung, proc, lines, bound_s=1.0)
        waited = time.monotonic() - started
        assert waited < 5, waited
        assert evidence.mode == "unavailable" and evidence.shared is None
        assert f"the cgroup files under {hung}: no answer within 1 s" in evidence.why, evidence.why
        assert evidence.describe().startswith("memory evidence: the cgroup files under")


# ================================================================ the whole supervisor


def own_v1_memory_rel() -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if "memory" in controllers.split(","):
            return rel
    return None


@pytest.mark.parametrize("spoilt", ["memory_usage_in_bytes", "memory_oom_control"])
def test_the_supervisor_starts_and_says_it_once_on_bytes_that_are_not_text(sup: Runner, spoilt: str) -> None:
    rel = own_v1_memory_rel()
    if rel is None:
        pytest.skip("this machine's /proc/self/cgroup names no v1 memory controller to lay a fake root out for")
    root = sup.tmp / "cgroupfs"
    files = v1_files(**{spoilt: NOT_TEXT})
    lay_out(root / "memory", files)
    lay_out(root / "memory" / rel.lstrip("/"), files)
    cfg = sup.write(f"""
[[phases]]
name = "one"
command = {toml_list([PY, "-c", "print('ran')"])}
""")
    cfg.write_text(cfg.read_text().replace(
        "[supervisor]\n", f"[supervisor]\ncgroups = \"shared\"\ncgroup_root = {toml_str(str(root))}\n", 1))
    result = sup.run(cfg, timeout=60)
    out = result.output
    assert result.returncode == 0, out
    assert "Traceback" not in out and "UnicodeDecodeError" not in out, out
    file = spoilt.replace("_", ".", 1)
    assert 1 <= len(said(out.splitlines(), f"{file} holds bytes that are not text")) <= 2, out  # once a file
    assert "ran" in out


def test_a_cgroup_of_our_own_hears_its_bad_values(tmp_path: Path) -> None:
    """A phase cgroup made below ours tells the same listener (per-phase mode makes them with create_child)."""
    lines: list[str] = []
    parent = MemoryCgroup(lay_out(tmp_path / "p", v1_files()), "v1", lambda path, why: lines.append(str(path)))
    child = parent.create_child("c")
    (child.path / "memory.usage_in_bytes").write_bytes(NOT_TEXT)
    assert child.snapshot().usage is None and lines == [str(child.path / "memory.usage_in_bytes")]


# ================================================================ the ledger of phase cgroups in state_dir


def test_a_fifo_in_the_ledgers_place_does_not_hang_the_start(tmp_path: Path) -> None:
    # state_dir/cgroups was read with read_text() and appended to with open("a"): a FIFO there hung the start
    # (an open for reading waits for a writer), as /dev/zero behind a link would have filled memory. It is read as
    # every state file is (bounded, a regular file only) and written whole, which puts a regular file back.
    root, proc, _ = fake_v1(tmp_path)
    ledger = tmp_path / "state" / "cgroups"
    ledger.parent.mkdir()
    os.mkfifo(ledger)
    lines: list[str] = []
    made: list[MemoryEvidence] = []
    starting = threading.Thread(target=lambda: made.append(evidence_of(root, proc, lines, mode="auto", ledger=ledger)),
                                daemon=True)
    starting.start()
    starting.join(10)
    if not made:  # (let the hung reader go: a writer that opens and closes is its end of file)
        os.close(os.open(ledger, os.O_WRONLY | os.O_NONBLOCK))
        starting.join(5)
    assert made, "the start hung on a FIFO in the ledger's place"
    assert made[0].mode == "per-phase", (made[0].mode, lines)
    assert said(lines, f"cannot read {ledger}") and said(lines, "not a regular file"), lines
    assert ledger.is_file()  # written whole: the next phase's cgroup is noted in a regular file
    made[0].close()
