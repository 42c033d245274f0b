"""Memory cgroups: discovery (v2, v1, container-style, none), snapshots, sizes, the OOM watches.

Discovery and snapshots are tested against directories laid out like cgroupfs
(v2 unified, v1 ``memory`` controller). The watches are tested for real: inotify
on a fake v2 ``memory.events`` that the test rewrites, and the v1 eventfd on a
real child cgroup of this process's own memory cgroup that a real process is
OOM-killed in (skipped, with the reason, where v1 is not writable here).

The helpers the other memory tests share (``v1_memory_cgroup_or_skip``, ``v1_cgroup``,
``start_in_cgroup``) are in helpers.py.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import (
    REPO,
    V1_MOUNT,
    Runner,
    alloc_script,
    finish,
    first_line,
    in_cgroup_argv,
    needs_unshare,
    own_v1_memory_cgroup,
    pid_alive,
    remove_cgroup,
    run_in_cgroup,
    start_in_cgroup,
    supervisor_pid,
    toml_list,
    until,
    v1_cgroup,
    v1_memory_cgroup_or_skip,
    wait_for,
)

from supervisor.engine.loop import EventLoop
from supervisor.engine.reaping import ExitStatus
from supervisor.engine.trees import STATE_DIR_ENV, TAG_ENV, own_pid_namespace, tag_for
from supervisor.evidence.cgroups import (
    INIT_PID_NAMESPACE,
    SUBTREE_MAX,
    V1_UNLIMITED,
    MemoryCgroup,
    MemorySnapshot,
    OomKills,
    discover,
    is_phase_cgroup,
    mem_total,
    phase_cgroup_name,
    phase_cgroup_owner,
)
from supervisor.evidence.memory import OOM_POLL_S, MemoryEvidence, kills_since
from supervisor.lifecycle.verdict import OOM_KILLED, from_exit
from supervisor.text.show import fmt_bytes
from supervisor.text.units import GIB as GiB
from supervisor.text.units import MIB as MiB

V1_NO_LIMIT = 9223372036854771712  # what v1 shows in memory.limit_in_bytes when unlimited


# ================================================================ fake cgroupfs trees


def write_files(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def v2_events(oom_kill: int = 0, oom_group_kill: int = 0) -> str:
    return f"low 0\nhigh 0\nmax 7\noom {oom_kill + 1}\noom_kill {oom_kill}\noom_group_kill {oom_group_kill}\n"


def v1_oom_control(oom_kill: int = 0) -> str:
    return f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n"


def fake_v2(tmp: Path, rel: str = "/kubepods/pod1/box", *, memory_max: str = "max", oom_kill: int = 2,
            oom_group_kill: int = 1) -> tuple[Path, Path, Path]:
    """A v2 root with our cgroup at ``rel``; returns (root, proc_cgroup file, cgroup dir)."""
    root = write_files(tmp / "v2root", {"cgroup.controllers": "cpu io memory pids\n", "cgroup.procs": ""})
    cgroup = write_files(root / rel.lstrip("/"), {
        "memory.events": v2_events(oom_kill, oom_group_kill), "memory.max": f"{memory_max}\n",
        "memory.current": f"{3 * MiB}\n", "memory.peak": f"{5 * MiB}\n", "cgroup.procs": f"{os.getpid()}\n",
    })  # (the supervisor alone in its cgroup, as PID 1 of a container is)
    proc = tmp / "proc-self-cgroup"
    proc.write_text(f"0::{rel}\n")
    return root, proc, cgroup


def fake_v1(tmp: Path, rel: str = "/docker/abc", *, limit: int = V1_NO_LIMIT, oom_kill: int = 3) -> tuple[
        Path, Path, Path]:
    root = tmp / "v1root"
    write_files(root / "memory", {"memory.oom_control": v1_oom_control(0), "cgroup.procs": ""})
    cgroup = write_files(root / "memory" / rel.lstrip("/"), {
        "memory.oom_control": v1_oom_control(oom_kill), "memory.limit_in_bytes": f"{limit}\n",
        "memory.usage_in_bytes": f"{7 * MiB}\n", "memory.max_usage_in_bytes": f"{9 * MiB}\n",
        "memory.failcnt": "4\n", "cgroup.procs": "1\n",
    })
    proc = tmp / "proc-self-cgroup"
    proc.write_text(f"12:pids:/docker/abc\n4:memory:{rel}\n1:name=systemd:/docker/abc\n")
    return root, proc, cgroup


def mountinfo_file(tmp: Path, cgroup2_at: Path | None, super_options: str = "rw,nsdelegate") -> Path:
    """A /proc/self/mountinfo as a container's reads, with a cgroup2 mount at ``cgroup2_at`` (None: none),
    ``super_options`` its options after the " - " (where ``memory_localevents`` is shown)."""
    lines = ["1051 1050 0:94 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w",
             "1052 1051 0:97 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw",
             "1055 1051 0:99 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro"]
    if cgroup2_at is not None:  # (the kernel writes a space in a path as \040)
        lines.append(f"1056 1055 0:29 / {str(cgroup2_at).replace(' ', chr(92) + '040')} ro,nosuid,nodev,noexec,"
                     f"relatime shared:9 - cgroup2 cgroup2 {super_options}")
    path = tmp / "mountinfo"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def v2_events_both(directory: Path, hierarchical: int, local: int) -> Path:
    """A v2 cgroup's ``memory.events`` (``hierarchical``: its kills and those below it, or only its own under
    memory_localevents) and ``memory.events.local`` (``local``: always only its own)."""
    return write_files(directory, {"memory.events": v2_events(hierarchical), "memory.events.local": v2_events(local)})


# ================================================================ discovery


def test_discover_v2(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path)
    found = discover(root, proc)
    assert found.cgroup is not None, found.why
    assert found.cgroup.version == "v2"
    assert found.cgroup.path == cgroup
    assert "v2" in found.why and str(cgroup) in found.why


def test_snapshot_v2_unlimited_and_limited(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path, oom_kill=2, oom_group_kill=1)
    found = discover(root, proc)
    assert found.cgroup is not None, found.why
    snap = found.cgroup.snapshot()
    assert snap == MemorySnapshot(oom_kills=2, usage=3 * MiB, peak=5 * MiB, limit=None, oom=OomKills({cgroup: 2}))
    assert found.cgroup.oom_kills() == 2
    assert found.cgroup.limit() is None
    assert snap.describe() == "usage=3.0MiB peak=5.0MiB limit=none oom_kills=2"

    (cgroup / "memory.max").write_text(f"{512 * MiB}\n")
    (cgroup / "memory.events").write_text(v2_events(5, 0))
    snap = found.cgroup.snapshot()
    assert snap.limit == 512 * MiB
    assert snap.oom_kills == 5
    assert "limit=512.0MiB" in snap.describe()


def test_snapshot_v2_missing_files_are_unknown(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path)
    (cgroup / "memory.peak").unlink()  # kernels before 5.19 have no memory.peak
    (cgroup / "memory.current").write_text("garbage\n")
    snap = discover(root, proc).cgroup.snapshot()  # type: ignore[union-attr]
    assert snap.peak is None and snap.usage is None
    assert "peak=?" in snap.describe()


def test_discover_v1(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v1(tmp_path)
    found = discover(root, proc)
    assert found.cgroup is not None, found.why
    assert found.cgroup.version == "v1"
    assert found.cgroup.path == cgroup
    assert "v1" in found.why


def test_snapshot_v1_huge_limit_is_unlimited(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v1(tmp_path, oom_kill=3)
    snap = discover(root, proc).cgroup.snapshot()  # type: ignore[union-attr]
    assert snap == MemorySnapshot(oom_kills=3, usage=7 * MiB, peak=9 * MiB, limit=None, oom=OomKills({cgroup: 3}),
                                  under_oom=False)
    assert V1_NO_LIMIT >= V1_UNLIMITED  # what a real unlimited v1 cgroup shows


def test_snapshot_v1_limited(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v1(tmp_path, limit=256 * MiB, oom_kill=0)
    found = discover(root, proc)
    assert found.cgroup is not None
    snap = found.cgroup.snapshot()
    assert snap.limit == 256 * MiB and found.cgroup.limit() == 256 * MiB
    assert snap.oom_kills == 0
    (cgroup / "memory.oom_control").write_text(v1_oom_control(1))
    assert found.cgroup.oom_kills() == 1


def test_v2_oom_kills_are_read_from_the_hierarchical_memory_events(tmp_path: Path) -> None:
    """v2's ``memory.events`` counts a kill in any cgroup below too; ``memory.events.local`` only this one's own:
    a kill in a cgroup a child made below ours must count."""
    _root, _proc, cgroup = fake_v2(tmp_path, oom_kill=1)
    (cgroup / "memory.events.local").write_text(v2_events(0))  # the victim was in a cgroup below
    below = write_files(cgroup / "inner", {"memory.events": v2_events(1)})
    ours = MemoryCgroup(cgroup, "v2")
    assert ours.oom_kills() == 1 and ours.snapshot().oom == OomKills({cgroup: 1})  # read once, never summed
    assert MemoryCgroup(below, "v2").oom_kills() == 1


def test_v2_under_memory_localevents_oom_kills_count_each_cgroup_below_apart(tmp_path: Path) -> None:
    """Mounted with memory_localevents, v2's ``memory.events`` counts only the cgroup's own kills, as v1's counter
    does: ours is read with every cgroup below it, each from its ``memory.events.local``."""
    root, proc, cgroup = fake_v2(tmp_path / "a mount", oom_kill=1)  # (a space in the mount point: \040 there)
    v2_events_both(cgroup, 1, 1)  # (under the option both files hold the cgroup's own)
    inner = v2_events_both(cgroup / "inner", 0, 0)
    mountinfo = mountinfo_file(tmp_path, root, "rw,nsdelegate,memory_localevents,memory_recursiveprot")
    found = discover(root, proc, mountinfo=mountinfo)
    assert found.cgroup is not None and found.cgroup.local_events, found.why
    assert found.why == f"cgroup v2 at {cgroup} (memory_localevents: OOM kills counted over each cgroup below)"
    before = found.cgroup.oom_counts()
    assert before == OomKills({cgroup: 1, inner: 0})

    v2_events_both(inner, 1, 1)  # a kill in the cgroup below: ours stays at 1
    assert kills_since(found.cgroup.oom_counts(), before) == 1  # (the hierarchical reading: 0)
    assert found.cgroup.create_child("prover-1-bench").local_events  # a phase cgroup is read the same way

    # The option cleared by a remount since (memory.events hierarchical again): ``.local`` is still each one's
    # own, so the kill below is never counted twice.
    v2_events_both(cgroup, 3, 1)
    v2_events_both(inner, 2, 2)
    assert kills_since(found.cgroup.oom_counts(), before) == 2


def test_v1_oom_kills_count_each_cgroup_below_apart(tmp_path: Path) -> None:
    """v1 counts a kill in the victim's own cgroup only (measured: tests/test_oom.py): ours is read with every
    cgroup below it but those named apart (phase cgroups), and a rise is each cgroup's own."""
    _root, _proc, cgroup = fake_v1(tmp_path, oom_kill=1)
    inner = write_files(cgroup / "inner", {"memory.oom_control": v1_oom_control(2)})
    deeper = write_files(inner / "deeper", {"memory.oom_control": v1_oom_control(3)})
    write_files(cgroup / "prover-42-bench", {"memory.oom_control": v1_oom_control(5)})
    ours = MemoryCgroup(cgroup, "v1", phases_apart=True)
    before = ours.oom_counts()
    assert before == OomKills({cgroup: 1, inner: 2, deeper: 3})
    assert ours.oom_kills() == 6 and MemoryCgroup(cgroup, "v1").oom_kills() == 11  # apart: left out, or not

    for name in os.listdir(deeper):  # removed, its 3 kills with it
        (deeper / name).unlink()
    deeper.rmdir()
    (inner / "memory.oom_control").write_text(v1_oom_control(3))  # one kill in inner
    fresh = write_files(cgroup / "fresh", {"memory.oom_control": v1_oom_control(1)})  # made since, one kill
    after = ours.oom_counts()
    assert after == OomKills({cgroup: 1, inner: 3, fresh: 1})
    assert after.total < before.total and kills_since(after, before) == 2  # a difference of sums would say none

    (cgroup / "memory.oom_control").unlink()
    assert ours.oom_counts() is None  # its own counter unreadable: unknown, never the ones below alone


