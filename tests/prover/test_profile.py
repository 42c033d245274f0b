"""The built-in prover profile end to end: no config at all, the stand-ins on PATH, the dev-manager.

``python -m supervisor run`` with nothing but environment variables runs supervisor/prover/profile.toml:
paramfetch → warm-up (cuzk-daemon + one proof) → a fresh daemon + the bench → curio with a daemon.
The stand-ins come from ``prover-supervisor standins --bin-dir`` (curio, cuzk-daemon, cuzk-bench under
their real names) and the memory figures are lowered through the profile's env knobs, so the whole
lifecycle runs here in seconds. Also: resume on a second start, the default 128 GiB preflight on a
smaller machine, a bench with failed proofs, the onstart lock, SIGHUP under nohup, and the
docker/entrypoint.sh shim.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    PY,
    REPO,
    Result,
    Runner,
    first_line,
    hup_as_default,
    last_failure,
    one_verdict,
    pid_alive,
    pyc,
    read,
    seconds_between,
    started,
    verdict_fields,
    verdict_lines,
    wait_for,
)
from profilekit import DROP_PREFIXES, profile_runner

from supervisor.app.cli import dev_manager
from supervisor.evidence.cgroups import mem_total
from supervisor.exits import EXIT_ALREADY_RUNNING, EXIT_CONFIG_ERROR, EXIT_FAILURE
from supervisor.text.units import GIB, parse_size

PHASES = ["paramfetch", "warmup", "bench", "curio"]
STATES = ["registered", "params_done", "bench_done", "running"]
DONE_RE = re.compile(r"\[supervisor\] phase (\S+): \S+ → done \((.*)\)$", re.M)
THROUGHPUT_RE = re.compile(r"\[bench/bench\] throughput:\s+([0-9.]+) proofs/min", re.M)


def done_phases(output: str) -> list[tuple[str, str]]:
    return DONE_RE.findall(output)


def assert_all_gone(pids: list[int]) -> None:
    wait_for(lambda: not any(map(pid_alive, pids)), 5)


@dataclass
class FirstRun:
    profile: Runner
    run: Result
    env: dict[str, str]
    instance: dict[str, Any]
    register_calls: int


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[FirstRun]:
    """The whole profile once, on a fresh machine; the resume test goes on from its state dir."""
    dev = dev_manager(port=0, quiet=True).start()
    prof = profile_runner(tmp_path_factory.mktemp("profile-first"), bin_dir, dev, f"C.9{os.getpid()}")
    try:
        # The PCE's extraction outlasts the warm-up's proof, as the real one's does (its budget waits for the proof).
        env = prof.env(STANDIN_PCE_S="1")
        run = prof.run(env=env, name="first")
        yield FirstRun(prof, run, env, prof.instance(), prof.calls("/register"))
    finally:
        prof.cleanup()
        dev.stop()


# ---------------------------------------------------------------- the whole lifecycle


def test_profile_runs_the_whole_lifecycle(first: FirstRun) -> None:
    out, prof = first.run.output, first.profile
    assert first.run.returncode == 0, out[-6000:]
    assert "config: built-in prover profile" in out
    assert [name for name, _ in done_phases(out)] == PHASES, done_phases(out)
    assert "exiting with status 0" in out

    # The manager saw every step, in order, once registered.
    inst = first.instance
    assert inst["history"] == STATES, inst
    assert first.register_calls == 1

    # The rate reported is the bench summary's proofs/min × 60.
    rates = THROUGHPUT_RE.findall(out)
    assert len(rates) == 1, out[-4000:]
    assert inst["rate"] == pytest.approx(float(rates[0]) * 60, abs=0.001)

    # cuzk.toml: generated into state_dir before each daemon start, and logged.
    cuzk_toml = prof.state_dir / "cuzk.toml"
    assert out.count(f"wrote {cuzk_toml}:") == 3  # warm-up, bench, curio
    written = tomllib.loads(cuzk_toml.read_text())
    # (the daemon's own form: a Rust SocketAddr; "http://..." there ended the real daemon at its start)
    assert written["daemon"]["listen"] == f"127.0.0.1:{first.env['CUZK_PORT']}"
    assert written["daemon"]["status_listen"] == f"127.0.0.1:{first.env['CUZK_STATUS_PORT']}"
    assert written["srs"]["param_cache"] == first.env["FIL_PROOFS_PARAMETER_CACHE"]
    assert written["pipeline"]["synthesis_concurrency"] >= 1
    assert f"cuzk.toml | synthesis_concurrency = {written['pipeline']['synthesis_concurrency']}" in out
    assert (prof.state_dir / "cuzk.generated.toml").read_text() == cuzk_toml.read_text()
    # The generated -j reaches the bench.
    j = re.search(r"phase bench: wrote .*bench -j (\d+)", out)
    assert j and f"[bench/bench] concurrency: {j.group(1)}" in out, out[-3000:]

    # The warm-up's daemon was stopped with SIGINT (it logged it), then a fresh one started for the bench.
    children = started(out)
    daemons = {label: pid for label, pid in children if label.endswith("/cuzk-daemon")}
    assert set(daemons) == {"warmup/cuzk-daemon", "bench/cuzk-daemon", "curio/cuzk-daemon"}, children
    assert len(set(daemons.values())) == 3, daemons
    assert re.search(r"stopping warmup/cuzk-daemon \(phase attempt over\): SIGINT to process group", out)
    got = re.search(r"\[warmup/cuzk-daemon\] .*received SIGINT, shutting down gracefully", out)
    assert got and got.start() > out.index("stopping warmup/cuzk-daemon")
    assert re.search(rf"phase=warmup child=cuzk-daemon pid={daemons['warmup/cuzk-daemon']} reason=stopped "
                     r"exit_code=0", out), "the warm-up daemon should end by its SIGINT, not be killed"
    assert got.start() < out.index("started bench/cuzk-daemon"), "restart: the old daemon goes before the new one"
    assert out.index("[warmup/warmup] status:    COMPLETED") < out.index("started bench/cuzk-daemon")
    assert_all_gone([pid for _, pid in children])

    # Its PCE, extracted on a thread of the daemon's own after the proof, was waited for (settle = "cuzk-pce"):
    # the bench's daemon loads it, and extracts nothing.
    assert "phase warmup: running → settling (waiting for cuzk-daemon's PCE: its background PCE extraction for " \
           "PoRep 32G and the PCE file's save (at most settle_timeout_s=300))" in out, out[-6000:]
    complete = re.search(r"\[warmup/cuzk-daemon\] .*background PCE extraction complete", out)
    assert complete and complete.start() < out.index("stopping warmup/cuzk-daemon")
    assert "phase warmup: settling → stopping (cuzk-daemon's PCE: over)" in out
    assert re.search(r"\[bench/cuzk-daemon\] .*loaded PCE from", out)
    assert not re.search(r"\[bench/cuzk-daemon\] .*background PCE extraction starting", out)

    # The manager's setup tab starts at the supervisor's first line: role, evidence, manager, in order.
    setup = prof.manager.state.snapshot()["logs"][inst["uuid"]]["setup"]
    assert "\x1b" not in setup
    lines = setup.splitlines()
    assert lines[0].startswith("[supervisor] prover-supervisor pid "), lines[:3]
    firsts = [next(i for i, line in enumerate(lines) if key in line)
              for key in ("memory evidence:", "GPU evidence:", f"manager: {prof.manager.url}", "registered: uuid")]
    assert firsts == sorted(firsts), firsts


def test_second_start_resumes_and_rebench_runs_the_bench_again(first: FirstRun) -> None:
    prof = first.profile
    uuid = first.instance["uuid"]
    second = prof.run(name="second")
    out = second.output
    assert second.returncode == 0, out[-6000:]
    done = dict(done_phases(out))
    assert list(done) == PHASES
    for name in ("paramfetch", "warmup", "bench"):
        assert done[name].startswith("resumed:"), (name, done[name])
    assert not done["curio"].startswith("resumed"), "production always runs"
    assert f"reusing uuid {uuid}" in out
    # What the second start resumed is in the manager's setup tab, from its first line on.
    setup = prof.manager.state.snapshot()["logs"][uuid]["setup"]
    second_start = setup[setup.index(f"[supervisor] prover-supervisor pid {second.pid} "):]
    assert f"[supervisor] manager: reusing uuid {uuid}" in second_start
    assert "[supervisor] phase bench: pending → done (resumed:" in second_start, second_start[-3000:]
    assert prof.calls("/register") == first.register_calls, "a resumed start must not register again"
    assert prof.instance()["uuid"] == uuid
    assert {label for label, _ in started(out)} == {"curio/cuzk-daemon", "curio/curio"}

    third = prof.run("--rebench", name="third")
    out = third.output
    assert third.returncode == 0, out[-6000:]
    done = dict(done_phases(out))
    assert list(done) == PHASES
    assert done["paramfetch"].startswith("resumed:")
    assert done["warmup"].startswith("completed") and done["bench"].startswith("completed"), done
    labels = [label for label, _ in started(out)]
    assert labels.count("warmup/warmup") == 1 and labels.count("bench/bench") == 1, labels
    assert len(THROUGHPUT_RE.findall(out)) == 1
    assert prof.calls("/register") == first.register_calls
    assert prof.instance()["uuid"] == uuid
    assert prof.instance()["history"][-1] == "running"

    # [cuzk] changed (another bench count): what cuzk-config is made from is part of what the warm-up and the bench
    # run, as their command is; the bench of 4 proofs is not resumed for a config of 3.
    fourth = prof.run(env=prof.env(BENCH_COUNT="3"), name="fourth")
    out = fourth.output
    assert fourth.returncode == 0, out[-6000:]
    done = dict(done_phases(out))
    assert done["paramfetch"].startswith("resumed:")
    assert done["warmup"].startswith("completed") and done["bench"].startswith("completed"), done
    assert "phase bench: done before with other settings for its prepare (cuzk-config) (its config changed): " \
           "running it again" in out, out[-6000:]


# ---------------------------------------------------------------- failures


@pytest.mark.skipif(mem_total() is None or mem_total() >= 128 * GIB,  # type: ignore[operator]
                    reason="this machine has the documented 128 GiB: the default preflight passes here")
def test_default_preflight_refuses_the_warmup_on_a_small_machine(profile: Runner) -> None:
    """The documented 128 GiB is refused before the download (fitness), and the instance is given up."""
    env = profile.env()
    del env["PROVER_MIN_MEMORY"]
    run = profile.run(env=env)
    out = run.output
    assert run.returncode == EXIT_FAILURE, out[-6000:]
    line = last_failure(out, "fitness")
    assert "reason=insufficient_memory" in line and "phase warmup needs min_memory=128.0GiB" in line, line
    assert "phase paramfetch: pending → stopped" in out
    assert started(out) == [], "nothing may start on an unfit machine, the download least of all"
    assert not (profile.tmp / "params").exists()
    assert not (profile.state_dir / "cuzk.toml").exists()
    inst = profile.instance()
    assert inst["history"] == ["registered", "killed"], inst
    setup = profile.manager.state.snapshot()["logs"].get(inst["uuid"], {}).get("setup", "")
    assert "insufficient_memory" in setup and "128.0GiB" in setup, setup[-2000:]


def test_bench_with_failed_proofs_fails_and_curio_never_starts(profile: Runner) -> None:
    # The warm-up is cuzk-bench too (``single``): only the batch run gets the failing proofs.
    wrapper = profile.tmp / "failing-cuzk-bench"
    wrapper.write_text('#!/bin/sh\ncase " $* " in *" batch "*) STANDIN_BENCH_FAIL_PROOFS=2; '
                       'export STANDIN_BENCH_FAIL_PROOFS;; esac\nexec cuzk-bench "$@"\n')
    wrapper.chmod(0o755)
    run = profile.run(env=profile.env(CUZK_BENCH_BIN=str(wrapper)))
    out = run.output
    assert run.returncode == EXIT_FAILURE, out[-6000:]
    assert "[warmup/warmup] status:    COMPLETED" in out
    line = last_failure(out, "bench")
    assert "child=bench " in line and "reason=bench_failed" in line and "2 FAILED" in line, line
    assert "failed:        2" in out  # cuzk-bench itself exited 0
    assert "started curio/" not in out
    assert [name for name, _ in done_phases(out)] == ["paramfetch", "warmup"]
    inst = profile.instance()
    assert "running" not in inst["history"] and "bench_done" not in inst["history"], inst
    setup = profile.manager.state.snapshot()["logs"].get(inst["uuid"], {}).get("setup", "")
    assert "bench_failed" in setup, setup[-2000:]


# A cuzk-daemon whose process outlives its sockets once it has died: its crash reaches the bench (the connection
# breaks) before its exit reaches the supervisor, as it may in production, where a dying daemon tears down its GPU
# contexts and pinned memory. SIGINT (its stop) ends the wait at once; a daemon that ended otherwise ends so too.
SLOW_TO_DIE_DAEMON = """#!/bin/sh
trap : INT
cuzk-daemon "$@"
status=$?
[ "$status" -ne 3 ] || sleep 20
exit "$status"
"""


def test_a_bench_whose_daemon_died_mid_batch_says_it_got_no_answer(profile: Runner) -> None:
    """cuzk-bench whose daemon dies mid-batch gets no answer: it prints its error and exits 1, no summary (its
    main.rs; the stand-in once printed FAILED lines, a summary and exit 0, read as "2 FAILED"). When that exit is
    what the supervisor sees first, the verdict says the bench got no answer from the daemon, not only its status."""
    wrapper = profile.tmp / "slow-to-die-cuzk-daemon"
    wrapper.write_text(SLOW_TO_DIE_DAEMON)
    wrapper.chmod(0o755)
    env = profile.env(CUZK_DAEMON_BIN=str(wrapper), STANDIN_FAIL_CUZK_DAEMON="crash", STANDIN_FAIL_AFTER="2")
    run = profile.run(env=env, name="no-answer")
    out = run.output
    assert run.returncode == 1, out[-6000:]
    assert "[warmup/warmup] status:    COMPLETED" in out, "the warm-up's daemon proves once: it does not crash"
    fields = verdict_fields(last_failure(out, "bench"))
    assert (fields["child"], fields["reason"], fields["exit_code"]) == ("bench", "exit_code", "1"), fields
    assert fields["detail"].startswith("exited with code 1; cuzk-bench got no answer from cuzk-daemon (Error: "), fields
    assert fields["detail"].endswith("): the daemon was gone or broke the connection"), fields
    crash = out.index("[bench/cuzk-daemon] thread 'tokio-runtime-worker' panicked")
    assert out.index("[bench/bench] Error: ", crash), out[-4000:]
    assert "=== Batch Summary ===" not in out and "bench_failed" not in out, out[-4000:]
    assert [name for name, _ in done_phases(out)] == ["paramfetch", "warmup"] and "started curio/" not in out
    assert "bench_done" not in profile.instance()["history"]


def test_a_pce_extraction_past_its_settle_bound_is_cut_and_the_bench_extracts_it_again(profile: Runner) -> None:
    """The warm-up's daemon is kept after the proof for at most settle_timeout_s ($PROVER_PCE_SETTLE_S): past it,
    the daemon is stopped, the warm-up still done, and the log says what that costs."""
    run = profile.run(env=profile.env(STANDIN_PCE_S="60", PROVER_PCE_SETTLE_S="1"), name="pce-cut")
    out = run.output
    assert run.returncode == 0, out[-6000:]
    assert [name for name, _ in done_phases(out)] == PHASES, done_phases(out)
    assert "phase warmup: settling → stopping (settle_timeout_s=1 passed; cuzk-daemon's PCE cut short: the next " \
           "daemon (the bench's) extracts the PCE again on its first proof, ~14 GiB more at its peak)" in out
    assert not re.search(r"\[warmup/cuzk-daemon\] .*background PCE extraction complete", out)
    assert re.search(r"\[bench/cuzk-daemon\] .*background PCE extraction starting", out), out[-6000:]


def quiet_cuzk_profile(profile: Runner) -> Path:
    """The built-in profile as a config of its own whose cuzk.toml asks the daemons for warnings only."""
    text = (REPO / "supervisor" / "prover" / "profile.toml").read_text()
    anchor = '\npw_per_worker = "${CUZK_PW_PER_WORKER:-20GiB}"\n'
    assert text.count(anchor) == 1, "the profile's [cuzk] table moved: follow it here"
    config = profile.tmp / "profile.toml"
    config.write_text(text.replace(anchor, f'{anchor}overrides = {{ logging = {{ level = "warn" }} }}\n'))
    return config


@pytest.mark.parametrize("quiet", ["RUST_LOG", "logging.level"])
def test_a_quieter_cuzk_log_still_shows_the_warmup_its_pce_extraction(profile: Runner, quiet: str) -> None:
    """The warm-up knows of its daemon's PCE extraction only from the engine's info lines (target
    cuzk_core::engine). RUST_LOG=warn in the container, or a warn level in cuzk.toml, hid them: the warm-up stopped
    its daemon at once, the PCE lost without a word, and the bench's daemon extracted it again (~14 GiB more at a
    -j sized without it). Its level is kept elsewhere: the engine's lines alone are added to it."""
    env = profile.env(STANDIN_PCE_S="1", **({"RUST_LOG": "warn"} if quiet == "RUST_LOG" else {}))
    run = profile.run(*([quiet_cuzk_profile(profile)] if quiet == "logging.level" else []), env=env, name="quiet")
    out = run.output
    assert run.returncode == 0, out[-6000:]
    assert [name for name, _ in done_phases(out)] == PHASES, done_phases(out)
    kept = ("RUST_LOG=warn hides cuzk-daemon's PCE lines (info, cuzk_core::engine), which the warm-up waits on: the "
            "phase gets RUST_LOG=warn,cuzk_core::engine=info" if quiet == "RUST_LOG" else
            "cuzk's [logging] level 'warn' hides cuzk-daemon's PCE lines (info, cuzk_core::engine), which the warm-up "
            "waits on: cuzk.toml has 'warn,cuzk_core::engine=info'")
    assert f"phase warmup: {kept}" in out, out[-6000:]
    assert "phase warmup: running → settling (waiting for cuzk-daemon's PCE" in out, out[-6000:]
    assert "phase warmup: settling → stopping (cuzk-daemon's PCE: over)" in out
    assert re.search(r"\[bench/cuzk-daemon\] .*loaded PCE from", out) is None, "its info lines stay hidden"
    assert not re.search(r"\[bench/cuzk-daemon\] .*background PCE extraction starting", out), out[-6000:]
    assert (profile.tmp / "params" / "pce-porep-32g.bin").exists()


