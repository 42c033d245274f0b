"""Real kernel OOM kills (cgroup v1 memory controller) and the verdicts the supervisor draws from them.

Exit status 137 only says SIGKILL. These tests make the kernel's OOM killer
send it for real (a phase's ``memory_max``, or a small cgroup the test puts the
whole supervisor in) and check that the verdict says ``oom_killed`` only when
the cgroup's ``oom_kill`` counter rose during the child's life: a SIGKILL from a
person, an OOM kill before the phase, a grandchild's OOM kill, a daemon's. Every
limit is at most 300 MiB and every allocator gives up at 1 GiB, so the machine
is never at risk; every test cgroup is removed afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    PY,
    REPO,
    V1_MOUNT,
    Runner,
    alloc_script,
    clean_env,
    finish,
    first_line,
    in_cgroup_argv,
    one_verdict,
    py_script,
    read_pid,
    run_in_cgroup,
    shell,
    start_in_cgroup,
    toml_list,
    toml_str,
    v1_cgroup,
    v1_memory_cgroup_or_skip,
    verdict_lines,
)

from supervisor.engine.reaping import ExitStatus
from supervisor.evidence.cgroups import MemoryCgroup
from supervisor.evidence.memory import MemoryReport
from supervisor.lifecycle import verdict as v
from supervisor.state.files import CGROUP_LEDGER
from supervisor.status.health import metrics_text
from supervisor.status.model import Snapshot
from supervisor.text.units import MIB as MiB
from supervisor.text.units import parse_size

OOM_LINE_RE = re.compile(r"OOM KILL in cgroup (\S+): oom_kill (\d+) → (\d+); ")
PEAK_RE = re.compile(r" peak=(\d+(?:\.\d+)?)(B|KiB|MiB|GiB)\((phase|shared|none)\)")


def peak_of(record: str) -> tuple[int, str]:
    match = PEAK_RE.search(record)
    assert match, f"no peak= in {record}"
    return parse_size(match.group(1) + match.group(2)), match.group(3)


def config(runner: Runner, body: str, *, cgroups: str | None = None) -> Path:
    extra = f'cgroups = "{cgroups}"' if cgroups else ""
    path = runner.tmp / "config.toml"
    path.write_text(runner.header(stop_grace_s=1, extra=extra) + body)
    return path


def test_phase_over_its_memory_max_is_oom_killed(sup: Runner) -> None:
    base = v1_memory_cgroup_or_skip()
    alloc = alloc_script(sup.tmp)
    cfg = config(sup, f"""
[[phases]]
name = "hog"
memory_max = "64MiB"
command = {toml_list([PY, str(alloc)])}
""")
    result = sup.run(cfg, timeout=60)
    out = result.output
    assert result.returncode == 137, out
    record = one_verdict(out, "hog")
    assert " reason=oom_killed " in record and " signal=SIGKILL " in record, record
    assert " oom_kills=1 " in record, record
    peak, scope = peak_of(record)
    assert scope == "phase"
    assert 32 * MiB <= peak <= 64 * MiB, record
    assert "per-phase mode" in first_line(out, "memory evidence:")

    live = OOM_LINE_RE.search(out)
    assert live, f"no live OOM KILL line:\n{out}"
    # Named per supervisor (prover-<its pid>-<phase>): two supervisors in one cgroup never share it.
    assert re.fullmatch(re.escape(str(base)) + r"/prover-\d+-hog", live.group(1)), live.group(1)
    assert (int(live.group(2)), int(live.group(3))) == (0, 1)
    assert "limit=64.0MiB" in first_line(out, "OOM KILL in cgroup")
    assert first_line(out, "OOM KILL in cgroup").endswith("; the limit reached: its own 64.0MiB")  # (its failcnt rose)
    # the live line comes before the verdict
    assert out.index("OOM KILL in cgroup") < out.index("reason=oom_killed")
    assert not list(base.glob("prover-*-hog")), "the phase's cgroup was not removed"


def test_status_and_metrics_count_the_oom_kills_of_the_phase_cgroups(sup: Runner) -> None:
    # Per-phase mode: each attempt's kill is counted in its own cgroup, made anew, and the supervisor's cgroup
    # (which status read) never counts it: status and /metrics said oom_kills=0 after two OOM kills.
    v1_memory_cgroup_or_skip()
    alloc = alloc_script(sup.tmp)
    cfg = config(sup, f"""
