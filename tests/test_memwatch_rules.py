"""evidence.memwatch in-process: MemoryWatch.check over phases of the test's own, reading real files in a temp
dir (a v1 or v2 cgroup directory laid out as the kernel does, a /proc/meminfo copy): which figure is used (the
working set, less inactive file cache), which limit (the cgroup's, else the tightest above, else the machine's),
where PSI comes from, memory_high said once per crossing per phase with its push to the manager and its
MemoryWarning kept, and the phases that are not watched (memory_warn 0, no live children, nothing readable).
The crossing rule itself and PSI parsing are in tests/test_memory_warn.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from supervisor.engine.logs import Unshipped
from supervisor.evidence import memwatch
from supervisor.evidence.cgroups import MemoryCgroup, mem_total, mem_used
from supervisor.evidence.memory import Limit, MemoryWarning
from supervisor.evidence.memwatch import MemoryUse, MemoryWatch, memory_high_line

MIB = 1 << 20
PSI = "some avg10=2.50 avg60=1.00 avg300=0.10 total=99\nfull avg10=0.75 avg60=0.10 avg300=0.00 total=9\n"


@dataclass
class Evidence:
    """What MemoryWatch reads of memory.MemoryEvidence: the cgroup a phase counts in, the limits over it (its own,
    then ``available``: one above it, the container's or the machine's) and what is under the one above."""

    cgroups: dict[str, tuple[MemoryCgroup, str]] = field(default_factory=dict)
    available: int | None = None
    used_above: int | None = None  # what is used under ``available`` (None: unread)
    warned: dict[str, MemoryWarning] = field(default_factory=dict)

    def cgroup_of(self, phase: str) -> tuple[MemoryCgroup | None, str]:
        return self.cgroups.get(phase, (None, ""))

    def limits_over(self, cgroup: MemoryCgroup | None = None, meminfo: Path | str = "/proc/meminfo") -> list[Limit]:
        own = cgroup.limit() if cgroup is not None else None
        limits = ([Limit(own, cgroup)] if own else []) + ([Limit(self.available, CONTAINER)] if self.available else [])
        total = mem_total(meminfo)  # (the machine's, as memory.py's: where no cgroup limit is below it)
        return limits or ([Limit(total, None)] if total else [])

    def used_under(self, where: MemoryCgroup | None, meminfo: Path | str = "/proc/meminfo") -> int | None:
        return mem_used(meminfo) if where is None else self.used_above


# The cgroup above a phase's that holds ``Evidence.available`` (never read: ``used_above`` is what is under it).
CONTAINER = MemoryCgroup(Path("/container"), "v1")


class Phase:
    def __init__(self, name: str, warn: float = 0.9, live: bool = True) -> None:
        self.name, self.spec, self.live = name, SimpleNamespace(memory_warn=warn), live
        self.attempt = 1

    def live_children(self) -> list[object]:
        return [object()] if self.live else []


def v2(tmp: Path, name: str, current: int, limit: str, inactive: int = 0, pressure: str | None = None) -> MemoryCgroup:
    d = tmp / name
    d.mkdir()
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.max").write_text(f"{limit}\n")
    (d / "memory.stat").write_text(f"anon {current}\nactive_file 0\ninactive_file {inactive}\n")
    if pressure is not None:
        (d / "memory.pressure").write_text(pressure)
    return MemoryCgroup(d, "v2")


def v1(tmp: Path, name: str, usage: int, limit: int, inactive: int = 0) -> MemoryCgroup:
    d = tmp / name
    d.mkdir()
    (d / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (d / "memory.stat").write_text(f"cache 0\ntotal_inactive_file {inactive}\n")
    return MemoryCgroup(d, "v1")


def meminfo(tmp: Path, total_kib: int, available_kib: int) -> Path:
    path = tmp / "meminfo"
    path.write_text(f"MemTotal:       {total_kib} kB\nMemFree:        1 kB\nMemAvailable:   {available_kib} kB\n")
    return path


@pytest.fixture
def no_machine_psi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine's PSI file, the test's own (absent until written)."""
    path = tmp_path / "pressure-memory"
    monkeypatch.setattr(memwatch, "MACHINE_PRESSURE", path)
    return path


