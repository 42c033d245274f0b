"""supervisor.engine.trees in-process: Descendants.tree on tables of the test's own (a leader already gone whose group
lives on, a tagged escapee's own descendants, a pid loop that must not hang), and ProcessTable readings of a
/proc laid out in a temp dir (grandchildren found, a zombie left out but its children kept, or kept with its tag
where the table keeps zombies, a malformed stat left out, a tag read once per process life and again for a
reused pid, a tag that is not UTF-8), plus one reading of the real /proc with a real child.
tests/test_many_daemons.py covers sharing and renewal of readings and a process vanishing mid-read; not repeated
here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from supervisor.engine.trees import SNAPSHOT_MAX_AGE_S, TAG_ENV, Descendants, Proc, ProcessTable

ME = os.getpid()


def pids(procs: list[Proc]) -> set[int]:
    return {p.pid for p in procs}


def test_a_leader_that_is_gone_still_has_its_group_and_their_children() -> None:
    """The leader was reaped; what it forked into its group (and their children, whatever their group) remains."""
    snap = Descendants([Proc(11, ME, 10, None), Proc(12, 11, 12, None), Proc(13, ME, 13, None)], 0.0)
    assert pids(snap.tree(10, "t.10")) == {11, 12}


def test_a_tagged_escapee_brings_its_own_descendants() -> None:
    snap = Descendants([Proc(10, ME, 10, "t.10"), Proc(20, 1, 20, "t.10"), Proc(21, 20, 20, None),
                     Proc(22, 21, 22, None), Proc(30, ME, 30, "t.30")], 0.0)
    assert pids(snap.tree(10, "t.10")) == {10, 20, 21, 22}
    assert pids(snap.tree(30, "t.30")) == {30}, "another child's tree is not this one's"


def test_an_unknown_leader_with_no_group_or_tag_is_an_empty_tree() -> None:
    snap = Descendants([Proc(10, ME, 10, "t.10")], 0.0)
    assert snap.tree(99, "t.99") == []


def test_each_process_is_in_a_tree_once_even_through_a_parent_loop() -> None:
    """A table read while pids were reused can show a loop of parents: the walk ends, nobody counted twice."""
    snap = Descendants([Proc(10, 11, 10, "t"), Proc(11, 10, 10, "t")], 0.0)
    tree = snap.tree(10, "t")
    assert sorted(p.pid for p in tree) == [10, 11]


def test_the_snapshot_indexes_by_pid() -> None:
    procs = [Proc(10, ME, 10, None), Proc(11, 10, 10, "x")]
    snap = Descendants(procs, 42.0)
    assert snap.taken_at == 42.0 and snap.procs == {10: procs[0], 11: procs[1]}


class FakeProc:
    """A /proc of files: ``add`` writes one process's stat and environ as the kernel lays them out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "self").mkdir(parents=True)

    def add(self, pid: int, ppid: int, *, pgid: int | None = None, state: str = "S", started: int = 100,
            env: bytes | None = b"PATH=/bin\0", comm: str = "sleep") -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        fields = [state, str(ppid), str(pgid if pgid is not None else pid)] + ["0"] * 16 + [str(started)]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0\n")
        if env is not None:
            (d / "environ").write_bytes(env)
        elif (d / "environ").exists():
            (d / "environ").unlink()

    def remove(self, pid: int) -> None:
        d = self.root / str(pid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()

    def table(self) -> tuple[ProcessTable, list[float]]:
        now = [0.0]
        return ProcessTable(clock=lambda: now[0], proc=str(self.root)), now


def tagged(tag: str) -> bytes:
    return b"A=1\0" + TAG_ENV.encode() + b"=" + tag.encode() + b"\0B=2\0"


def test_grandchildren_are_descendants_and_strangers_are_not(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME)
    proc.add(101, 100)
    proc.add(102, 101)
    proc.add(200, 1)  # not below the supervisor
    proc.add(201, 200)
    table, _ = proc.table()
    assert sorted(table.snapshot().procs) == [100, 101, 102]


def test_a_zombie_is_left_out_but_its_children_are_kept(tmp_path: Path) -> None:
    """A zombie cannot be signalled; what it forked before dying can, and still shows it as parent until
    reparented."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, state="Z")
    proc.add(101, 100)
    table, _ = proc.table()
    assert sorted(table.snapshot().procs) == [101]


def test_a_table_that_keeps_zombies_has_each_with_the_tag_it_had_alive(tmp_path: Path) -> None:
    """The I/O thread's table: a zombie's counters are read until its reap (iowatch.py). Its environment went with
    its memory (it reads empty): the tag is the one read while it lived, none for one first seen dead."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"))
    now = [0.0]
    table = ProcessTable(clock=lambda: now[0], proc=str(proc.root), zombies=True)
    assert table.snapshot().procs[100].tag == "t.1"
    proc.add(100, ME, state="Z", env=b"")
    proc.add(101, 100)  # (forked before 100 died, not reparented yet)
    proc.add(102, ME, state="Z", env=b"")
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    snap = table.snapshot()
    assert snap.procs == {100: Proc(100, ME, 100, "t.1"), 101: Proc(101, 100, 101, None),
                          102: Proc(102, ME, 102, None)}
    assert pids(snap.tree(100, "t.1")) == {100, 101}


