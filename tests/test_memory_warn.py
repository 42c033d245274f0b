"""Memory warned before the kill (memwatch.py): ``memory_high`` once per crossing of memory_warn, with the
usage, the limit and the phase, before the real OOM kill in a real v1 memory cgroup; the verdict names it.
The crossing rule (hysteresis) and the PSI parsing are pure, tested in-process."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from helpers import PY, Runner, first_line, one_verdict, run_in_cgroup, toml_list, v1_cgroup, v1_memory_cgroup_or_skip

from supervisor.evidence.cgroups import parse_pressure
from supervisor.evidence.memwatch import MEMORY_REARM_MARGIN, crossed
from supervisor.text.units import MIB as MiB

# Grows to 93% of its cgroup's limit (read from its own cgroup), says so, waits ``pause`` seconds (long
# enough for a tick or two to see it), then grows until the kernel kills it; gives up at 1 GiB.
CLIMB_CODE = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    rel = next(l.split(":", 2)[2] for l in Path("/proc/self/cgroup").read_text().splitlines()
               if "memory" in l.split(":", 2)[1].split(","))
    cg = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
    limit = int((cg / "memory.limit_in_bytes").read_text())
    usage = lambda: int((cg / "memory.usage_in_bytes").read_text())
    chunks = []
    while usage() < 0.93 * limit and len(chunks) < 256:
        chunks.append(b"x" * (1 << 20))
    print(f"at {usage() * 100 // limit}% of {limit}", flush=True)
    time.sleep(float(sys.argv[1]))
    while len(chunks) < 1024:
        chunks.append(b"x" * (4 << 20))
    print("allocated 1 GiB without being stopped", flush=True)
    sys.exit(3)
    """)


def climb_script(tmp: Path) -> Path:
    path = tmp / "climb.py"
    path.write_text(CLIMB_CODE)
    return path


# Grows (1 MiB at a time) until the cgroup above its own (the container's, which another phase fills too) is at
# 93% of its limit, says so, waits ``pause`` seconds, then grows until the kernel kills it; gives up at 1 GiB.
CLIMB_ABOVE_CODE = CLIMB_CODE.replace('cg = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")',
                                      'cg = (Path("/sys/fs/cgroup/memory") / rel.lstrip("/")).parent')


def test_crossing_is_said_once_and_rearmed_below_the_margin() -> None:
    warn, armed = 0.9, True
    said = []
    for fraction in (0.5, 0.89, 0.91, 0.95, 0.99, 0.88, 0.9, 0.8, 0.92):
        say, armed = crossed(armed, fraction, warn)
        said.append(say)
    # 0.91 says it; 0.88 is within the margin (not re-armed), 0.9 again silent; 0.8 re-arms; 0.92 says it.
    assert 0.9 - MEMORY_REARM_MARGIN > 0.8 and 0.9 - MEMORY_REARM_MARGIN < 0.88
    assert said == [False, False, True, False, False, False, False, False, True]
    assert crossed(True, 1.0, 0.0) == (False, True)  # memory_warn = 0: never


def test_pressure_lines_become_one_short_text() -> None:
    text = ("some avg10=1.20 avg60=0.50 avg300=0.10 total=123456\n"
            "full avg10=0.40 avg60=0.10 avg300=0.00 total=2345\n")
    assert parse_pressure(text) == "some avg10=1.20% full avg10=0.40%"
    assert parse_pressure("") is None


def test_memory_high_comes_before_the_oom_kill_and_the_verdict_names_it(sup: Runner) -> None:
    v1_memory_cgroup_or_skip()
    climb = climb_script(sup.tmp)
    cfg = sup.write(f"""
[[phases]]
name = "hog"
memory_max = "96MiB"
command = {toml_list([PY, str(climb), "2.5"])}
""", stop_grace_s=1)
    result = sup.run(cfg, timeout=60)
    out = result.output
    assert result.returncode == 137, out
    assert "at 9" in out, out  # the climber reached its plateau
    warnings = [line for line in out.splitlines() if "memory_high: phase hog" in line]
    assert len(warnings) == 1, out  # once per crossing, not once a tick on the plateau
    warning = warnings[0]
    assert re.search(r"uses (9\d|100)% of its memory limit \([\d.]+MiB of 96\.0MiB, its cgroup; memory_warn=0\.9\)",
                     warning), warning
    record = one_verdict(out, "hog")
    assert " reason=oom_killed " in record, record
    assert out.index("memory_high: phase hog") < out.index("reason=oom_killed")
    assert re.search(r"warned at \d\d:\d\d:\d\d: memory_high 9\d% of 96\.0MiB", record), record


def test_memory_warn_zero_says_nothing(sup: Runner) -> None:
    v1_memory_cgroup_or_skip()
    climb = climb_script(sup.tmp)
    cfg = sup.write(f"""
[[phases]]
name = "hog"
memory_max = "96MiB"
memory_warn = 0
command = {toml_list([PY, str(climb), "1.5"])}
""", stop_grace_s=1)
    result = sup.run(cfg, timeout=60)
    assert result.returncode == 137, result.output
    assert "memory_high" not in result.output
    assert "warned at" not in one_verdict(result.output, "hog")