def test_only_the_phase_cgroups_right_below_ours_are_left_apart(tmp_path: Path) -> None:
    """The supervisor makes its phases' cgroups right below its own; one named alike deeper down is a workload's
    own (or a phase's child's), and its kills are the shared cgroup's to count."""
    _root, _proc, cgroup = fake_v1(tmp_path, oom_kill=0)
    inner = write_files(cgroup / "inner", {"memory.oom_control": v1_oom_control(0)})
    nested = write_files(inner / "prover-7-work", {"memory.oom_control": v1_oom_control(4)})
    write_files(cgroup / "prover-7-work", {"memory.oom_control": v1_oom_control(5)})  # a phase's: apart
    ours = MemoryCgroup(cgroup, "v1", phases_apart=True)
    assert ours.subtree() == [cgroup, inner, nested]
    assert ours.oom_kills() == 4


def test_v1_oom_kills_past_the_bound_of_cgroups_below_are_unknown(tmp_path: Path) -> None:
    _root, _proc, cgroup = fake_v1(tmp_path)
    said: list[tuple[Path, str]] = []
    ours = MemoryCgroup(cgroup, "v1", on_bad=lambda path, why: said.append((path, why)))
    for n in range(SUBTREE_MAX - 1):
        (cgroup / f"c{n}").mkdir()
    assert ours.oom_kills() == 3 and not said  # (cgroups without a counter: removed as they were read)
    (cgroup / "c0" / "one-more").mkdir()
    assert ours.oom_kills() is None and ours.snapshot().oom_kills is None
    assert set(said) == {(cgroup, f"has over {SUBTREE_MAX} cgroups below it")}  # (each reading: said once by
    # MemoryEvidence, its owner)
    # Still a cgroup whose counter reads: discover's choice among cgroups must not turn on how crowded one is.
    assert ours.readable()


def test_discover_container_v2_path_missing_falls_back_to_the_mount_root(tmp_path: Path) -> None:
    """In a container /proc/self/cgroup shows the host's path; the namespace's root is the mount root."""
    root = write_files(tmp_path / "root", {"cgroup.controllers": "memory\n", "memory.events": v2_events(1),
                                           "memory.max": f"{2 * GiB}\n", "memory.current": "1\n"})
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/kubepods.slice/kubepods-pod42.slice/cri-containerd-abc.scope\n")
    found = discover(root, proc)
    assert found.cgroup is not None, found.why
    assert found.cgroup.path == root
    assert found.cgroup.version == "v2"
    assert found.cgroup.snapshot().limit == 2 * GiB
    assert found.cgroup.oom_kills() == 1