def test_warmup_proof_that_printed_failed_is_a_failed_warmup(profile: Runner) -> None:
    """``cuzk-bench single`` exits 0 whatever its proof's status: the printed status decides."""
    wrapper = profile.tmp / "failing-single"
    wrapper.write_text('#!/bin/sh\ncase " $* " in *" single "*) STANDIN_BENCH_FAIL_PROOFS=1; '
                       'export STANDIN_BENCH_FAIL_PROOFS;; esac\nexec cuzk-bench "$@"\n')
    wrapper.chmod(0o755)
    run = profile.run(env=profile.env(CUZK_BENCH_BIN=str(wrapper)))
    out = run.output
    assert run.returncode == EXIT_FAILURE, out[-6000:]
    assert "[warmup/warmup] status:    FAILED" in out
    line = last_failure(out, "warmup")
    assert "child=warmup " in line and "reason=bench_failed" in line and "warm-up proof failed" in line, line
    assert "started bench/" not in out and "started curio/" not in out
    assert [name for name, _ in done_phases(out)] == ["paramfetch"]
    inst = profile.instance()
    assert inst["history"][:2] == ["registered", "params_done"] and "running" not in inst["history"], inst
    setup = profile.manager.state.snapshot()["logs"].get(inst["uuid"], {}).get("setup", "")
    assert "warm-up proof failed" in setup, setup[-2000:]