[[phases]]
name = "hog"
memory_max = "64MiB"
retries = 1
backoff_s = 0.1
command = {toml_list([PY, str(alloc)])}
""")
    result = sup.run(cfg, timeout=60)
    assert result.returncode == 137 and result.output.count("reason=oom_killed") == 2, result.output
    answer = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                            capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env())
    memory = json.loads(answer.stdout)["memory"]
    assert memory["mode"] == "per-phase" and memory["oom_kills"] == 2, memory
    assert " oom_kills=2" in memory["snapshot"], memory
    metrics = metrics_text(Snapshot.from_json(json.loads(answer.stdout)))
    assert "\nprover_supervisor_memory_oom_kills 2" in metrics, metrics


@pytest.mark.parametrize("sh_status", [0, 1])
def test_grandchild_oom_kill_is_noted_but_not_the_commands_verdict(sup: Runner, sh_status: int) -> None:
    base = v1_memory_cgroup_or_skip()
    alloc = alloc_script(sup.tmp)
    cfg = config(sup, f"""
[[phases]]
name = "wrap"
memory_max = "64MiB"
command = {shell(f'{PY} {alloc}; echo "allocator ended with $?"; exit {sh_status}')}
""")
    result = sup.run(cfg, timeout=60)
    out = result.output
    assert result.returncode == sh_status, out
    assert "allocator ended with 137" in out
    record = one_verdict(out, "wrap")
    assert " reason=exit_code " in record and f" exit_code={sh_status} " in record, record
    assert "oom_killed" not in record
    assert " oom_kills=1 " in record, record
    assert "OOM kill(s) in its phase cgroup" in record, record
    assert "signal=" not in record
    assert OOM_LINE_RE.search(out), out
    assert not list(base.glob("prover-*-wrap"))


def test_shared_mode_oom_kill_in_the_supervisors_own_cgroup(sup: Runner) -> None:
    alloc = alloc_script(sup.tmp)
    cfg = config(sup, f"""
[[phases]]
name = "hog"
command = {toml_list([PY, str(alloc)])}
""", cgroups="shared")
    with v1_cgroup("shared", 300 * MiB) as cg:
        result = run_in_cgroup(sup, cfg, cg, timeout=60)
        out = result.output
        assert result.returncode == 137, out
        assert first_line(out, "memory evidence:").split("memory evidence: ", 1)[1].startswith(
            f"shared mode, cgroup v1 at {cg}"), out
        assert "memory available 300.0MiB" in first_line(out, "memory evidence:")
        record = one_verdict(out, "hog")
        assert " reason=oom_killed " in record and " oom_kills=1 " in record, record
        assert "in its shared cgroup" in record
        peak, scope = peak_of(record)
        assert scope == "shared"
        assert 200 * MiB <= peak <= 300 * MiB, record
        live = OOM_LINE_RE.search(out)
        assert live and live.group(1) == str(cg), out
        assert MemoryCgroup(cg, "v1").oom_kills() == 1
        assert not [p for p in cg.iterdir() if p.is_dir()], "shared mode made a sub-cgroup"
    assert not cg.exists()


# A command that moves itself into a cgroup below the one its verdict reads (as a program that makes cgroups
# of its own does), then allocates past a limit. v1 counts an OOM kill only in the victim's own cgroup, never
# in those above it (measured on Linux 6.18: whether its own limit or the one above killed it), so a
# verdict that read only the cgroup it placed the child in took the kernel's kill for a SIGKILL from anyone.
def moved_below(cgroup: str, command: str) -> str:
    """The TOML command: a shell that moves itself into ``<cgroup>/inner`` (made if need be), then execs
    ``command``; ``cgroup`` is a path, or a shell expression of one."""
    return shell(f'CG={cgroup}; mkdir -p "$CG/inner" && echo $$ > "$CG/inner/cgroup.procs" && exec {command}')


def own_count(cgroup: Path) -> int:
    """The ``oom_kill`` of this one v1 cgroup's own file (none of the cgroups below it)."""
    return int(re.findall(r"^oom_kill (\d+)$", (cgroup / "memory.oom_control").read_text(), re.M)[0])