def test_the_working_set_leaves_out_inactive_file_cache(tmp_path: Path, no_machine_psi: Path) -> None:
    cgroup = v2(tmp_path, "fetch", current=900 * MIB, limit=str(1000 * MIB), inactive=400 * MIB)
    watch = MemoryWatch(lambda: [], Evidence({"fetch": (cgroup, "its cgroup")}))  # type: ignore[arg-type]
    assert watch.use_of("fetch") == MemoryUse(500 * MIB, 1000 * MIB, "its cgroup", None)


def test_the_limit_is_the_tightest_of_the_phase_and_the_container(tmp_path: Path, no_machine_psi: Path) -> None:
    # A phase's memory_max of 1 GiB in a container of 200 MiB: the kill came at 200 MiB with no memory_high, the
    # fraction taken against the 1 GiB the phase never reaches.
    cgroup = v1(tmp_path, "bench", usage=180 * MIB, limit=1024 * MIB)
    watch = MemoryWatch(lambda: [], Evidence({"bench": (cgroup, "its cgroup")}, available=200 * MIB))  # type: ignore[arg-type]
    use = watch.use_of("bench")
    assert use == MemoryUse(180 * MIB, 200 * MIB, "the limit above its cgroup (200.0MiB < its own 1.0GiB)", None)
    assert use.fraction == 0.9
    looser = MemoryWatch(lambda: [], Evidence({"bench": (cgroup, "its cgroup")}, available=4096 * MIB))  # type: ignore[arg-type]
    assert looser.use_of("bench") == MemoryUse(180 * MIB, 1024 * MIB, "its cgroup", None)



def test_a_limit_above_is_judged_by_all_that_is_under_it(tmp_path: Path, no_machine_psi: Path) -> None:
    """A phase without memory_max in a 300 MiB container that another process fills with 140 MiB: the kill came
    at 100% of the container with no memory_high, the phase's own 135 MiB read 45%."""
    cgroup = v1(tmp_path, "bench", usage=135 * MIB, limit=0x7FFFFFFFFFFFF000)
    full = Evidence({"bench": (cgroup, "its cgroup")}, available=300 * MIB, used_above=290 * MIB)
    use = MemoryWatch(lambda: [], full).use_of("bench")  # type: ignore[arg-type]
    where = "the limit above its cgroup (300.0MiB; it has none of its own), all that is under it counted"
    assert use == MemoryUse(290 * MIB, 300 * MIB, where, None)
    phase = Phase("bench")
    said = MemoryWatch(lambda: [phase], full).check()  # type: ignore[arg-type]
    assert len(said) == 1 and "uses 97% of its memory limit (290.0MiB of 300.0MiB" in said[0], said
    # Its own limit is the fuller: its own usage is the measure (what is above is not that limit's).
    own = v1(tmp_path, "fetch", usage=95 * MIB, limit=100 * MIB)
    roomier = Evidence({"fetch": (own, "its cgroup")}, available=300 * MIB, used_above=200 * MIB)
    assert MemoryWatch(lambda: [], roomier).use_of("fetch") == MemoryUse(  # type: ignore[arg-type]
        95 * MIB, 100 * MIB, "its cgroup", None)


def test_the_limit_nearest_to_being_reached_is_judged_not_the_smallest(tmp_path: Path, no_machine_psi: Path) -> None:
    """A phase at 80% of its own 300 MiB in a 512 MiB container that another phase fills: the container's limit
    is the one reached first. Judged by the smaller limit, the climb to the kill had no memory_high at all."""
    cgroup = v1(tmp_path, "job", usage=240 * MIB, limit=300 * MIB)
    full = Evidence({"job": (cgroup, "its cgroup")}, available=512 * MIB, used_above=480 * MIB)
    use = MemoryWatch(lambda: [], full).use_of("job")  # type: ignore[arg-type]
    where = "the limit above its cgroup (512.0MiB; its own 300.0MiB is less full), all that is under it counted"
    assert use == MemoryUse(480 * MIB, 512 * MIB, where, None)
    said = MemoryWatch(lambda: [Phase("job")], full).check()  # type: ignore[arg-type]
    assert len(said) == 1 and "uses 94% of its memory limit (480.0MiB of 512.0MiB" in said[0], said