def test_discover_container_v1_path_missing_falls_back_to_the_mount_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_files(root / "memory", {"memory.oom_control": v1_oom_control(2), "memory.limit_in_bytes": f"{GiB}\n"})
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/docker/0123456789abcdef\n")
    found = discover(root, proc)
    assert found.cgroup is not None, found.why
    assert found.cgroup.path == root / "memory"
    assert found.cgroup.oom_kills() == 2
    assert found.cgroup.limit() == GiB


@pytest.mark.parametrize("mountinfo_is", ["absent", "without-cgroup2", "cgroup2-elsewhere", "mounted-over", "a-fifo"])
def test_v2_without_memory_localevents_known_reads_the_hierarchical_counter(tmp_path: Path, mountinfo_is: str) -> None:
    """Where mountinfo does not show memory_localevents on the mount at the root (it cannot be read, or shows no
    cgroup2 mount there), the one hierarchical ``memory.events`` is read, as without the option. That is the
    safe direction: every v2 kernel has it, it is right at the kernel's default, and were the option on after
    all it would only miss a kill below (a SIGKILL, as before the option was known), never count one twice or
    one that was not in the cgroup; the walk reads ``memory.events.local``, which a kernel before 5.2 lacks."""
    root, proc, cgroup = fake_v2(tmp_path, oom_kill=1)
    v2_events_both(cgroup, 1, 0)  # the kill was in the cgroup below: counted in ours too
    v2_events_both(cgroup / "inner", 1, 1)
    mountinfo = {
        "absent": lambda: tmp_path / "no-mountinfo",
        "without-cgroup2": lambda: mountinfo_file(tmp_path, None),
        "cgroup2-elsewhere": lambda: mountinfo_file(tmp_path, Path("/sys/fs/cgroup"), "rw,memory_localevents"),
        "mounted-over": lambda: mountinfo_file(tmp_path, root, "rw,memory_localevents"),
        "a-fifo": lambda: tmp_path / "fifo",
    }[mountinfo_is]()
    if mountinfo_is == "mounted-over":  # a tmpfs mounted over the cgroup2 mount at the root hides it
        with mountinfo.open("a") as lines:
            lines.write(f"1057 1056 0:31 / {root} rw,relatime - tmpfs tmpfs rw,mode=755\n")
    if mountinfo_is == "a-fifo":
        os.mkfifo(mountinfo)
    said: list[tuple[Path, str]] = []
    found = discover(root, proc, on_bad=lambda path, why: said.append((path, why)), mountinfo=mountinfo)
    assert found.cgroup is not None and not found.cgroup.local_events, found.why
    assert found.why == f"cgroup v2 at {cgroup}"
    assert found.cgroup.oom_counts() == OomKills({cgroup: 1})  # read once, never summed with the one below
    assert said == ([(mountinfo, "is not a regular file")] if mountinfo_is == "a-fifo" else [])


def test_discover_nothing_there(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/\n")
    found = discover(root, proc)
    assert found.cgroup is None
    assert "no memory cgroup" in found.why and str(root) in found.why


def test_discover_files_not_readable(tmp_path: Path) -> None:
    root = write_files(tmp_path / "root", {"cgroup.controllers": "cpu\n"})  # no memory.events anywhere
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/a/b\n")
    found = discover(root, proc)
    assert found.cgroup is None
    assert "not readable" in found.why and str(root / "a" / "b") in found.why


def test_discover_proc_cgroup_unreadable(tmp_path: Path) -> None:
    found = discover(tmp_path, tmp_path / "no-such-proc-file")
    assert found.cgroup is None
    assert "cannot read" in found.why and "no-such-proc-file" in found.why


def test_mem_total(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684544 kB\nMemFree:        1 kB\n")
    assert mem_total(meminfo) == 24684544 * 1024
    assert mem_total(tmp_path / "missing") is None
    assert mem_total() is not None and mem_total() > 0  # type: ignore[operator]


# ================================================================ the v2 watch (inotify)


def readable(fd: int, timeout: float) -> bool:
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)


def test_v2_watch_fires_when_memory_events_changes(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path, oom_kill=0)
    found = discover(root, proc)
    assert found.cgroup is not None
    opened = found.cgroup.open_watch()
    assert opened is not None
    fd, how = opened
    try:
        assert how == "inotify"
        assert not readable(fd, 0.1), "readable before anything changed"
        (cgroup / "memory.events").write_text(v2_events(1))
        assert readable(fd, 5), "inotify fd not readable after memory.events was rewritten"
        MemoryCgroup.consume_watch(fd)
        assert not readable(fd, 0.1), "still readable after consume_watch"
        (cgroup / "memory.events").write_text(v2_events(2))
        assert readable(fd, 5)
    finally:
        os.close(fd)


def test_v2_watch_unavailable_without_memory_events(tmp_path: Path) -> None:
    cgroup = MemoryCgroup(tmp_path, "v2")
    assert cgroup.open_watch() is None


def drive(loop: EventLoop, until: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loop.run_once(max_wait=0.05)
        if callable(until) and until():
            return
    raise AssertionError(f"condition not met within {timeout}s")


def test_memory_evidence_shared_mode_logs_an_oom_kill_live(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path, oom_kill=0)
    lines: list[str] = []
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lines.append, mode="shared", root=root, proc_cgroup=proc)
    try:
        assert evidence.mode == "shared"
        assert evidence.shared is not None and evidence.shared.path == cgroup
        assert evidence.describe().startswith("memory evidence: shared mode, cgroup v2 at ")
        placement = evidence.place("p", memory_max=64 * MiB)  # shared mode: no cgroup of its own
        assert placement.scope == "shared" and placement.cgroup == evidence.shared
        assert placement.oom_baseline == OomKills({cgroup: 0})

        loop.run_once(max_wait=0.1)
        assert not any("OOM KILL" in line for line in lines), lines
        (cgroup / "memory.events").write_text(v2_events(1))
        drive(loop, lambda: any("OOM KILL" in line for line in lines))
        oom = next(line for line in lines if "OOM KILL" in line)
        assert oom.startswith(f"OOM KILL in cgroup {cgroup}: oom_kill 0 → 1; ")
        assert "usage=3.0MiB" in oom and "peak=5.0MiB" in oom and "limit=none" in oom
        # No limit of its own: the one that killed is above it (here the machine's), and the line names it.
        above = evidence.available_memory()
        assert above is not None and oom.endswith(f"; the limit reached: the machine's {fmt_bytes(above)}"), oom

        report = evidence.report(placement)
        assert report.oom_kills == 1 and report.scope == "shared" and report.peak == 5 * MiB
        assert sum("OOM KILL" in line for line in lines) == 1, "the same kill was logged twice"
    finally:
        evidence.close()
        loop.close()


def test_memory_evidence_polls_where_no_watch_can_be_registered(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root, proc, cgroup = fake_v2(tmp_path, oom_kill=4)
    monkeypatch.setattr(MemoryCgroup, "open_watch", lambda self: None)
    lines: list[str] = []
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lines.append, mode="shared", root=root, proc_cgroup=proc)
    try:
        (cgroup / "memory.events").write_text(v2_events(6))
        started = time.monotonic()
        drive(loop, lambda: any("OOM KILL" in line for line in lines))
        assert time.monotonic() - started >= OOM_POLL_S * 0.9  # found by the poll, not by a watch
        assert any("oom_kill 4 → 6" in line for line in lines), lines
    finally:
        evidence.close()
        loop.close()


def test_memory_evidence_polls_on_after_a_look_that_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug in one look (the loop contains and says it) must not end the polling for the rest of the run.
    root, proc, cgroup = fake_v2(tmp_path, oom_kill=4)
    monkeypatch.setattr(MemoryCgroup, "open_watch", lambda self: None)
    raised: list[str] = []
    real_check = MemoryEvidence._check_counter

    def check_raising_once(self: MemoryEvidence, *args: object, **kwargs: object) -> None:
        if not raised:
            raised.append("raised")
            raise RuntimeError("a bug in one look")
        real_check(self, *args, **kwargs)

    monkeypatch.setattr(MemoryEvidence, "_check_counter", check_raising_once)
    lines: list[str] = []
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lines.append, mode="shared", root=root, proc_cgroup=proc)
    try:
        drive(loop, lambda: bool(raised))
        (cgroup / "memory.events").write_text(v2_events(6))
        drive(loop, lambda: any("OOM KILL" in line for line in lines))
        assert any("oom_kill 4 → 6" in line for line in lines), lines
    finally:
        evidence.close()
        loop.close()