# ---------------------------------------------------------------- a Feb-2026 (partition-workers) image


def test_feb_2026_daemon_without_a_status_api_reaches_production(profile: Runner) -> None:
    """The seeds' image: cuzk-daemon has only its listen port (no /status) and obeys partition_workers.
    Ready is its listen port accepting; pw is sized on this machine's memory with the lowered figures,
    and the stand-in would SIGKILL itself (as the OOM killer did) were that pw's peak above MemTotal."""
    env = profile.env(CUZK_MEMORY_MODEL="partition-workers", CUZK_PW_BASELINE="1GiB", CUZK_PW_PER_WORKER="512MiB",
                      STANDIN_CUZK_GENERATION="feb-2026", STANDIN_PW_BASELINE="1GiB",
                      STANDIN_PW_PER_WORKER="512MiB", STANDIN_DAEMON_MEMORY=str(mem_total()))
    run = profile.run(env=env, name="feb-2026")
    out = run.output
    assert run.returncode == 0, out[-6000:]
    assert [name for name, _ in done_phases(out)] == PHASES, done_phases(out)
    assert profile.instance()["history"] == STATES

    status_port = env["CUZK_STATUS_PORT"]
    assert "status service listening" not in out, "a Feb-2026 daemon has no status API"
    # ... so production reads curio's metrics alone (read, cuzk's /status was a source blind for good).
    assert re.search(r"production watch: every \S+ on phase curio \(no cuzk status; curio http://", out), out[-4000:]
    assert f"proving service listening on 127.0.0.1:{env['CUZK_PORT']}" in out
    for daemon in ("warmup", "bench", "curio"):
        assert re.search(rf"{daemon}/cuzk-daemon is ready \(.*127\.0\.0\.1:{status_port}/status or "
                         rf"tcp://127\.0\.0\.1:{env['CUZK_PORT']}\)", out), f"{daemon}:\n{out[-4000:]}"

    written = tomllib.loads((profile.state_dir / "cuzk.toml").read_text())
    pw = written["synthesis"]["partition_workers"]
    assert pw >= 1 and "total_budget" in written["memory"], written  # one file for both generations
    budget = parse_size(written["memory"]["total_budget"])
    # The peak fits the budget (written in whole MiB), one worker more would not.
    worker, mib = 512 << 20, 1 << 20
    assert GIB + pw * worker <= budget + mib and budget < GIB + (pw + 1) * worker + mib, (pw, budget)
    assert f"synthesis: partition_workers={pw} " in out
    assert re.search(rf"phase warmup: wrote .*{pw} partition_workers", out), out[-4000:]