def test_a_v2_cgroup_says_its_own_pressure(tmp_path: Path, no_machine_psi: Path) -> None:
    no_machine_psi.write_text(PSI.replace("2.50", "9.99"))
    cgroup = v2(tmp_path, "fetch", 10, "100", pressure=PSI)
    use = MemoryWatch(lambda: [], Evidence({"fetch": (cgroup, "its cgroup")})).use_of("fetch")  # type: ignore[arg-type]
    assert use is not None and use.pressure == "some avg10=2.50% full avg10=0.75%"


def test_a_v1_cgroup_says_the_machines_pressure_as_such(tmp_path: Path, no_machine_psi: Path) -> None:
    no_machine_psi.write_text(PSI)
    cgroup = v1(tmp_path, "bench", usage=80 * MIB, limit=100 * MIB, inactive=10 * MIB)
    evidence = Evidence({"bench": (cgroup, "the supervisor's cgroup")})
    use = MemoryWatch(lambda: [], evidence).use_of("bench")  # type: ignore[arg-type]
    machine = "(machine) some avg10=2.50% full avg10=0.75%"
    assert use == MemoryUse(70 * MIB, 100 * MIB, "the supervisor's cgroup", machine)


def test_no_pressure_anywhere_is_none_not_an_empty_text(tmp_path: Path, no_machine_psi: Path) -> None:
    cgroup = v1(tmp_path, "bench", usage=1, limit=100)
    use = MemoryWatch(lambda: [], Evidence({"bench": (cgroup, "its cgroup")})).use_of("bench")  # type: ignore[arg-type]
    assert use is not None and use.pressure is None


def test_an_unlimited_cgroup_is_held_to_the_limit_above_it(tmp_path: Path, no_machine_psi: Path) -> None:
    """v2 "max", v1's huge number: the cgroup has no limit of its own; the tightest above (or MemTotal) counts, and
    is named as the one above (the profile's bench has no memory_max: the container's limit kills it, and the line
    named "its cgroup" for a limit that cgroup does not have)."""
    unlimited_v2 = v2(tmp_path, "a", 300 * MIB, "max")
    unlimited_v1 = v1(tmp_path, "b", 300 * MIB, 0x7FFFFFFFFFFFF000)
    evidence = Evidence({"a": (unlimited_v2, "its cgroup"), "b": (unlimited_v1, "its cgroup")}, available=400 * MIB)
    watch = MemoryWatch(lambda: [], evidence)  # type: ignore[arg-type]
    above = "the limit above its cgroup (400.0MiB; it has none of its own)"
    assert watch.use_of("a") == MemoryUse(300 * MIB, 400 * MIB, above, None)
    assert watch.use_of("b") == MemoryUse(300 * MIB, 400 * MIB, above, None)


def test_a_cgroup_without_a_limit_anywhere_or_its_usage_is_not_judged(tmp_path: Path, no_machine_psi: Path) -> None:
    unlimited = v2(tmp_path, "a", 300 * MIB, "max")
    unreadable = MemoryCgroup(tmp_path / "gone", "v2")
    watch = MemoryWatch(lambda: [], Evidence({"a": (unlimited, "its cgroup"),  # type: ignore[arg-type]
                                              "b": (unreadable, "its cgroup")}, available=None),
                        meminfo=tmp_path / "no-meminfo")  # (not even the machine's)
    assert watch.use_of("a") is None and watch.use_of("b") is None