def test_memory_evidence_available_memory_is_the_tightest_limit_up_the_tree(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path, rel="/outer/inner", memory_max=str(512 * MiB))
    write_files(cgroup.parent, {"memory.max": f"{256 * MiB}\n", "cgroup.procs": ""})
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda line: None, mode="shared", root=root, proc_cgroup=proc)
    try:
        assert evidence.available_memory() == 256 * MiB
        assert "memory available 256.0MiB" in evidence.describe()
    finally:
        evidence.close()
        loop.close()


def test_memory_evidence_off_still_holds_the_preflight_to_the_containers_limit(tmp_path: Path) -> None:
    # cgroups = "off": no OOM evidence, but the limit is the container's all the same. It fell back to MemTotal:
    # a 300 MiB container passed a phase's min_memory of 1 GiB, and its children were told the machine's memory.
    root, proc, cgroup = fake_v2(tmp_path, rel="/outer/inner", memory_max=str(512 * MiB))
    write_files(cgroup.parent, {"memory.max": f"{300 * MiB}\n", "cgroup.procs": ""})
    loop = EventLoop()
    off = MemoryEvidence(loop, lambda line: None, mode="off", root=root, proc_cgroup=proc)
    try:
        assert off.mode == "unavailable" and off.shared is None and "turned off" in off.why
        assert off.available_memory() == 300 * MiB
        assert off.place("p", None).cgroup is None, "nothing is placed or watched"
    finally:
        off.close()
        loop.close()


def test_memory_evidence_off_and_unavailable(tmp_path: Path) -> None:
    loop = EventLoop()
    try:
        off = MemoryEvidence(loop, lambda line: None, mode="off", root=tmp_path, proc_cgroup=tmp_path / "x")
        assert off.mode == "unavailable" and off.shared is None
        assert "turned off" in off.why and "unknown" in off.why
        placement = off.place("p", None)
        assert placement.scope == "none" and placement.cgroup is None
        report = off.report(placement)
        assert report.oom_kills is None

        proc = tmp_path / "proc"
        proc.write_text("0::/\n")
        none = MemoryEvidence(loop, lambda line: None, mode="auto", root=tmp_path / "nothing", proc_cgroup=proc)
        assert none.mode == "unavailable"
        assert "never guessed" in none.why
        assert none.describe().startswith("memory evidence: no memory cgroup")
        assert none.available_memory() == mem_total()
    finally:
        loop.close()


# ================================================================ the real v1 cgroup of this machine


def test_real_discovery_finds_our_v1_cgroup() -> None:
    found = discover()
    if found.cgroup is None:
        pytest.skip(f"no memory cgroup on this machine: {found.why}")
    if found.cgroup.version != "v1":
        pytest.skip(f"this machine's memory cgroup is {found.cgroup.version}, not v1: {found.why}")
    own = own_v1_memory_cgroup()
    assert own is not None
    assert found.cgroup.path in (own, V1_MOUNT), found.why
    snap = found.cgroup.snapshot()
    assert snap.oom_kills is not None and snap.oom_kills >= 0
    assert snap.usage is not None and snap.usage > 0
    assert snap.peak is not None and snap.peak >= snap.usage
    assert snap.limit is None or snap.limit > 0


def test_real_v1_eventfd_fires_on_a_real_oom_kill(tmp_path: Path) -> None:
    base = v1_memory_cgroup_or_skip()
    script = alloc_script(tmp_path)
    with v1_cgroup("oomwatch", 32 * MiB) as path:
        cgroup = MemoryCgroup(path, "v1")
        assert cgroup.snapshot().limit == 32 * MiB
        assert cgroup.oom_kills() == 0
        opened = cgroup.open_watch()
        assert opened is not None, f"no eventfd could be registered on {path}"
        fd, how = opened
        try:
            assert how == "eventfd"
            assert not readable(fd, 0.1)
            proc = subprocess.run(in_cgroup_argv(path, [sys.executable, str(script)]), capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == -9, f"the allocator was not SIGKILLed: {proc.returncode} {proc.stdout}"
            assert readable(fd, 5), "eventfd not readable after an OOM kill in the cgroup"
            assert struct.unpack("Q", os.read(fd, 8))[0] >= 1  # (the eventfd counts the OOM events)
            assert cgroup.oom_kills() == 1
            assert cgroup.snapshot().peak is not None and cgroup.snapshot().peak >= 31 * MiB  # type: ignore[operator]
        finally:
            os.close(fd)
    assert not path.exists()
    assert base.is_dir()


def test_real_memory_evidence_per_phase_cgroup_is_made_and_removed() -> None:
    base = v1_memory_cgroup_or_skip()
    lines: list[str] = []
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lines.append, mode="auto")
    try:
        assert evidence.mode == "per-phase", evidence.why
        name = f"pytest-{os.getpid()}"
        placement = evidence.place(name, 48 * MiB)
        assert placement.scope == "phase" and placement.cgroup is not None
        assert placement.cgroup.path == base / phase_cgroup_name(name)  # per supervisor: never shared
        assert placement.cgroup.limit() == 48 * MiB
        assert placement.oom_baseline == OomKills({placement.cgroup.path: 0})
        evidence.release_phase(name)
        wait_for(lambda: not (base / phase_cgroup_name(name)).exists(), timeout=5)
    finally:
        evidence.close()
        loop.close()


def test_real_phase_cgroup_with_a_cgroup_a_child_made_below_it() -> None:
    """A child made a cgroup below its phase's and moved into it: it is still the phase's, swept with it (it
    escaped everything else), and the phase's cgroup is removed with the one below (rmdir refuses one that has
    a cgroup below it: it stayed, with the child in it)."""
    base = v1_memory_cgroup_or_skip()
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda _line: None, mode="auto")
    sleeper = None
    name = f"pytest-nested-{os.getpid()}"
    try:
        assert evidence.mode == "per-phase", evidence.why
        placement = evidence.place(name, 48 * MiB)
        assert placement.cgroup is not None
        inner = placement.cgroup.path / "inner"
        inner.mkdir()
        sleeper = subprocess.Popen(in_cgroup_argv(inner, ["sleep", "300"]))
        wait_for(lambda: (inner / "cgroup.procs").read_text().strip(), timeout=10)
        assert evidence.leftover_pids(name) == [sleeper.pid]
        sleeper.kill()
        sleeper.wait(10)
        assert evidence.leftover_pids(name) == []
        evidence.release_phase(name)
        assert not placement.cgroup.path.exists(), f"left: {list(placement.cgroup.path.iterdir())}"
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(10)
        evidence.close()
        loop.close()
        remove_cgroup(base / phase_cgroup_name(name))