@pytest.mark.parametrize("killed_by", ["its own limit", "the limit above it"])
def test_shared_mode_sees_an_oom_kill_in_a_cgroup_nested_below(sup: Runner, killed_by: str) -> None:
    alloc = alloc_script(sup.tmp)
    with v1_cgroup("nested", 256 * MiB) as cg:
        inner = cg / "inner"
        inner.mkdir()
        if killed_by == "its own limit":
            (inner / "memory.limit_in_bytes").write_text(str(48 * MiB))
        cfg = config(sup, f"""
[[phases]]
name = "hog"
command = {moved_below(str(cg), f"{PY} {alloc}")}
""", cgroups="shared")
        result = run_in_cgroup(sup, cfg, cg, timeout=60)
        out = result.output
        assert result.returncode == 137, out
        assert own_count(inner) == 1, "the allocator was not OOM-killed in the nested cgroup"
        record = one_verdict(out, "hog")
        assert " reason=oom_killed " in record and " oom_kills=1 " in record, record
        assert "in its shared cgroup" in record, record
    assert not cg.exists()


def test_per_phase_mode_sees_an_oom_kill_in_a_cgroup_nested_below_the_phases(sup: Runner) -> None:
    base = v1_memory_cgroup_or_skip()
    alloc = alloc_script(sup.tmp)
    own = f"{V1_MOUNT}$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)"  # the phase's cgroup, as it sees it
    cfg = config(sup, f"""
[[phases]]
name = "hog"
memory_max = "64MiB"
command = {moved_below(own, f"{PY} {alloc}")}
""")
    result = sup.run(cfg, timeout=60)
    out = result.output
    assert result.returncode == 137, out
    assert "per-phase mode" in first_line(out, "memory evidence:")
    record = one_verdict(out, "hog")
    assert " reason=oom_killed " in record and " oom_kills=1 " in record, record
    assert "in its phase cgroup" in record, record
    assert not list(base.glob("prover-*-hog")), "the phase's cgroup was left, with the one its command made below"


def test_each_attempts_peak_is_its_own(sup: Runner) -> None:
    """A retried phase: its first attempt peaks near 96 MiB, its second allocates nothing. The second's verdict
    shows its own peak, never the first's (its cgroup is made anew for each attempt: v1's watermark could be
    reset, but v2's memory.peak mostly cannot)."""
    base = v1_memory_cgroup_or_skip()
    marker = sup.tmp / "first-attempt"
    twice = py_script(sup.tmp, "twice", f"""
        import os, sys
        if not os.path.exists({str(marker)!r}):  # the first attempt: 96 MiB, every byte written
            open({str(marker)!r}, "w").close()
            b = b"x" * (96 << 20)
        sys.exit(1)
        """)
    cfg = config(sup, f"""
[[phases]]
name = "twice"
memory_max = "192MiB"
retries = 1
backoff_s = 0.1
backoff_jitter = 0
command = {twice}
""")
    result = sup.run(cfg, timeout=60)
    out = result.output
    assert result.returncode == 1, out
    records = verdict_lines(out, "twice")
    assert len(records) == 2, out
    first_peak, scope = peak_of(records[0])
    assert scope == "phase" and first_peak >= 96 * MiB, records[0]
    second_peak, _ = peak_of(records[1])
    assert second_peak < 32 * MiB, f"the second attempt's verdict shows the first's peak: {records[1]}"
    assert not list(base.glob("prover-*-twice"))
    ledger = (sup.state_dir / CGROUP_LEDGER).read_text().splitlines()
    assert len(ledger) == 1 and ledger[0].endswith("-twice"), ledger  # made twice, noted once