def test_without_a_cgroup_the_machine_is_measured(tmp_path: Path, no_machine_psi: Path) -> None:
    no_machine_psi.write_text(PSI)
    info = meminfo(tmp_path, total_kib=1000, available_kib=250)
    use = MemoryWatch(lambda: [], Evidence(), meminfo=info).use_of("any")  # type: ignore[arg-type]
    assert use == MemoryUse(750 * 1024, 1000 * 1024, "the machine", "some avg10=2.50% full avg10=0.75%")
    assert use.fraction == 0.75


def test_without_a_cgroup_of_its_own_the_limit_over_the_supervisors_is_measured(tmp_path: Path,
                                                                                 no_machine_psi: Path) -> None:
    """cgroups = "off": no cgroup is the phase's, but the container's limit still kills; judged against MemTotal,
    a phase at 91% of it went unwarned."""
    no_machine_psi.write_text(PSI)
    info = meminfo(tmp_path, total_kib=24 << 20, available_kib=20 << 20)
    container = Evidence(available=512 * MIB, used_above=465 * MIB)
    use = MemoryWatch(lambda: [], container, meminfo=info).use_of("any")  # type: ignore[arg-type]
    where = "the limit over the supervisor's cgroup, all that is under it counted"
    assert use == MemoryUse(465 * MIB, 512 * MIB, where, "(machine) some avg10=2.50% full avg10=0.75%")