def test_a_cgroup_holding_a_process_below_it_is_not_taken_apart() -> None:
    """Removing a cgroup removes the empty ones below it only when no process is anywhere in it: a cgroup
    beside ours (another supervisor's) may hold one, and the empty cgroups below it are not ours to remove."""
    base = v1_memory_cgroup_or_skip()
    sleeper = None
    with v1_cgroup("apart", 64 * MiB) as cg:
        try:
            (cg / "empty").mkdir()
            (cg / "busy").mkdir()
            sleeper = subprocess.Popen(in_cgroup_argv(cg / "busy", ["sleep", "300"]))
            wait_for(lambda: (cg / "busy" / "cgroup.procs").read_text().strip(), timeout=10)
            assert MemoryCgroup(cg, "v1").remove() is False
            assert (cg / "empty").is_dir() and (cg / "busy").is_dir()
            sleeper.kill()
            sleeper.wait(10)
            assert MemoryCgroup(cg, "v1").remove() is True and not cg.exists()
        finally:
            if sleeper is not None and sleeper.poll() is None:
                sleeper.kill()
                sleeper.wait(10)
    assert base.is_dir()


def test_v2_delegation_moves_the_supervisor_into_a_leaf_and_enables_memory_below(tmp_path: Path) -> None:
    """v2's "no internal processes" rule: per-phase cgroups need the supervisor in a leaf of its own first."""
    root, proc, cgroup = fake_v2(tmp_path)
    (cgroup / "cgroup.subtree_control").write_text("")
    loop = EventLoop()
    lines: list[str] = []
    try:
        evidence = MemoryEvidence(loop, lines.append, "auto", root, proc)
        assert evidence.mode == "per-phase", evidence.why
        leaf = cgroup / "supervisor"
        assert evidence.shared is not None and evidence.shared.path == leaf
        assert (leaf / "cgroup.procs").read_text() == str(os.getpid())
        assert (cgroup / "cgroup.subtree_control").read_text() == "+memory"
        placement = evidence.place("bench", 64 * MiB)
        assert placement.scope == "phase" and placement.cgroup is not None
        assert placement.cgroup.path.parent == cgroup  # a sibling of the leaf, under the delegated cgroup
        assert (placement.cgroup.path / "memory.max").read_text() == str(64 * MiB)
        # (Removing it is tested on the real v1 cgroupfs: a plain directory holding files cannot be rmdir'ed.)
    finally:
        evidence.close()
        loop.close()


def test_v2_status_shows_the_containers_memory_not_the_supervisors_leaf(tmp_path: Path) -> None:
    """Once delegated, the supervisor's leaf holds the supervisor alone, its phases' cgroups are the leaf's
    siblings: status and /metrics read the leaf and showed 30 MiB, no limit, of a 1 GiB container holding 900 MiB.
    They show the cgroup that holds it all (the leaf's parent), with the least limit over it (one above it too)."""
    from supervisor.status import snapshot
    from supervisor.status.health import metrics_text
    from supervisor.status.model import Snapshot

    root, proc, cgroup = fake_v2(tmp_path, rel="/pod/box", memory_max=str(GiB), oom_kill=0)
    write_files(cgroup, {"memory.current": f"{900 * MiB}\n", "memory.peak": f"{950 * MiB}\n",
                         "cgroup.subtree_control": ""})
    write_files(cgroup.parent, {"memory.max": f"{768 * MiB}\n", "cgroup.procs": ""})
    write_files(cgroup / "supervisor", {"memory.current": f"{30 * MiB}\n", "memory.peak": f"{31 * MiB}\n",
                                        "memory.max": "max\n", "memory.events": v2_events(0)})  # (the leaf's files)
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda _line: None, "auto", root, proc)
    try:
        assert evidence.mode == "per-phase" and evidence.shared is not None, evidence.why
        assert evidence.shared.path == cgroup / "supervisor"
        memory = snapshot._memory(evidence)
        assert (memory.usage, memory.peak, memory.limit) == (900 * MiB, 950 * MiB, 768 * MiB), memory
        assert memory.snapshot == "usage=900.0MiB peak=950.0MiB limit=768.0MiB oom_kills=0", memory
        text = metrics_text(Snapshot.from_json({"phases": [], "verdicts": [], "memory": memory.to_json()}))
        assert f"prover_supervisor_memory_usage {900 * MiB}\n" in text and \
            f"prover_supervisor_memory_limit {768 * MiB}\n" in text, text
    finally:
        evidence.close()
        loop.close()


def assert_shares_the_cgroup_it_was_put_in(evidence: MemoryEvidence, cgroup: Path) -> None:
    """No per-phase cgroups: the supervisor's own cgroup is the one counter, and the start's line says why."""
    assert evidence.mode == "shared", evidence.why
    assert "per-phase cgroups not possible here" in evidence.why
    assert evidence.shared is not None and evidence.shared.path == cgroup


def test_v2_with_other_processes_in_its_cgroup_it_moves_nothing_and_says_who(tmp_path: Path) -> None:
    """Started from Vast's onstart, the supervisor shares the container's cgroup with sshd and the rest: v2 enables
    no controller below a cgroup that holds processes, and those are not the supervisor's to move. It stays where
    it is (no leaf made), shares one counter, and says who is in the way (seen on a real v2 host: EBUSY)."""
    root, proc, cgroup = fake_v2(tmp_path)
    (cgroup / "cgroup.subtree_control").write_text("")
    (cgroup / "cgroup.procs").write_text(f"4242\n{os.getpid()}\n4243\n")
    loop = EventLoop()
    try:
        evidence = MemoryEvidence(loop, lambda _line: None, "auto", root, proc)
        assert_shares_the_cgroup_it_was_put_in(evidence, cgroup)
        assert "2 other process(es) in this cgroup (pid 4242, 4243)" in evidence.why, evidence.why
        assert not (cgroup / "supervisor").exists()
        assert (cgroup / "cgroup.procs").read_text() == f"4242\n{os.getpid()}\n4243\n"
        assert (cgroup / "cgroup.subtree_control").read_text() == ""
    finally:
        evidence.close()
        loop.close()


def test_v2_when_memory_cannot_be_enabled_below_it_goes_back_where_it_was(tmp_path: Path) -> None:
    """Moved into its leaf, the supervisor finds +memory refused (a process came in since its look, or the
    controller is not delegated): it moves itself back, and shares the counter of the cgroup it was put in."""
    root, proc, cgroup = fake_v2(tmp_path)
    (cgroup / "cgroup.procs").write_text("")
    (cgroup / "cgroup.subtree_control").mkdir()  # (a write to it fails, as the kernel's EBUSY would)
    loop = EventLoop()
    try:
        evidence = MemoryEvidence(loop, lambda _line: None, "auto", root, proc)
        assert_shares_the_cgroup_it_was_put_in(evidence, cgroup)
        assert (cgroup / "supervisor" / "cgroup.procs").read_text() == str(os.getpid())  # it was in the leaf,
        assert (cgroup / "cgroup.procs").read_text() == str(os.getpid())  # and is back
    finally:
        evidence.close()
        loop.close()