def sigkilled_from_outside(runner: Runner, phase: str, *, cgroups: str | None = None) -> str:
    """Run a phase (memory_max 64MiB, where its own cgroup may be made) whose command this test SIGKILLs itself;
    the supervisor's output."""
    pidfile = runner.tmp / "child.pid"
    limit = 'memory_max = "64MiB"' if cgroups in (None, "auto") else ""  # (refused with "off" or "shared")
    cfg = config(runner, f"""
[[phases]]
name = "{phase}"
{limit}
command = {shell(f'echo $$ > {pidfile}; exec sleep 30')}
""", cgroups=cgroups)
    started = time.monotonic()
    proc = runner.start(cfg)
    os.kill(read_pid(pidfile, timeout=15), signal.SIGKILL)
    result = finish(proc, started, timeout=30)
    assert result.returncode == 137, result.output
    return result.output


def test_sigkill_from_outside_is_a_signal_not_an_oom_kill(sup: Runner) -> None:
    v1_memory_cgroup_or_skip()  # the verdict must know (not guess) that no OOM kill happened
    out = sigkilled_from_outside(sup, "victim")
    record = one_verdict(out, "victim")
    assert " reason=signal " in record and " signal=SIGKILL " in record, record
    assert "oom_kills=" not in record and "oom=unknown" not in record, record
    assert "reason=oom_killed" not in out
    assert "OOM KILL" not in out


def test_an_old_oom_kill_never_taints_a_later_phase(sup: Runner, tmp_path: Path) -> None:
    alloc = alloc_script(tmp_path)
    pidfile = sup.tmp / "child.pid"
    cfg = config(sup, f"""
[[phases]]
name = "later"
command = {shell(f'echo $$ > {pidfile}; exec sleep 30')}
""", cgroups="shared")
    with v1_cgroup("oldoom", 200 * MiB) as cg:
        early = subprocess.run(in_cgroup_argv(cg, [sys.executable, str(alloc)]), capture_output=True, timeout=60)
        assert early.returncode == -9
        assert MemoryCgroup(cg, "v1").oom_kills() == 1, "the first OOM kill did not happen"

        started = time.monotonic()
        proc = start_in_cgroup(sup, cfg, cg)
        os.kill(read_pid(pidfile, timeout=15), signal.SIGKILL)
        result = finish(proc, started, timeout=30)
        out = result.output
        assert result.returncode == 137, out
        assert "shared mode" in first_line(out, "memory evidence:")
        record = one_verdict(out, "later")
        assert " reason=signal " in record and " signal=SIGKILL " in record, record
        assert "oom_kills=" not in record and "reason=oom_killed" not in out, record
        assert "OOM KILL" not in out, "the old OOM kill was logged as a new one"
        assert MemoryCgroup(cg, "v1").oom_kills() == 1


def run_daemon_oom(runner: Runner, marker: Path) -> str:
    """Phase ``work``: its command sleeps, its daemon ``hogd`` allocates past the phase's memory_max."""
    alloc = alloc_script(runner.tmp)
    cfg = config(runner, f"""
[[phases]]
name = "work"
memory_max = "64MiB"
command = {toml_list(["sleep", "30"])}

[[phases.daemons]]
name = "hogd"
command = {shell(f'sleep 0.3; exec {PY} {alloc}')}

[[phases]]
name = "after"
command = {toml_list(["touch", str(marker)])}
""")
    result = runner.run(cfg, timeout=60)
    assert result.returncode == 137, result.output
    return result.output


def test_daemon_oom_killed_during_its_phase(sup: Runner) -> None:
    base = v1_memory_cgroup_or_skip()
    marker = sup.tmp / "after.marker"
    out = run_daemon_oom(sup, marker)
    record = one_verdict(out, "work", "hogd")
    assert " reason=oom_killed " in record and " oom_kills=1 " in record, record
    assert "daemon killed by the OOM killer" in record
    assert "phase work: stopping → failed (oom_killed" in out
    command = one_verdict(out, "work", "work")
    assert " reason=stopped " in command and "oom_killed" not in command, command
    assert not marker.exists()
    assert OOM_LINE_RE.search(out)
    assert not list(base.glob("prover-*-work"))