# ---------------------------------------------------------------- cuzk-daemon's real SIGINT


def short_grace_profile(profile: Runner, grace_s: float) -> Path:
    """The built-in profile as a config of its own (--config: the prover plugin all the same), whose children's
    stop grace is ``grace_s`` instead of 30 s."""
    text = (REPO / "supervisor" / "prover" / "profile.toml").read_text()
    assert text.count("\nstop_grace_s = 30\n") == 1, "the profile's [supervisor] grace moved: follow it here"
    config = profile.tmp / "profile.toml"
    config.write_text(text.replace("\nstop_grace_s = 30\n", f"\nstop_grace_s = {grace_s:g}\n"))
    return config


def test_a_daemon_that_serves_on_after_sigint_is_sigkilled_and_its_phase_is_still_done(profile: Runner) -> None:
    """The real cuzk-daemon on SIGINT logs two lines, stops its engine and serves on until SIGKILL (cuzk-daemon
    main.rs: no shutdown signal wired to Server::serve; the stand-in's STANDIN_CUZK_SIGINT=serve-on). So every
    phase's end SIGKILLs its daemon after the stop grace: the phase is done all the same, the daemon's verdict
    says it was stopped, by the supervisor's SIGKILL, and the next phase's daemon binds the same ports."""
    env = profile.env(STANDIN_CUZK_SIGINT="serve-on")
    run = profile.run(short_grace_profile(profile, 1), env=env, name="serve-on")
    out = run.output
    assert run.returncode == 0, out[-6000:]
    assert [name for name, _ in done_phases(out)] == PHASES, done_phases(out)
    assert verdict_lines(out, kind="FAILED") == [], out[-6000:]
    assert profile.instance()["history"] == STATES
    listen = f"proving service listening on 127.0.0.1:{env['CUZK_PORT']}"
    status = f"status service listening on 127.0.0.1:{env['CUZK_STATUS_PORT']}"
    for phase, after in (("warmup", "bench"), ("bench", "curio"), ("curio", None)):
        daemon = f"{phase}/cuzk-daemon"
        stopping = first_line(out, f"stopping {daemon} (phase attempt over): SIGINT to process group")
        assert re.search(rf"\[{daemon}\] .*cuzk_daemon.* received SIGINT, shutting down$", out, re.M), daemon
        assert re.search(rf"\[{daemon}\] .*cuzk_core::engine.* shutting down cuzk engine$", out, re.M), daemon
        killed = first_line(out, f"{daemon}: still running after 1s grace: SIGKILL to process group")
        assert 0.9 <= seconds_between(stopping, killed) < 3, (stopping, killed)
        fields = verdict_fields(one_verdict(out, phase, "cuzk-daemon", "ended"))
        assert (fields["reason"], fields["signal"]) == ("stopped", "SIGKILL"), fields
        assert fields["detail"] == "phase attempt over; killed by the supervisor's SIGKILL (status 137)", fields
        assert "exit_code" not in fields
        assert re.search(rf"phase {phase}: stopping → done \(", out), out[-4000:]
        if after is not None:  # its ports, free again at once: the next daemon binds them and is ready
            bound = out.index(f"[{after}/cuzk-daemon] ", out.index(killed))
            assert out.index(listen, bound) < out.index(f"{after}/cuzk-daemon is ready ("), after
            assert out.index(status, bound) < out.index(f"{after}/cuzk-daemon is ready ("), after
    assert "failed to bind" not in out and "port_in_use" not in out
    assert_all_gone([pid for _, pid in started(out)])