def test_v2_a_later_attempts_peak_is_never_an_earlier_ones(tmp_path: Path) -> None:
    """v2's memory.peak takes no reset before Linux 6.12 (and after, only as read through the file that wrote it):
    a new attempt has its phase cgroup made anew. Where it cannot be (a process left in it; here the fake's files,
    which rmdir refuses as the kernel refuses a cgroup holding a process), the earlier attempt's peak is left
    out of the new attempt's verdict and status, never shown as its own."""
    root, proc, cgroup = fake_v2(tmp_path)
    (cgroup / "cgroup.subtree_control").write_text("")
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda _line: None, "auto", root, proc)
    try:
        assert evidence.mode == "per-phase", evidence.why
        first = evidence.place("bench", 64 * MiB)
        assert first.cgroup is not None
        phase_cgroup = first.cgroup.path
        write_files(phase_cgroup, {"memory.peak": f"{60 * MiB}\n", "memory.current": f"{50 * MiB}\n",
                                   "memory.events": v2_events(0)})
        assert evidence.report(first).peak == 60 * MiB
        assert evidence.phase_snapshot("bench").peak == 60 * MiB  # type: ignore[union-attr]

        evidence.new_attempt("bench")  # the second attempt
        second = evidence.place("bench", 64 * MiB)
        assert second.cgroup is not None and second.cgroup.path == phase_cgroup  # (not made anew: see above)
        report = evidence.report(second)
        assert report.peak is None, f"the first attempt's peak shown as the second's: {report}"
        snap = evidence.phase_snapshot("bench")
        assert snap is not None and snap.peak is None and snap.usage == 50 * MiB, snap  # (the rest still read)
    finally:
        evidence.close()
        loop.close()


@pytest.mark.parametrize("local_events", [True, False], ids=["memory_localevents", "hierarchical"])
def test_v2_a_kill_in_a_cgroup_a_child_made_below_its_phase_cgroup_is_its_oom_kill(tmp_path: Path,
                                                                                    local_events: bool) -> None:
    """A child's SIGKILL by the OOM killer in a cgroup it made below its phase cgroup is ``oom_killed``: under
    memory_localevents counted in the cgroup below (the phase's own ``memory.events`` stays at 0, and its watch
    never fires: logged at the reap), without it in the phase's own, counted once."""
    root, proc, cgroup = fake_v2(tmp_path)
    v2_events_both(cgroup, 2, 2)
    (cgroup / "cgroup.subtree_control").write_text("")
    phase_cgroup = v2_events_both(cgroup / phase_cgroup_name("bench"), 0, 0)  # (the fake's files, made first)
    options = "rw,nsdelegate,memory_localevents" if local_events else "rw,nsdelegate,memory_recursiveprot"
    loop = EventLoop()
    lines: list[str] = []
    evidence = MemoryEvidence(loop, lines.append, "auto", root, proc,
                              mountinfo=mountinfo_file(tmp_path, root, options))
    try:
        assert evidence.mode == "per-phase", evidence.why
        assert ("(memory_localevents: OOM kills counted over each cgroup below)" in evidence.describe()) is local_events
        placement = evidence.place("bench", None)
        assert placement.cgroup is not None and placement.cgroup.path == phase_cgroup
        assert placement.oom_baseline == OomKills({phase_cgroup: 0})

        inner = v2_events_both(phase_cgroup / "inner", 1, 1)  # the child's cgroup below, where the victim was
        v2_events_both(phase_cgroup, 0 if local_events else 1, 0)  # (under the option the phase's stays at 0)
        report = evidence.report(placement)
        assert report.oom_kills == 1 and report.snapshot is not None, report
        # Under the option each cgroup's own counter; without it the phase's one, never summed with the one below.
        assert report.snapshot.oom == OomKills({phase_cgroup: 0, inner: 1} if local_events else {phase_cgroup: 1})
        verdict = from_exit("bench", "bench", 4242, ExitStatus(None, signal.SIGKILL), stop_reason=None,
                            daemon=False, attempt=1, started_at=0.0, last_lines=[], memory=report)
        assert verdict.reason == OOM_KILLED, verdict.line()
        above = fmt_bytes(evidence.available_memory())  # (no limit of its own: the one above it is named)
        assert [line for line in lines if "OOM KILL" in line] == [
            f"OOM KILL in cgroup {phase_cgroup}: oom_kill 0 → 1; {report.snapshot.describe()}; the limit reached: "
            f"the machine's {above}"]
    finally:
        evidence.close()
        loop.close()


ALLOC_96_MIB = "import sys; b = b'x' * (96 << 20); sys.exit(1)"


def test_real_v1_a_new_attempt_has_its_phase_cgroup_made_anew() -> None:
    """Its counters start at 0 (v1 and v2 alike); with a process left in it, v1's watermark is reset instead."""
    base = v1_memory_cgroup_or_skip()
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda _line: None, mode="auto")
    name = f"pytest-attempts-{os.getpid()}"
    sleeper = None
    try:
        assert evidence.mode == "per-phase", evidence.why
        first = evidence.place(name, 128 * MiB)
        assert first.cgroup is not None
        phase_cgroup = first.cgroup.path
        subprocess.run(in_cgroup_argv(phase_cgroup, [sys.executable, "-c", ALLOC_96_MIB]), timeout=60)
        assert evidence.report(first).peak >= 96 * MiB  # type: ignore[operator]

        evidence.new_attempt(name)
        assert not phase_cgroup.exists(), "the phase cgroup was kept for the next attempt"
        second = evidence.place(name, 128 * MiB)
        assert second.cgroup is not None and second.cgroup.path == phase_cgroup
        assert second.cgroup.limit() == 128 * MiB  # its limit written again
        assert evidence.report(second).peak < 32 * MiB  # type: ignore[operator]

        subprocess.run(in_cgroup_argv(phase_cgroup, [sys.executable, "-c", ALLOC_96_MIB]), timeout=60)
        sleeper = subprocess.Popen(in_cgroup_argv(phase_cgroup, ["sleep", "300"]))
        wait_for(lambda: str(sleeper.pid) in (phase_cgroup / "cgroup.procs").read_text().split(), timeout=10)
        evidence.new_attempt(name)  # a process left: it stays, its watermark reset
        third = evidence.place(name, 128 * MiB)
        assert third.cgroup is not None and third.cgroup.path == phase_cgroup
        assert evidence.report(third).peak < 32 * MiB  # type: ignore[operator]
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait(10)
        evidence.close()
        loop.close()
        remove_cgroup(base / phase_cgroup_name(name))


@pytest.mark.parametrize("mode", ["auto", "shared", "off"])
def test_a_dead_predecessors_ledger_is_taken_over_whatever_this_starts_mode(tmp_path: Path, mode: str) -> None:
    """The ledger was read only where this start made per-phase cgroups: with cgroups = "shared" or "off", or
    where they turned out impossible (auto, here: another process in its v2 cgroup), the phase cgroups a SIGKILLed
    predecessor made were never emptied. Only those the ledger names, right below this cgroup, are taken."""
    root, proc, cgroup = fake_v2(tmp_path)
    (cgroup / "cgroup.procs").write_text(f"4242\n{os.getpid()}\n")
    stale = write_files(cgroup / "prover-77-work", {"cgroup.procs": "4343\n"})
    elsewhere = write_files(tmp_path / "prover-78-work", {"cgroup.procs": "4444\n"})
    ledger = tmp_path / "ledger"
    ledger.write_text(f"{stale}\n{elsewhere}\n{cgroup / 'prover-79-gone'}\n")
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda _line: None, mode, root, proc, ledger=ledger)
    try:
        assert evidence.mode == ("unavailable" if mode == "off" else "shared"), evidence.why
        assert [(owner, cg.path) for owner, cg in evidence.leftover_cgroups()] == [(77, stale)]
        assert ledger.read_text() == f"{stale}\n"
    finally:
        evidence.close()
        loop.close()