def test_daemons_oom_kill_is_not_blamed_on_the_commands_descendants(sup: Runner) -> None:
    """The victim was the command's sibling (a daemon of the same phase cgroup), not one of its descendants."""
    v1_memory_cgroup_or_skip()
    out = run_daemon_oom(sup, sup.tmp / "after.marker")
    command = one_verdict(out, "work", "work")
    daemon = re.search(r"phase=work child=hogd pid=(\d+) reason=oom_killed ", out)
    assert daemon, out
    # The rise of the phase cgroup's counter is noted on the command too, and put on the daemon by name:
    # the supervisor knows its victim, so it does not offer the command's descendants as a guess.
    assert " oom_kills=1 " in command, command
    assert f"1 OOM kill(s) in its phase cgroup during its life, of hogd (pid {daemon.group(1)})" in command, command
    assert "descendants" not in command, f"the command's verdict blames its descendants for the OOM kill: {command}"


def test_cgroups_off_says_oom_unknown(sup: Runner) -> None:
    out = sigkilled_from_outside(sup, "blind", cgroups="off")
    head = out.splitlines()[:3]
    assert any("memory evidence:" in line and "turned off" in line and "OOM kills are unknown" in line
               for line in head), head
    record = one_verdict(out, "blind")
    assert " reason=signal " in record and " signal=SIGKILL " in record, record
    assert " oom=unknown " in record, record
    assert "peak=" not in record
    assert len(verdict_lines(out)) == 1


def test_a_memory_max_that_cannot_be_applied_is_said(sup: Runner) -> None:
    """Where cgroups = "auto" finds no per-phase cgroup to make (here: no cgroup under cgroup_root at all), a
    phase's memory_max limits nothing: the supervisor must say so, not stay silent. ("off" and "shared" never
    make one: such a config is refused before anything starts, tests/test_config.py.)"""
    empty = sup.tmp / "no-cgroupfs"
    empty.mkdir()
    cfg = sup.tmp / "config.toml"
    cfg.write_text(sup.header(stop_grace_s=1, extra=f"cgroup_root = {toml_str(str(empty))}") + f"""
[[phases]]
name = "limited"
memory_max = "64MiB"
command = {toml_list(["true"])}
""")
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == 0, out
    assert "OOM kills are unknown" in first_line(out, "memory evidence:"), out
    # (the test's own directory name contains "memory_max": leave paths out)
    said = [line for line in out.splitlines() if "memory_max" in line.replace(str(sup.tmp), "<tmp>")]
    assert said, f"memory_max = 64MiB was silently not applied (no cgroup found):\n{out}"
    assert "cannot be applied: no per-phase cgroup" in said[0], said


# ---------------------------------------------------------------- whose OOM kill it was (in-process)


def _killed(**kwargs: object) -> v.Verdict:
    memory = MemoryReport(oom_kills=1, peak=None, scope="phase", snapshot=None)
    return v.from_exit("p", "daemon", 42, ExitStatus(None, signal.SIGKILL), daemon=True, attempt=1, started_at=0.0,
                       last_lines=[], memory=memory, **kwargs)  # type: ignore[arg-type]


def test_a_sigkill_the_known_oom_victims_account_for_is_not_a_second_oom_kill() -> None:
    # One kernel OOM kill (a sibling's, already judged oom_killed) made two oom_killed verdicts: a daemon SIGKILLed
    # by someone else in the same life was blamed on the OOM killer too.
    known = _killed(stop_reason=None, victims=("bench (pid 7)",))
    assert known.reason == v.DAEMON_DIED, known
    assert known.detail.endswith("1 OOM kill(s) in its phase cgroup during its life, of bench (pid 7)"), known
    assert _killed(stop_reason=None).reason == v.OOM_KILLED  # no known victim: it was this one