def test_a_name_with_parentheses_and_spaces_is_read_past(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, pgid=77, comm="x) S 1 1 (evil")
    table, _ = proc.table()
    assert table.snapshot().procs[100] == Proc(100, ME, 77, None)
    assert table.snapshot().procs[100].name == "x) S 1 1 (evil", "the name is all between the first ( and last )"


def test_a_malformed_stat_is_left_out(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME)
    proc.add(101, ME)
    (proc.root / "101" / "stat").write_text("101 (short) S 1\n")
    (proc.root / "102").mkdir()
    (proc.root / "102" / "stat").write_text("102 (bad) S notanumber 1 0\n")
    table, _ = proc.table()
    assert sorted(table.snapshot().procs) == [100]


def test_a_tag_is_read_once_in_a_process_life(tmp_path: Path) -> None:
    """Its environment does not change: a later reading keeps the tag even if the file now says otherwise."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"))
    table, now = proc.table()
    assert table.snapshot().procs[100].tag == "t.1"
    (proc.root / "100" / "environ").write_bytes(tagged("t.2"))
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[100].tag == "t.1" and table.scans == 2


def test_a_reused_pid_has_its_tag_read_again(tmp_path: Path) -> None:
    """Same pid, another start time: another process, whose environment is read afresh."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"), started=100)
    table, now = proc.table()
    assert table.snapshot().procs[100].tag == "t.1"
    proc.add(100, ME, env=tagged("t.9"), started=555)
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[100].tag == "t.9"


def test_a_process_gone_from_a_reading_is_forgotten(tmp_path: Path) -> None:
    """The tag cache holds only the processes of the last reading: one that left and came back with the same
    pid and start time (another /proc namespace's numbering, a fake) is read again."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=tagged("t.1"))
    table, now = proc.table()
    table.snapshot()
    proc.remove(100)
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs == {}
    proc.add(100, ME, env=tagged("t.3"))
    now[0] += SNAPSHOT_MAX_AGE_S * 2
    assert table.snapshot().procs[100].tag == "t.3"


def test_a_tag_that_is_not_utf8_is_read_with_replacement(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=TAG_ENV.encode() + b"=t.\xff\0")
    table, _ = proc.table()
    assert table.snapshot().procs[100].tag == "t.\ufffd"


def test_an_environment_without_the_tag_or_an_empty_one_is_no_tag(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, ME, env=b"")
    proc.add(101, ME, env=b"NOT_" + TAG_ENV.encode() + b"=x\0" + TAG_ENV.encode() + b"X=y\0")
    table, _ = proc.table()
    snap = table.snapshot()
    assert snap.procs[100].tag is None and snap.procs[101].tag is None


def test_a_reading_of_the_real_proc_finds_a_real_child_and_its_tag(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "30"], env={**os.environ, TAG_ENV: "rules.1"}, process_group=0)
    try:
        snap = ProcessTable().snapshot()
        assert snap.procs[child.pid] == Proc(child.pid, ME, child.pid, "rules.1")
        assert pids(snap.tree(child.pid, "rules.1")) == {child.pid}
    finally:
        child.kill()
        child.wait(10)
    assert child.pid not in ProcessTable().snapshot().procs, "reaped: gone from a fresh reading"
