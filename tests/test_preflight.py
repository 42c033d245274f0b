"""The memory preflight: a phase whose ``min_memory`` cannot fit is refused at once, before anything starts.

The fitness check (supervisor/lifecycle/fitness.py) does it before the first phase, for every phase:
the refusal is a ``phase=fitness`` verdict that names the phase, and no phase runs.

What is available is the tightest of MemTotal and the memory cgroup limits up
the supervisor's own hierarchy; children are told it in
``SUPERVISOR_MEMORY_AVAILABLE_BYTES``. The cgroup cases run the supervisor
inside a real v1 cgroup with a 256 MiB limit (skipped, with the reason, where
v1 is not writable here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import (
    Runner,
    bind_mount,
    first_line,
    one_verdict,
    run_in_cgroup,
    shell,
    toml_list,
    toml_str,
    unmount,
    v1_cgroup,
    verdict_lines,
)

from supervisor.evidence.cgroups import mem_total
from supervisor.exits import EXIT_CONFIG_ERROR, EXIT_FAILURE
from supervisor.text.units import MIB as MiB

DETAIL_RE = re.compile(r"needs min_memory=(\S+) \((\d+) bytes\) but only (\S+) \((\d+) bytes\) is available")


def refused_config(runner: Runner, min_memory: str, started: Path, *, extra: str = "") -> Path:
    """Phase ``first`` runs; phase ``big`` (with a daemon) needs ``min_memory``; each child touches a marker."""
    return runner.write(f"""
        [[phases]]
        name = "first"
        command = {toml_list(["touch", str(started / "first")])}

        [[phases]]
        name = "big"
        min_memory = "{min_memory}"
        {extra}
        command = {toml_list(["touch", str(started / "big")])}

        [[phases.daemons]]
        name = "helper"
        command = {shell(f"touch {started / 'helper'}; sleep 30")}
        """, stop_grace_s=1)


def env_config(runner: Runner, min_memory: str, seen: Path) -> Path:
    """Phase ``fits`` needs ``min_memory``; its command and daemon write down what they were told (the command
    waits for the daemon's: the phase's end stops the daemon, which may not have run its first line yet)."""
    return runner.write(f"""
        [[phases]]
        name = "fits"
        min_memory = "{min_memory}"
        command = {shell(f'while [ ! -s {seen / "daemon"} ]; do sleep 0.02; done; '
                         f'echo "$SUPERVISOR_MEMORY_AVAILABLE_BYTES" > {seen / "command"}')}

        [[phases.daemons]]
        name = "helper"
        command = {shell(f'echo "$SUPERVISOR_MEMORY_AVAILABLE_BYTES" > {seen / "daemon"}; exec sleep 30')}

        [[phases]]
        name = "plain"
        command = {shell(f'echo "$SUPERVISOR_MEMORY_AVAILABLE_BYTES" > {seen / "plain"}')}
        """, stop_grace_s=1)


def check_refused(out: str, returncode: int, need: int, started: Path) -> int:
    """The phase ``big`` was refused before any phase started; returns the available bytes named."""
    assert returncode == EXIT_FAILURE, out  # (a finding about the machine: no child status to pass on)
    record = one_verdict(out, "fitness")
    assert " reason=insufficient_memory " in record and "phase big needs min_memory=" in record, record
    match = DETAIL_RE.search(record)
    assert match, record
    assert int(match.group(2)) == need
    available = int(match.group(4))
    assert available < need
    assert "phase big: pending → stopped" in out and "phase first: pending → stopped" in out, out
    assert "[supervisor] started " not in out, "a child was started on a machine found unfit"
    assert not (started / "big").exists() and not (started / "helper").exists()
    assert not (started / "first").exists(), "the phase before it must not run either: the machine is unfit"
    assert [r for r in verdict_lines(out) if "reason=insufficient_memory" in r] == [record]
    return available


def test_min_memory_above_what_is_available_fails_at_once(sup: Runner) -> None:
    started = sup.tmp / "started"
    started.mkdir()
    need = 100 << 40  # 100 TiB
    result = sup.run(refused_config(sup, "100TiB", started), timeout=30)
    available = check_refused(result.output, result.returncode, need, started)
    total = mem_total()
    assert total is not None and available <= total
    print(f"refused in {result.duration:.2f}s (whole supervisor run)")
    assert result.duration < 10, result.output


def test_min_memory_below_what_is_available_runs_and_children_are_told(sup: Runner) -> None:
    seen = sup.tmp / "seen"
    seen.mkdir()
    result = sup.run(env_config(sup, "1MiB", seen), timeout=30)
    out = result.output
    assert result.returncode == 0, out
    assert "phase fits: memory preflight ok: " in out and "min_memory 1.0MiB" in out
    told = {name: (seen / name).read_text().strip() for name in ("command", "daemon", "plain")}
    assert all(value.isdigit() for value in told.values()), told
    assert len(set(told.values())) == 1, told
    available = int(told["command"])
    total = mem_total()
    assert total is not None and 0 < available <= total
    assert "reason=insufficient_memory" not in out


def test_min_memory_above_the_phases_own_memory_max_is_refused_before_anything(sup: Runner) -> None:
    """A phase limited to 64 MiB by its own memory_max can never have the 128 MiB it says it needs: refused as the
    config is read (no machine could run it), so no preflight is needed, and nothing starts."""
    started = sup.tmp / "started"
    started.mkdir()
    config = refused_config(sup, "128MiB", started, extra='memory_max = "64MiB"')
    result = sup.run(config, timeout=30)
    assert result.returncode == EXIT_CONFIG_ERROR, f"a phase needing 128MiB ran under 64MiB:\n{result.output}"
    assert result.output == (f"prover-supervisor: {config}: phases[1] (big).min_memory: 128.0MiB is above memory_max "
                             "64.0MiB: the phase could never start\n"), result.output
    assert not list(started.iterdir()) and not sup.state_dir.exists()


def test_limit_from_a_real_v1_cgroup(sup: Runner) -> None:
    with v1_cgroup("preflight", 256 * MiB) as cg:
        started = sup.tmp / "started"
        started.mkdir()
        refused = run_in_cgroup(sup, refused_config(sup, "512MiB", started), cg, timeout=30)
        available = check_refused(refused.output, refused.returncode, 512 * MiB, started)
        assert available == 256 * MiB
        record = one_verdict(refused.output, "fitness")
        assert "but only 256.0MiB (268435456 bytes) is available" in record, record
        assert "memory available 256.0MiB" in first_line(refused.output, "memory evidence:")

        seen = sup.tmp / "seen"
        seen.mkdir()
        ok = run_in_cgroup(sup, env_config(sup, "128MiB", seen), cg, timeout=30)
        assert ok.returncode == 0, ok.output
        assert "phase fits: memory preflight ok: 256.0MiB available, min_memory 128.0MiB" in ok.output
        for name in ("command", "daemon", "plain"):
            assert (seen / name).read_text().strip() == str(256 * MiB), name
    assert not cg.exists()


def test_a_limit_above_the_cgroup_mount_is_held_to(sup: Runner) -> None:
    """A container sees its own cgroup as the mount's root, and its runtime's limit may be on a cgroup above it
    (Docker's --cgroup-parent on a limited slice): the supervisor saw no limit at all, a 256 MiB container passed
    a min_memory of 512 MiB and its children were told the machine's memory. v1's memory.stat says it."""
    with v1_cgroup("hidden", 256 * MiB) as cg:
        inner = cg / "inner"
        inner.mkdir()  # (no limit of its own: the container's cgroup, below the limited one)
        mount = sup.tmp / "cgroupfs" / "memory"
        mount.mkdir(parents=True)
        try:
            why = bind_mount(inner, mount)  # (as the container sees it: its cgroup at the mount's root)
            if why is not None:
                pytest.skip(why)
            started = sup.tmp / "started"
            started.mkdir()
            config = refused_config(sup, "512MiB", started)
            config.write_text(config.read_text().replace(
                "[supervisor]\n", f"[supervisor]\ncgroup_root = {toml_str(str(mount.parent))}\n", 1))
            refused = run_in_cgroup(sup, config, inner, timeout=30)
            assert f"cgroup v1 at {mount}" in first_line(refused.output, "memory evidence:"), refused.output
            assert check_refused(refused.output, refused.returncode, 512 * MiB, started) == 256 * MiB
        finally:
            unmount(mount)
    assert not cg.exists()