def test_an_oom_kill_in_a_stops_grace_is_the_oom_killers_not_the_stop() -> None:
    # The supervisor asked it to stop (SIGTERM, grace running) and the kernel's OOM killer SIGKILLed it meanwhile:
    # it was recorded as a clean stop (success, status 0), the detail blaming another process.
    during = _killed(stop_reason="supervisor shutdown")
    assert (during.reason, during.success) == (v.OOM_KILLED, False), during
    assert during.detail.endswith(", while the supervisor was stopping it (supervisor shutdown)"), during
    ours = _killed(stop_reason="supervisor shutdown", sigkilled=True)  # the grace ran out: our SIGKILL
    assert (ours.reason, ours.success) == (v.STOPPED, True), ours
    # And it says whose SIGKILL it was (it once read "killed by SIGKILL (status 137) after the supervisor stopped
    # it", the kernel's left open): the real cuzk-daemon never ends on SIGINT, so every phase's end reads so.
    assert ours.detail.startswith("supervisor shutdown; killed by the supervisor's SIGKILL (status 137); "), ours


# ``docker run --oom-kill-disable`` sets oom_kill_disable on the container's cgroup, and v1 hands it to every cgroup
# made below: a phase at its own memory_max froze (under_oom 1) instead of being killed, and said nothing.

def test_a_phase_at_its_memory_max_is_killed_though_the_container_disables_the_oom_killer(sup: Runner) -> None:
    alloc = alloc_script(sup.tmp)
    with v1_cgroup("nokill", 300 * MiB) as cg:
        (cg / "memory.oom_control").write_text("1")
        cfg = config(sup, f"""
[[phases]]
name = "hog"
memory_max = "64MiB"
timeout_s = 20
command = {toml_list([PY, str(alloc)])}
""")
        result = run_in_cgroup(sup, cfg, cg, timeout=60)
        out = result.output
        assert result.returncode == 137, out
        record = one_verdict(out, "hog")
        assert " reason=oom_killed " in record and " oom_kills=1 " in record, record
    assert not cg.exists()


def test_a_phase_frozen_at_the_containers_limit_with_the_oom_killer_disabled_is_said(tmp_path: Path) -> None:
    # The limit above the phase (the container's) is reached: its own oom_kill_disable governs, and the kernel
    # freezes every process of it. No kill can come; the memory evidence says the freeze, once. (The supervisor
    # runs outside the frozen cgroup here: inside it, it would wait for memory too, as in such a container.)
    from supervisor.engine.loop import EventLoop
    from supervisor.evidence.memory import MemoryEvidence

    alloc = alloc_script(tmp_path)
    lines: list[str] = []
    with v1_cgroup("frozen", 64 * MiB) as cg:
        (cg / "memory.oom_control").write_text("1")
        proc_cgroup = tmp_path / "proc-self-cgroup"  # names cg as this process's own memory cgroup
        proc_cgroup.write_text(f"4:memory:/{cg.relative_to(V1_MOUNT)}\n0::/\n")
        loop = EventLoop()
        evidence = MemoryEvidence(loop, lines.append, mode="auto", root=str(V1_MOUNT.parent), proc_cgroup=proc_cgroup)
        child = None
        try:
            placement = evidence.place("hog", None)
            assert placement.cgroup is not None and placement.cgroup.path.parent == cg, evidence.describe()
            child = subprocess.Popen(in_cgroup_argv(placement.cgroup.path, [PY, str(alloc)]))
            deadline = time.monotonic() + 30
            while not any("with the OOM killer disabled" in line for line in lines) and time.monotonic() < deadline:
                loop.run_once(max_wait=0.1)
            for _ in range(5):  # a few looks more: each cgroup is said once while it lasts
                loop.run_once(max_wait=0.1)
            frozen = sorted(line.split()[3] for line in lines if "with the OOM killer disabled" in line)
            assert frozen == [str(cg), str(placement.cgroup.path)] and child.poll() is None, (lines, child.poll())
            assert all("none is killed" in line for line in lines if line.startswith("OOM in cgroup ")), lines
        finally:
            if child is not None:
                child.kill()
                child.wait(30)
            evidence.close()
            loop.close()
    assert not cg.exists()