def test_v2_without_delegation_falls_back_to_the_shared_counter(tmp_path: Path) -> None:
    root, proc, cgroup = fake_v2(tmp_path)
    cgroup.chmod(0o555)  # not delegated: no child cgroup can be made (root ignores modes: use a file instead)
    (cgroup / "supervisor").write_text("not a directory")
    loop = EventLoop()
    try:
        evidence = MemoryEvidence(loop, lambda _line: None, "auto", root, proc)
        assert_shares_the_cgroup_it_was_put_in(evidence, cgroup)
    finally:
        cgroup.chmod(0o755)
        evidence.close()
        loop.close()


# ================================================================ escapees of a SIGKILLed supervisor

# The phase's command: a grandchild leaves the session (double fork + setsid) and clears its environment
# (env -i), so neither the process tree, the process group nor the supervisor's tag finds it; only the
# phase cgroup it was born in still holds it.
ESCAPE_CODE = textwrap.dedent("""\
    import os, sys, time
    pidfile = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if sys.argv[2:] == ["deeper"]:  # into a cgroup of its own, made below its phase cgroup
                rel = next(line.split(":", 2)[2] for line in open("/proc/self/cgroup")
                           if "memory" in line.split(":", 2)[1].split(","))
                inner = "/sys/fs/cgroup/memory" + rel.strip() + "/inner"
                os.mkdir(inner)
                with open(inner + "/cgroup.procs", "w") as procs:
                    procs.write(str(os.getpid()))
            script = f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 300"
            os.execvp("env", ["env", "-i", "/bin/sh", "-c", script])
        os._exit(0)
    os.wait()
    print("escapee started", flush=True)
    time.sleep(300)
    """)