# ---------------------------------------------------------------- curio's clean exit


def test_a_curio_that_exits_cleanly_is_restarted(profile: Runner) -> None:
    """With restart = "on-failure" a clean curio exit (curio cli stop, a SIGTERM not the supervisor's) ended the
    lifecycle as completed, exit 0, the manager's row left running while nothing proved. The profile restarts
    curio whatever its exit, as curio's own systemd unit does; the manager hears each restart in its setup log."""
    env = profile.env(STANDIN_RUN_SECONDS="1", PROVER_CURIO_RESTART=None)  # (the profile's own policy)
    proc, console = profile.start_to_file(env=env, name="always")
    wait_for(lambda: read(console).count("phase curio: service is up") >= 2 or proc.poll() is not None, 40, 0.1)
    out = read(console)
    assert proc.poll() is None, out[-6000:]
    assert "phase curio: stopping → backoff (exit_code; restart = 'always'; backoff " in out, out[-6000:]
    assert "lifecycle complete" not in out and "production is over" not in out
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM, read(console)[-6000:]  # (stopped, as docker stop stops it)
    assert profile.instance()["history"] == STATES  # (still proving when stopped: nothing given up)
    assert profile.manager is not None
    setup = profile.manager.state.snapshot()["logs"][profile.instance()["uuid"]]["setup"]
    assert "phase curio: stopping → backoff (exit_code; restart = 'always'" in setup