def test_only_a_warning_given_before_the_kill_is_cited_by_its_verdict(tmp_path: Path) -> None:
    """A tick between the kill and the reap reads the cgroup at 100% still: its memory_high came after the kill
    was seen, and the verdict cited it as "warned at", memory that had been there to be seen before the kill."""
    import signal
    import time
    from types import SimpleNamespace

    from supervisor.engine.reaping import ExitStatus
    from supervisor.evidence.memory import MemoryReport, MemoryWarning
    from supervisor.lifecycle.verdict import exit_verdict

    cgroup = SimpleNamespace(path=tmp_path / "prover-1-hog")
    started = time.time() - 10

    def judged(warned_at: float, killed_at: float | None) -> str:
        child = SimpleNamespace(
            exited=lambda status: None, drain_output=lambda: None, output_open=True, spec=SimpleNamespace(name="hog"),
            pid=42, stop_reason=None, stop_detail="", started_at=started, sigkilled=False, forwarded={},
            ended_at=None, placement=SimpleNamespace(cgroup=cgroup),
            output=SimpleNamespace(last_lines=lambda begun=False: []))
        memory = SimpleNamespace(
            report=lambda placement: MemoryReport(1, 64 << 20, "phase", None),
            warned={"hog": MemoryWarning(warned_at, 0.99, 64 << 20, "memory_high: ...")},
            kill_seen_at={} if killed_at is None else {cgroup.path: killed_at})
        verdict = exit_verdict(child, ExitStatus(None, signal.SIGKILL), phase="hog", attempt=1,  # type: ignore[arg-type]
                               daemon=False, memory=memory, earlier=())  # type: ignore[arg-type]
        assert verdict.reason == "oom_killed", verdict
        return verdict.detail

    kill = time.time() - 2
    assert "warned at" in judged(kill - 1, kill), "given before the kill"
    assert "warned at" not in judged(kill + 0.001, kill), "given after the kill was seen"
    assert "warned at" in judged(kill - 1, None), "no kill seen live: the reap's own look"
    assert "warned at" not in judged(started - 1, None), "an earlier attempt's"


def test_a_container_filled_by_two_phases_is_warned_and_its_limit_named_at_the_kill(sup: Runner) -> None:
    """Each phase under its own memory_max (160 MiB), the container's 256 MiB filled by the two: the kill comes at
    the container's limit. Judged by the smaller limit, each phase's own, there was no memory_high in the whole
    climb, and the OOM line named only the phase's own limit, which was never reached."""
    climb = sup.tmp / "climb-above.py"
    climb.write_text(CLIMB_ABOVE_CODE)
    with v1_cgroup("filled", 256 * MiB) as cg:
        cfg = sup.write(f"""
[[phases]]
name = "svc"
kind = "service"
memory_max = "160MiB"
command = {toml_list([PY, "-c", "import time; b = b'x' * (100 << 20); time.sleep(60)"])}

[[phases]]
name = "job"
memory_max = "160MiB"
command = {toml_list([PY, str(climb), "2.5"])}
""", stop_grace_s=1)
        out = run_in_cgroup(sup, cfg, cg, timeout=60).output
    assert "at 9" in out, out  # the climber reached its plateau (the container at 93%)
    warning = first_line(out, "memory_high: phase job")
    assert re.search(r"uses 9\d% of its memory limit \([\d.]+MiB of 256\.0MiB, the limit above its cgroup "
                     r"\(256\.0MiB; its own 160\.0MiB is less full\), all that is under it counted;", warning), warning
    record = one_verdict(out, "job")
    assert " reason=oom_killed " in record, out
    assert re.search(r"warned at [\d:]+: memory_high 9\d% of 256\.0MiB", record), record
    oom = first_line(out, "OOM KILL in cgroup")
    assert "-job: " in oom and "limit=160.0MiB" in oom, oom
    assert oom.endswith(f"; the limit reached: 256.0MiB of {cg}"), oom
    assert out.index("memory_high: phase job") < out.index("OOM KILL")


def test_with_the_cgroup_evidence_off_the_containers_limit_is_warned_of(sup: Runner) -> None:
    """cgroups = "off" reads no OOM counter, but the container's limit (the preflight's) still kills: a phase at
    91% of it had no memory_high, judged against the machine's MemTotal."""
    climb = climb_script(sup.tmp)
    with v1_cgroup("off", 256 * MiB) as cg:
        cfg = sup.write(f"""
[[phases]]
name = "hog"
command = {toml_list([PY, str(climb), "2.5"])}
""", stop_grace_s=1)
        cfg.write_text(cfg.read_text().replace("[supervisor]\n", '[supervisor]\ncgroups = "off"\n', 1))
        out = run_in_cgroup(sup, cfg, cg, timeout=60).output
    assert "cgroup evidence turned off" in first_line(out, "memory evidence:"), out
    assert "at 9" in out, out  # the climber reached its plateau
    warning = first_line(out, "memory_high: phase hog")
    assert re.search(r"uses 9\d% of its memory limit \([\d.]+MiB of 256\.0MiB, the limit over the supervisor's "
                     r"cgroup, all that is under it counted;", warning), warning