def test_a_meminfo_without_memavailable_is_not_judged(tmp_path: Path, no_machine_psi: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n")
    assert MemoryWatch(lambda: [], Evidence(), meminfo=info).use_of("any") is None  # type: ignore[arg-type]
    assert MemoryWatch(lambda: [], Evidence(), meminfo=tmp_path / "none").use_of("any") is None  # type: ignore[arg-type]


def test_a_zero_limit_is_no_fraction_at_all() -> None:
    assert MemoryUse(5, 0, "the machine").fraction == 0.0


def test_memory_high_is_said_once_per_crossing_pushed_and_kept(tmp_path: Path, no_machine_psi: Path) -> None:
    cgroup = v2(tmp_path, "bench", 950 * MIB, str(1000 * MIB), pressure=PSI)
    evidence = Evidence({"bench": (cgroup, "its cgroup")})
    pushed: list[str] = []
    watch = MemoryWatch(lambda: [Phase("bench")], evidence, push=pushed.append)  # type: ignore[arg-type]
    lines = watch.check()
    want = ("memory_high: phase bench uses 95% of its memory limit (950.0MiB of 1000.0MiB, its cgroup; "
            "memory_warn=0.9); pressure some avg10=2.50% full avg10=0.75%")
    assert lines == [want] and isinstance(lines[0], Unshipped), "the durable push carries it, not the log shipper"
    assert pushed == [f"prover-supervisor: {want}"]
    warning = evidence.warned["bench"]
    assert (warning.fraction, warning.limit, warning.line) == (0.95, 1000 * MIB, want)
    assert watch.check() == [] and len(pushed) == 1, "still high: not said again"
    (cgroup.path / "memory.current").write_text(f"{800 * MIB}\n")  # fell below warn - margin: re-armed
    assert watch.check() == []
    (cgroup.path / "memory.current").write_text(f"{910 * MIB}\n")
    assert len(watch.check()) == 1 and len(pushed) == 2


def test_each_phase_has_its_own_crossing(tmp_path: Path, no_machine_psi: Path) -> None:
    fetch = v2(tmp_path, "fetch", 95, "100")
    bench = v2(tmp_path, "bench", 50, "100")
    evidence = Evidence({"fetch": (fetch, "its cgroup"), "bench": (bench, "its cgroup")})
    watch = MemoryWatch(lambda: [Phase("fetch"), Phase("bench")], evidence)  # type: ignore[arg-type]
    assert [line.split()[2] for line in watch.check()] == ["fetch"]
    (bench.path / "memory.current").write_text("97\n")
    assert [line.split()[2] for line in watch.check()] == ["bench"], "fetch's crossing does not disarm bench"
    assert sorted(evidence.warned) == ["bench", "fetch"]


def test_phases_that_are_not_watched(tmp_path: Path, no_machine_psi: Path) -> None:
    """memory_warn 0 (never), no live children (nothing of it to be killed), no spec key at all: not read."""
    full = v2(tmp_path, "full", 100, "100")
    evidence = Evidence({name: (full, "its cgroup") for name in ("off", "idle", "bare")})
    bare = Phase("bare")
    bare.spec = SimpleNamespace()
    phases = [Phase("off", warn=0.0), Phase("idle", live=False), bare]
    watch = MemoryWatch(lambda: phases, evidence)  # type: ignore[arg-type]
    assert watch.check() == [] and evidence.warned == {}


def test_a_phase_whose_children_ended_and_came_back_keeps_its_crossing(tmp_path: Path, no_machine_psi: Path) -> None:
    """Skipped ticks (no live children) neither say nor re-arm: the next attempt at the same height is silent."""
    cgroup = v2(tmp_path, "svc", 95, "100")
    phase = Phase("svc")
    watch = MemoryWatch(lambda: [phase], Evidence({"svc": (cgroup, "its cgroup")}))  # type: ignore[arg-type]
    assert len(watch.check()) == 1
    phase.live = False
    assert watch.check() == []
    phase.live = True
    assert watch.check() == []


def test_a_new_attempt_at_the_same_height_is_a_new_crossing(tmp_path: Path, no_machine_psi: Path) -> None:
    """A retry or restart makes its cgroup anew and climbs from zero: when no tick saw it low (it got back to the
    same height at once), it went unsaid, and its OOM kill's verdict could cite no warning of its own."""
    cgroup = v2(tmp_path, "svc", 95, "100")
    phase = Phase("svc")
    watch = MemoryWatch(lambda: [phase], Evidence({"svc": (cgroup, "its cgroup")}))  # type: ignore[arg-type]
    assert len(watch.check()) == 1
    assert watch.check() == []
    phase.attempt = 2
    assert len(watch.check()) == 1, "the next attempt's crossing is said"
    assert watch.check() == []


def test_the_line_without_pressure_and_with_a_fractional_warn() -> None:
    line = memory_high_line("fetch", MemoryUse(3 * MIB, 4 * MIB, "the machine"), 0.75)
    assert line == ("memory_high: phase fetch uses 75% of its memory limit (3.0MiB of 4.0MiB, the machine; "
                    "memory_warn=0.75)")


def test_a_cgroup_file_of_garbage_is_no_reading_and_the_watch_goes_on(tmp_path: Path, no_machine_psi: Path) -> None:
    """Non-UTF-8 bytes in memory.stat: that tick has no reading of the phase (counted, said when blind), never an
    exception out of the tick; once the file reads again, memory_high comes as before."""
    cgroup = v2(tmp_path, "fetch", current=950 * MIB, limit=str(1000 * MIB))
    (cgroup.path / "memory.stat").write_bytes(b"anon \xff\xfe\x00 garbage\ninactive_file \xc3\x28\n")
    watch = MemoryWatch(lambda: [Phase("fetch")], Evidence({"fetch": (cgroup, "its cgroup")}))
    assert watch.check() == []
    assert watch.state.misses == 1 and watch.state.readings == 0
    assert "phase fetch" in (watch.state.to_dict()["why"] or "")
    (cgroup.path / "memory.stat").write_text(f"anon {950 * MIB}\ninactive_file 0\n")
    [line] = watch.check()
    assert line.startswith("memory_high: phase fetch uses 95% of its memory limit"), line
    assert watch.state.readings == 1


def test_a_memory_watch_with_nothing_to_watch_is_idle_never_blind(tmp_path: Path) -> None:
    watch = MemoryWatch(lambda: [Phase("fetch", live=False)], Evidence())
    watch.state.window_s = 0.0
    assert watch.check() == [] and watch.state.check() == []
    assert watch.state.to_dict()["state"] == "idle"