def test_production_that_ends_cleanly_unrestarted_is_said_to_the_manager(first: FirstRun) -> None:
    """restart = "on-failure" (the tests' runs, where the stand-in curio ends after STANDIN_RUN_SECONDS): its clean
    end completes the lifecycle, and the manager, whose row says running, hears that nothing proves any more."""
    said = ("manager: production is over: phase curio: service ended cleanly (restart = 'on-failure'); this instance "
            "proves no more, and the manager's row still says running")
    assert said in first.run.output
    assert first.run.output.index(said) < first.run.output.index("lifecycle complete")
    assert first.instance["history"] == STATES


# ---------------------------------------------------------------- the onstart lock


def test_second_supervisor_on_the_same_state_dir_exits_75_and_starts_nothing(profile: Runner) -> None:
    env = profile.env(STANDIN_RUN_SECONDS="3")
    first, console = profile.start_to_file(env=env, name="first")
    wait_for(lambda: "phase warmup: pending → starting" in read(console) or first.poll() is not None, 20, 0.05)
    assert first.poll() is None, read(console)

    second = subprocess.run([PY, "-m", "supervisor", "run"], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=20)
    lines = (second.stdout + second.stderr).splitlines()
    assert second.returncode == EXIT_ALREADY_RUNNING, lines
    assert len(lines) == 1, lines
    assert f"pid {first.pid}" in lines[0] and str(profile.state_dir) in lines[0], lines
    assert first.poll() is None, "the first supervisor must be left alone"

    first.wait(40)
    out = read(console)
    assert first.returncode == 0, out[-6000:]
    assert profile.calls("/register") == 1, "the refused start must not register"
    log = (profile.log_dir / "supervisor.log").read_text(errors="replace")
    assert log.count("prover-supervisor pid ") == 1, "the refused start wrote to the log"
    assert [name for name, _ in done_phases(out)] == PHASES

    # Once the first has exited, a new start takes the lock and works.
    again = profile.run(name="again")
    assert again.returncode == 0, again.output[-6000:]
    assert f"prover-supervisor pid {again.pid} " in again.output
    assert profile.calls("/register") == 1