def _kill_quietly(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


@pytest.mark.parametrize(("where", "next_mode"), [("in-its-phase-cgroup", "auto"), ("below-it", "auto"),
                                                  ("in-its-phase-cgroup", "shared"), ("in-its-phase-cgroup", "off")])
def test_escapee_of_a_sigkilled_supervisor_dies_with_its_cgroup_at_the_next_start(sup: Runner, where: str,
                                                                                   next_mode: str) -> None:
    # below-it: the escapee made a cgroup below its phase cgroup and moved into it (the phase's, as the run's own
    # sweep knows): the next start read the phase cgroup's own cgroup.procs alone, left it alive and said nothing.
    # shared, off: a next start that makes no phase cgroup of its own read the ledger not at all, and the
    # escapee lived on for good, though the ledger still named the cgroup that held it.
    import signal

    v1_memory_cgroup_or_skip()
    pidfile = sup.tmp / "escapee.pid"
    escape = sup.tmp / "escape.py"
    escape.write_text(ESCAPE_CODE)
    first_cfg = sup.write(f"""
[[phases]]
name = "work"
kind = "service"
command = {toml_list([sys.executable, str(escape), str(pidfile), *(["deeper"] if where == "below-it" else [])])}
""", name="first.toml")
    second_cfg = sup.write(sup.header(extra=f'cgroups = "{next_mode}"') + f"""
[[phases]]
name = "next"
command = {toml_list(["true"])}
""", name="second.toml", header=False)
    escapee = None
    with v1_cgroup("escapee", 256 * MiB) as cg:
        try:
            first = start_in_cgroup(sup, first_cfg, cg)
            wait_for(pidfile.exists, timeout=20)
            escapee = int(pidfile.read_text())
            stale = cg / phase_cgroup_name("work", first.pid)
            home = stale / "inner" if where == "below-it" else stale
            assert str(escapee) in (home / "cgroup.procs").read_text().split()
            environ = Path(f"/proc/{escapee}/environ").read_bytes()
            assert TAG_ENV.encode() not in environ and STATE_DIR_ENV.encode() not in environ
            os.kill(first.pid, signal.SIGKILL)
            first.communicate(timeout=10)
            assert pid_alive(escapee) and stale.is_dir()

            result = run_in_cgroup(sup, second_cfg, cg, timeout=60)
            out = result.output
            assert result.returncode == 0, out
            wait_for(lambda: not pid_alive(escapee), timeout=5)
            said = first_line(out, f"by supervisor pid {first.pid}, which died")
            assert f"{escapee} (sleep)" in said and str(stale) in said, said
            assert not stale.exists(), f"the dead supervisor's phase cgroup was left: {list(cg.iterdir())}"
            assert "Traceback" not in out
        finally:
            _kill_quietly(escapee)


def test_a_look_alike_cgroup_of_another_supervisor_is_left_alone(sup: Runner) -> None:
    """Only the cgroups this state_dir's supervisors made are emptied at start: one beside them with the same
    kind of name (another supervisor's, maybe in another PID namespace, where its pid means nothing here)
    keeps its processes, even when its pid is dead here or is the new supervisor's own."""
    import signal

    v1_memory_cgroup_or_skip()
    cfg = sup.write(f"""
[[phases]]
name = "next"
command = {toml_list(["true"])}
""")
    with v1_cgroup("lookalike", 256 * MiB) as cg:
        others = [cg / "prover-999999999-bench", cg / "prover-1-curio"]  # a dead pid here; PID 1 of a namespace
        sleepers = []
        try:
            for other in others:
                other.mkdir()
                sleeper = subprocess.Popen(in_cgroup_argv(other, ["sleep", "300"]), start_new_session=True)
                sleepers.append(sleeper)
                wait_for(lambda other=other: (other / "cgroup.procs").read_text().strip(), timeout=10)
            result = run_in_cgroup(sup, cfg, cg, timeout=60)
            assert result.returncode == 0, result.output
            assert all(pid_alive(s.pid) for s in sleepers), result.output
            assert all(o.is_dir() for o in others)
            assert "which died" not in result.output, result.output
        finally:
            for sleeper in sleepers:
                with contextlib.suppress(OSError):
                    os.kill(sleeper.pid, signal.SIGKILL)
                sleeper.wait(10)


def test_an_ancestors_limit_is_read_alone_not_with_the_cgroups_below_it(tmp_path: Path) -> None:
    # The machine's memory figure reads the limit of every cgroup up the tree; read through a snapshot, each
    # ancestor's OOM counters walked the cgroups below it, and a host's root with over SUBTREE_MAX of them
    # (a busy Docker host) was said at every start to be unreadable from here on.
    from supervisor.evidence.cgroups import SUBTREE_MAX

    root, _, cgroup = fake_v1(tmp_path, limit=2 * GiB)
    for n in range(SUBTREE_MAX + 4):
        write_files(root / "memory" / "docker" / f"other{n}", {"memory.oom_control": v1_oom_control(0)})
    bad: list[tuple[str, str]] = []
    ancestor = MemoryCgroup(root / "memory" / "docker", "v1", lambda name, why: bad.append((name, str(why))))
    (root / "memory" / "docker" / "memory.limit_in_bytes").write_text(f"{V1_NO_LIMIT}\n")
    assert ancestor.limit() is None and bad == []
    assert MemoryCgroup(cgroup, "v1", lambda name, why: bad.append((name, str(why)))).limit() == 2 * GiB
    assert bad == []


@needs_unshare
def test_two_supervisors_as_pid_1_in_one_cgroup_never_share_a_phase_cgroup(tmp_path: Path) -> None:
    """Each is pid 1 of its own PID namespace, both in one memory cgroup (unshare on a host): phase cgroups named
    by the pid alone were one, the second one's memory_max set on the first one's service, their OOM kills counted
    together. (Its sweep could not kill the other's service: cgroup.procs lists only the pids of the reader's
    namespace.)"""
    first, second = Runner(tmp_path / "a"), Runner(tmp_path / "b")
    for runner in (first, second):
        runner.tmp.mkdir()
    serving = second.write("""
        [[phases]]
        name = "work"
        kind = "service"
        command = ["sleep", "300"]
        memory_max = "100MiB"
        """)
    done = first.write("""
        [[phases]]
        name = "work"
        command = ["true"]
        memory_max = "200MiB"
        """)

    def start_as_pid_1(runner: Runner, config: Path, cgroup: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(in_cgroup_argv(cgroup, runner.argv(config, pid1=True)), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True)
        runner.procs.append(proc)
        return proc

    with v1_cgroup("two-pid1", 256 * MiB) as cg:
        try:
            server = start_as_pid_1(second, serving, cg)
            output = until(server, "phase work: service is up")
            [served] = [path for path in cg.iterdir() if path.is_dir()]  # (its phase cgroup, its limit set)
            assert int((served / "memory.limit_in_bytes").read_text()) == 100 * MiB
            result = finish(start_as_pid_1(first, done, cg), time.monotonic(), 60)
            assert result.returncode == 0, result.output
            assert int((served / "memory.limit_in_bytes").read_text()) == 100 * MiB, "the other's limit set on it"
            time.sleep(0.5)  # (a kill by the first one's sweep is heard by the second within this)
            assert server.poll() is None, output + (server.communicate()[0] or "")
            os.kill(supervisor_pid(server, True), signal.SIGTERM)
            rest, _ = server.communicate(timeout=30)
            output += rest
            assert server.returncode == 143, output
            [ended] = [line for line in output.splitlines() if "] ended: phase=work child=work" in line]
            assert " reason=stopped " in ended, output
            assert "FAILED" not in output, output
        finally:
            first.cleanup()
            second.cleanup()


def test_a_pid_namespace_that_cannot_be_read_is_one_unknown_namespace_for_tags_and_cgroup_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc/self/ns/pid cannot be read, the tags and the phase cgroups' names say one namespace, and never
    the host's: the cgroups said the host's (INIT_PID_NAMESPACE), the tags an unknown one (0)."""
    real_stat = os.stat

    def stat(path: str | os.PathLike[str], *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("/ns/pid"):
            raise PermissionError(13, "not readable", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    own_pid_namespace.cache_clear()
    try:
        with monkeypatch.context() as patched:
            patched.setattr(os, "stat", stat)
            tagged = int(tag_for(3).split(".")[1])
            named = phase_cgroup_owner(phase_cgroup_name("bench", 12))
    finally:
        own_pid_namespace.cache_clear()  # (the next reader reads the real one)
    assert named == (12, tagged) and tagged != INIT_PID_NAMESPACE, (named, tagged)


def test_a_phase_cgroups_name_says_its_owner_and_its_pid_namespace() -> None:
    assert phase_cgroup_owner("prover-12-bench") == (12, INIT_PID_NAMESPACE)  # (the host's: no namespace said)
    assert phase_cgroup_owner("prover-1.4026532001-fetch-params") == (1, 4026532001)
    for name in ("prover-x-bench", "prover-1.-bench", "prover-1.ns-bench", "prover--bench", "other-1-bench"):
        assert not is_phase_cgroup(name), name
    assert is_phase_cgroup("prover-1.4026532001-work") and is_phase_cgroup("prover-7-work")


def test_v1_a_limit_above_the_mount_is_read_from_memory_stat(tmp_path: Path) -> None:
    """v1's memory.stat sums up the limits of every cgroup above, those the mount hides from a container too (a
    limited slice its runtime put it under): the least of them counts, where it is less than those seen."""
    root, proc, cgroup = fake_v1(tmp_path, limit=2 * GiB)
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lambda line: None, mode="shared", root=root, proc_cgroup=proc)
    try:
        assert evidence.available_memory() == 2 * GiB  # (no memory.stat: the limits seen)
        (cgroup / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {300 * MiB}\n")
        assert evidence.available_memory() == 300 * MiB
        where = evidence.tightest_limit()[1]  # (what is under it is read at the top cgroup seen)
        assert where is not None and where.path == cgroup
        (cgroup / "memory.stat").write_text(f"hierarchical_memory_limit {V1_NO_LIMIT}\n")
        assert evidence.available_memory() == 2 * GiB
    finally:
        evidence.close()
        loop.close()


def test_an_oom_line_names_the_limit_whose_count_rose_not_the_smallest(tmp_path: Path) -> None:
    """The kill comes at the first limit full, not at the smallest: a cgroup at 80% of its own 300 MiB is killed by
    a 512 MiB one above that others fill. Which one was reached is the one whose count rose since the last look
    (v2 memory.events.local ``oom``, v1 memory.failcnt); v1's limit above the mount has none: named where no other
    rose."""
    root, proc, cgroup = fake_v2(tmp_path, rel="/outer/inner", memory_max=str(300 * MiB), oom_kill=0)
    write_files(cgroup.parent, {"memory.max": f"{512 * MiB}\n", "cgroup.procs": ""})
    v2_events_both(cgroup.parent, 0, 0)
    v2_events_both(cgroup, 0, 0)
    lines: list[str] = []
    loop = EventLoop()
    evidence = MemoryEvidence(loop, lines.append, mode="shared", root=root, proc_cgroup=proc)
    try:
        placement = evidence.place("p", None)
        for n, (outer, inner) in enumerate([(1, 0), (1, 1), (1, 1)], start=1):  # (each: its ooms since the start)
            (cgroup.parent / "memory.events.local").write_text(v2_events(outer))  # (v2_events: oom is 1 more)
            (cgroup / "memory.events.local").write_text(v2_events(inner))
            (cgroup / "memory.events").write_text(v2_events(n))
            evidence.report(placement)
        said = [line.partition("oom_kills=")[2] for line in lines if "OOM KILL" in line]
        assert said == [f"1; the limit reached: 512.0MiB of {cgroup.parent}", "2; the limit reached: its own 300.0MiB",
                        "3; no limit seen over it was reached (one above the cgroup mount, unseen from here?)"], lines
    finally:
        evidence.close()

    root, proc, cgroup = fake_v1(tmp_path / "v1", limit=2 * GiB, oom_kill=0)
    (cgroup / "memory.stat").write_text(f"hierarchical_memory_limit {300 * MiB}\n")
    lines.clear()
    evidence = MemoryEvidence(loop, lines.append, mode="shared", root=root, proc_cgroup=proc)
    try:
        placement = evidence.place("p", None)
        (cgroup / "memory.oom_control").write_text(v1_oom_control(1))
        evidence.report(placement)
        (cgroup / "memory.failcnt").write_text("5\n")
        (cgroup / "memory.oom_control").write_text(v1_oom_control(2))
        evidence.report(placement)
        said = [line.partition("oom_kills=")[2] for line in lines if "OOM KILL" in line]
        assert said == ["1; the limit reached: 300.0MiB, set above the cgroup mount",
                        "2; the limit reached: its own 2.0GiB"], lines
    finally:
        evidence.close()
        loop.close()