# ---------------------------------------------------------------- SIGHUP under nohup


HUP_CHILD = """
import signal, sys, time
def hup(*_):
    print("work got SIGHUP", flush=True)
    sys.exit(0)
signal.signal(signal.SIGHUP, hup)
print("work ready", flush=True)
time.sleep(2.5)
print("work finished", flush=True)
"""


def _hup_config(sup: Runner) -> Path:
    return sup.write(f"""
        [[phases]]
        name = "work"
        command = {pyc(HUP_CHILD)}
        """, stop_grace_s=2)


def _start_hup(sup: Runner, config: Path, name: str, nohup: bool) -> tuple[subprocess.Popen[bytes], Path]:
    console = sup.tmp / f"{name}.txt"
    # Either way set, never inherited: the suite itself may run under nohup.
    ignore_hup = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else hup_as_default
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP_PREFIXES)}
    with open(console, "wb") as out:
        proc = subprocess.Popen(sup.argv(config), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                preexec_fn=ignore_hup, start_new_session=True)
    sup.procs.append(proc)  # type: ignore[arg-type]
    wait_for(lambda: "[work/work] work ready" in read(console) or proc.poll() is not None, 15, 0.02)
    assert proc.poll() is None, read(console)
    return proc, console


def test_sighup_under_nohup_is_neither_forwarded_nor_fatal(sup: Runner) -> None:
    config = _hup_config(sup)
    proc, console = _start_hup(sup, config, "nohup", nohup=True)
    os.kill(proc.pid, signal.SIGHUP)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGHUP)
    time.sleep(0.3)
    assert proc.poll() is None, f"SIGHUP stopped the supervisor under nohup:\n{read(console)}"
    proc.wait(20)
    out = read(console)
    assert proc.returncode == 0, out
    assert "[work/work] work got SIGHUP" not in out and "SIGHUP forwarded" not in out, out
    assert "[work/work] work finished" in out

    # Control, same config without nohup: the same signal is forwarded to the phase's command.
    proc, console = _start_hup(sup, config, "control", nohup=False)
    os.kill(proc.pid, signal.SIGHUP)
    proc.wait(20)
    out = read(console)
    assert "SIGHUP forwarded to work/work" in out and "[work/work] work got SIGHUP" in out, out
    assert "[work/work] work finished" not in out


# ---------------------------------------------------------------- docker/entrypoint.sh


OPT_PYTHON = "/opt/prover-supervisor/bin/python"
OPT_ENTRYPOINT = "/opt/prover-supervisor/entrypoint.py"


@pytest.fixture
def shim(tmp_path: Path) -> Path:
    original = REPO / "docker" / "entrypoint.sh"
    # It is part of the project (the image's ENTRYPOINT): a missing one is a failure, not a reason to skip.
    assert original.is_file(), f"{original} is missing: the image's entrypoint shim is part of the project"
    text = original.read_text()
    assert OPT_PYTHON in text and "exec " in text, text
    if Path(OPT_PYTHON).exists() and Path(OPT_ENTRYPOINT).exists():
        return original
    copy = tmp_path / "entrypoint.sh"
    copy.write_text(text.replace(OPT_PYTHON, PY).replace(OPT_ENTRYPOINT, str(REPO / "entrypoint.py")))
    copy.chmod(0o755)
    return copy


def _shim_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(DROP_PREFIXES)}


def test_entrypoint_shim_passes_arguments(shim: Path, tmp_path: Path) -> None:
    from supervisor import __version__

    version = subprocess.run(["sh", str(shim), "--version"], capture_output=True, text=True, timeout=30,
                             cwd=tmp_path, env=_shim_env())
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"prover-supervisor {__version__}"

    profile_path = REPO / "supervisor" / "prover" / "profile.toml"
    check = subprocess.run(["sh", str(shim), "check", "--config", str(profile_path)], capture_output=True,
                           text=True, timeout=30, cwd=tmp_path, env=_shim_env())
    assert check.returncode == 0, check.stderr
    assert "ok: 4 phase(s): paramfetch (oneshot), warmup (oneshot), bench (oneshot), curio (service)" in check.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text("[[phases]]\nname = \"x\"\ncommand = [\"true\"]\nretries = -1\n")
    refused = subprocess.run(["sh", str(shim), "check", "--config", str(bad)], capture_output=True, text=True,
                             timeout=30, cwd=tmp_path, env=_shim_env())
    assert refused.returncode == EXIT_CONFIG_ERROR and "retries" in refused.stderr, refused


def test_entrypoint_shim_execs_and_defaults_to_run(shim: Path, sup: Runner) -> None:
    config = sup.write("""
        [[phases]]
        name = "whoami"
        command = ["sh", "-c", "echo parent=$$PPID; exit 3"]
        """)
    console = sup.tmp / "shim.txt"
    with open(console, "wb") as out:
        proc = subprocess.Popen(["sh", str(shim)], stdout=out, stderr=subprocess.STDOUT, cwd=sup.tmp,
                                env={**_shim_env(), "SUPERVISOR_CONFIG": str(config)}, start_new_session=True)
    sup.procs.append(proc)  # type: ignore[arg-type]
    proc.wait(30)
    text = read(console)
    # No shell stays in between: the shim's pid became the supervisor's, and its status is the child's.
    assert f"prover-supervisor pid {proc.pid} " in text, text
    assert f"parent={proc.pid}" in text, text
    assert f"config: {config}" in text, "no arguments: it must default to `run` (config from $SUPERVISOR_CONFIG)"
    assert proc.returncode == 3, text
