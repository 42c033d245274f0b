"""The prover's phase hooks (prover/hooks.py): ``prepare = "cuzk-config"`` run in-process on a real temp dir,
and the parse kinds it registers.

Promises: before an attempt, cuzk.toml sized for the memory the phase may have is written (and a copy kept in
state_dir), each of its lines logged, and the cuzk processes told where it is (CUZK_CONFIG, CUZK_ADDR,
CUZK_STATUS_LISTEN, CUZK_BENCH_CONCURRENCY); a machine too small is an insufficient_memory refusal, a file that
cannot be written a spawn_failed one, never an exception; the plan's [cuzk] is required.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_plan
from supervisor.evidence.gpu import GpuSample
from supervisor.lifecycle import verdict as v
from supervisor.lifecycle.hooks import HookContext, OutputLife, Refusal
from supervisor.lifecycle.resume import prepared_digest, what_it_runs
from supervisor.lifecycle.verdict import Verdict
from supervisor.plugin import hooks_for
from supervisor.prover import hooks
from supervisor.prover.bench import BenchParser, BenchResult, SingleProofParser
from supervisor.prover.cuzkconf import CuzkSettings
from supervisor.prover.fetchlines import FetchParser
from supervisor.prover.plugin import PLUGIN
from supervisor.prover.reasons import BENCH_FAILED

GIB = 1 << 30


def context(tmp_path: Path, memory: int | None, lines: list[str]) -> HookContext:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return HookContext(phase="cuzk", memory_available=memory, gpus=(), state_dir=state, log=lines.append)


def test_cuzk_config_writes_the_file_logs_it_and_tells_the_children(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUST_LOG", raising=False)
    target = tmp_path / "etc" / "cuzk.toml"
    settings = CuzkSettings(config_path=str(target), listen="unix:///run/cuzk.sock", status_listen="")
    lines: list[str] = []
    env = hooks.cuzk_config(settings)(context(tmp_path, 512 * GIB, lines))
    assert not isinstance(env, Refusal)
    written = target.read_text()
    assert (tmp_path / "state" / "cuzk.generated.toml").read_text() == written
    parsed = tomllib.loads(written)
    assert parsed["daemon"]["listen"] == "unix:///run/cuzk.sock"
    assert env["CUZK_CONFIG"] == str(target) and env["CUZK_ADDR"] == "unix:///run/cuzk.sock"
    assert env["CURIO_CUZK_ADDRESS"] == "unix:///run/cuzk.sock"
    assert env["CUZK_STATUS_LISTEN"] == "" and int(env["CUZK_BENCH_CONCURRENCY"]) >= 1
    # cuzk.toml names GPUs by NVML's index (PCI bus order); CUDA, told one as CUDA_VISIBLE_DEVICES, must count alike.
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # Every variable it sets is registered (Plugin.prepare_env), so that a phase's env may not set it in its place;
    # RUST_LOG only where the inherited one hides the daemon's PCE lines (the next test).
    assert env.keys() == hooks.CUZK_CONFIG_ENV.keys() - {"RUST_LOG"}
    assert hooks.CUZK_CONFIG_ENV.keys() == PLUGIN.prepare_env[hooks.CUZK_CONFIG].keys()
    assert lines[0].startswith(f"phase cuzk: wrote {target}: budget ")
    body = [line.removeprefix("  cuzk.toml | ") for line in lines[1:]]
    assert all(line.startswith("  cuzk.toml | ") for line in lines[1:])
    assert body == [line for line in written.splitlines() if line]  # every line but the blank ones


def test_cuzk_config_adds_the_pce_lines_to_a_rust_log_that_hides_them(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """RUST_LOG wins over cuzk.toml's level in cuzk-daemon: an inherited RUST_LOG=warn hid the engine's PCE lines the
    warm-up waits on. Its phase gets it back with those lines; one that shows them already is left as it is."""
    prepare = hooks.cuzk_config(CuzkSettings(config_path=str(tmp_path / "cuzk.toml")))
    monkeypatch.setenv("RUST_LOG", "warn,cuzk_bench=debug")
    lines: list[str] = []
    env = prepare(context(tmp_path, 512 * GIB, lines))
    assert not isinstance(env, Refusal)
    assert env["RUST_LOG"] == "warn,cuzk_bench=debug,cuzk_core::engine=info"
    assert ("phase cuzk: RUST_LOG=warn,cuzk_bench=debug hides cuzk-daemon's PCE lines (info, cuzk_core::engine), "
            "which the warm-up waits on: the phase gets RUST_LOG=warn,cuzk_bench=debug,cuzk_core::engine=info") in lines
    monkeypatch.setenv("RUST_LOG", "info")
    env = prepare(context(tmp_path, 512 * GIB, lines := []))
    assert not isinstance(env, Refusal) and "RUST_LOG" not in env
    assert not any("hides" in line for line in lines), lines


@pytest.mark.parametrize(("read", "said"), [((0,), "cuzk runs without them"),
                                            ((), "it names no GPU, cuzk-daemon picks its own")])
def test_cuzk_config_says_each_gpu_it_leaves_out_and_why(tmp_path: Path, read: tuple[int, ...], said: str) -> None:
    # A GPU NVML counts that the reading lacks (gone, or unreadable twice in a row) was left out of [gpus] devices
    # for the whole run without a word.
    target = tmp_path / "cuzk.toml"
    lines: list[str] = []
    ctx = replace(context(tmp_path, 512 * GIB, lines), gpus=tuple(GpuSample(i, "NVIDIA H200", 0, 0, GIB) for i in read),
                  gpus_left_out=((1, "unreadable: NVMLError_Timeout: Timeout"), (2, "no handle: NVMLError_GpuIsLost")))
    assert not isinstance(hooks.cuzk_config(CuzkSettings(config_path=str(target)))(ctx), Refusal)
    assert tomllib.loads(target.read_text()).get("gpus", {}).get("devices") == ([0] if read else None)
    assert ("phase cuzk: cuzk.toml leaves out GPU 1 (unreadable: NVMLError_Timeout: Timeout), GPU 2 (no handle: "
            f"NVMLError_GpuIsLost): {said}") in lines, lines


def test_cuzk_config_on_a_machine_too_small_is_an_insufficient_memory_refusal(tmp_path: Path) -> None:
    target = tmp_path / "cuzk.toml"
    prepare = hooks.cuzk_config(CuzkSettings(config_path=str(target)))
    for memory in (10 * GIB, None):  # None: nothing known of the phase's memory
        lines: list[str] = []
        refusal = prepare(context(tmp_path, memory, lines))
        assert isinstance(refusal, Refusal) and refusal.reason == v.INSUFFICIENT_MEMORY
        assert "cuzk needs at least" in refusal.detail
        assert lines == [] and not target.exists()


def test_cuzk_config_that_cannot_be_written_is_a_spawn_failed_refusal(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocker = tmp_path / "a-file"  # root writes anywhere: a path through a plain file fails for everyone
        blocker.write_text("")
        target = blocker / "cuzk.toml"
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        target = ro / "cuzk.toml"
    lines: list[str] = []
    refusal = hooks.cuzk_config(CuzkSettings(config_path=str(target)))(context(tmp_path, 512 * GIB, lines))
    assert isinstance(refusal, Refusal) and refusal.reason == v.SPAWN_FAILED
    assert refusal.detail.startswith(f"cannot write {target}: ")
    assert lines == []


def test_cuzk_config_rewrites_for_each_attempts_memory(tmp_path: Path) -> None:
    target = tmp_path / "cuzk.toml"
    prepare = hooks.cuzk_config(CuzkSettings(config_path=str(target)))
    assert not isinstance(prepare(context(tmp_path, 512 * GIB, [])), Refusal)
    big = tomllib.loads(target.read_text())
    assert not isinstance(prepare(context(tmp_path, 200 * GIB, [])), Refusal)
    small = tomllib.loads(target.read_text())
    assert big != small  # sized again for what the phase may have now


def test_make_cuzk_config_needs_the_plans_cuzk_table() -> None:
    from types import SimpleNamespace

    with pytest.raises(ConfigError, match=r'"cuzk-config" needs a \[cuzk\] table'):
        hooks.make_cuzk_config(SimpleNamespace(sections={}))  # type: ignore[arg-type]
    assert callable(hooks.make_cuzk_config(SimpleNamespace(  # type: ignore[arg-type]
        sections={"cuzk": CuzkSettings(config_path="/x")})))


def exited_0(phase: str) -> Verdict:
    return Verdict(phase=phase, child="cmd", pid=1, reason=v.EXIT_CODE, success=True, status=0, detail="exit 0")


@pytest.mark.parametrize("knob", [{"BENCH_COUNT": "3"}, {"BENCH_C1": "/data/zk/other.json"},
                                  {"BENCH_CONCURRENCY": "1"}, {"CUZK_MEMORY_MODEL": "partition-workers"},
                                  {"CUZK_SAFETY_MARGIN": "20GiB"}], ids=lambda knob: next(iter(knob)))
def test_what_the_profiles_bench_runs_changes_with_its_cuzk_settings(knob: dict[str, str]) -> None:
    """The bench's command names only $CUZK_BENCH_COUNT, $CUZK_BENCH_C1 and cuzk.toml's path: the digest of it
    alone was the same whatever [cuzk] said, and a bench passed on 12 proofs was resumed on a config of 3 (its rate
    reported for a run never made). What cuzk-config is made from is part of what the warm-up and the bench run."""
    environ = {"SUPERVISOR_STATE_DIR": "/var/lib/prover-supervisor"}

    def ran(env: dict[str, str]) -> dict[str, tuple[str, str | None]]:
        plan = load_plan(None, PLUGIN, env)
        of = hooks_for(PLUGIN, plan)
        return {p.name: (what_it_runs(p), prepared_digest(of(p).prepared_from)) for p in plan.phases}

    plain, changed = ran(environ), ran({**environ, **knob})
    assert plain["bench"][1] is not None and plain["bench"][1] != changed["bench"][1], (plain, changed)
    assert plain["warmup"][1] != changed["warmup"][1]
    assert plain["paramfetch"] == changed["paramfetch"]  # (no prepare: what it runs is its command alone)
    assert ran(environ) == plain  # (the same settings, the same digest)
    # Where the daemon listens is no setting of what it proves: a start on other ports resumes.
    assert ran({**environ, "CUZK_PORT": "9920", "CUZK_STATUS_PORT": "9921"}) == plain


def test_a_bench_that_exits_0_without_its_summary_fails_as_bench_failed() -> None:
    hook = hooks.PARSERS["cuzk-bench"]
    parser = hook.new_parser()
    assert isinstance(parser, BenchParser)
    parser.feed([b"[1/2] porep proof FAILED \xe2\x80\x94 something"])
    judged = hook.judge(exited_0("bench"), parser.result, lambda line: None)
    assert (judged.success, judged.reason, judged.status) == (False, BENCH_FAILED, 1)
    assert judged.detail.startswith("bench failed: no '=== Batch Summary ===' in cuzk-bench's output")


# What cuzk-bench prints on stderr when a proof got no answer (its daemon died mid-proof): Rust's ``Error: {:?}``.
NO_ANSWER = [b"Error: Prove RPC failed", b"", b"Caused by:",
             b'    0: status: Unknown, message: "transport error", details: [], metadata: MetadataMap { headers: {} }',
             b"    1: transport error", b"    2: Connection reset by peer (os error 104)"]


@pytest.mark.parametrize("kind", ["cuzk-bench", "cuzk-single"])
def test_a_bench_that_exits_1_without_an_answer_says_its_daemon_gave_none(kind: str) -> None:
    """Exit 1 is the bench's own reason (exit_code), but "exited with code 1" alone does not say why: its
    ``Error:`` line does. (The parsers once ignored it: the verdict said only the status.)"""
    hook = hooks.PARSERS[kind]
    parser = hook.new_parser()
    parser.feed([b"=== Batch Benchmark ===", b"count:       4", b"", *NO_ANSWER])
    exited_1 = Verdict(phase="bench", child="cmd", pid=1, reason=v.EXIT_CODE, success=False, status=1,
                       detail="exited with code 1")
    judged = hook.judge(exited_1, parser.result, lambda line: None)
    assert (judged.success, judged.reason, judged.status) == (False, v.EXIT_CODE, 1)
    assert judged.detail == ("exited with code 1; cuzk-bench got no answer from cuzk-daemon (Error: Prove RPC "
                             "failed): the daemon was gone or broke the connection"), judged.detail
    killed = Verdict(phase="bench", child="cmd", pid=1, reason=v.SIGNAL, success=False, status=137,
                     detail="killed by SIGKILL")
    assert hook.judge(killed, parser.result, lambda line: None) == killed, "only its own exit is explained so"


def test_a_fetch_that_exits_0_passes_whatever_its_lines_said() -> None:
    hook = hooks.PARSERS["paramfetch"]
    parser = hook.new_parser()
    # (read through the core's OutputLife, which tells the stall watch which of its output was life)
    assert isinstance(parser, OutputLife) and isinstance(parser.parser, FetchParser)
    parser.feed([b"12/01 14:44:00 [ERROR] CUID#7 - Download aborted. URI=http://x",
                 b"12/01 14:44:01 [NOTICE] Download complete: /p/a.params"])
    said: list[str] = []
    judged = hook.judge(exited_0("fetch"), parser.result, said.append)
    assert judged.success
    assert said == ["phase fetch: parameter fetch passed: 1 file(s) complete, 0 bytes downloaded, "
                    "last error: CUID#7 - Download aborted. URI=http://x"]


def test_the_single_proof_kind_is_its_own_parser_and_a_resumed_bench_gets_its_result_back() -> None:
    assert set(hooks.PARSERS) == {"cuzk-bench", "cuzk-single", "paramfetch"}
    assert isinstance(hooks.PARSERS["cuzk-single"].new_parser(), SingleProofParser)
    assert hooks.PARSERS["cuzk-single"].fact is None  # a warm-up proof keeps nothing for the next start
    bench = hooks.PARSERS["cuzk-bench"]
    assert bench.fact == "bench" and bench.restore is not None
    restored = bench.restore({"proofs": {"COMPLETED": 3}, "expected": 3, "summary_seen": True})
    assert restored == BenchResult(proofs={"COMPLETED": 3}, expected=3, summary_seen=True)


@pytest.mark.parametrize(("listen", "status", "daemon", "bench", "curio"), [
    # (the daemon's own form, as the profile writes it)
    ("127.0.0.1:9820", "127.0.0.1:9821", "127.0.0.1:9820", "http://127.0.0.1:9820", "127.0.0.1:9820"),
    # (a URL: the daemon would refuse it, "invalid listen address", and its status task cannot bind one)
    ("http://127.0.0.1:9820/", "http://127.0.0.1:9821/", "127.0.0.1:9820", "http://127.0.0.1:9820",
     "127.0.0.1:9820"),
    # (every address: the clients on this machine reach it on loopback)
    ("0.0.0.0:9820", "0.0.0.0:9821", "0.0.0.0:9820", "http://127.0.0.1:9820", "127.0.0.1:9820"),
    ("[::1]:9820", "[::1]:9821", "[::1]:9820", "http://[::1]:9820", "[::1]:9820"),
    ("http://[::]:9820", "", "[::]:9820", "http://127.0.0.1:9820", "127.0.0.1:9820"),
])
def test_each_reader_of_the_daemon_address_gets_its_own_form(tmp_path: Path, listen: str, status: str, daemon: str,
                                                             bench: str, curio: str) -> None:
    """cuzk-daemon binds a Rust SocketAddr (``http://`` ends it at start), cuzk-bench's ``-a`` is a URI that needs
    its scheme, curio's [Cuzk] Address is host:port (curio dials ``dns:///`` + it): one [cuzk] listen, three forms."""
    target = tmp_path / "cuzk.toml"
    settings = CuzkSettings(config_path=str(target), listen=listen, status_listen=status)
    env = hooks.cuzk_config(settings)(context(tmp_path, 512 * GIB, []))
    assert not isinstance(env, Refusal)
    written = tomllib.loads(target.read_text())["daemon"]
    assert written == {"listen": daemon, "status_listen": status.removeprefix("http://").rstrip("/")}
    assert (env["CUZK_ADDR"], env["CURIO_CUZK_ADDRESS"]) == (bench, curio)
    assert env["CUZK_STATUS_LISTEN"] == written["status_listen"]


# ---------------------------------------------------------------- settle = "cuzk-pce": the warm-up's daemon kept

def daemon_line(target: str, message: str) -> bytes:
    """A line as cuzk-daemon's tracing prints it: coloured, a timestamp, the level, the target."""
    return (f"\x1b[2m2026-12-04T18:00:00.000Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2m{target}\x1b[0m\x1b[2m:\x1b[0m "
            f"{message}").encode()


def test_the_pce_watch_waits_from_the_extractions_start_to_its_end() -> None:
    watch = hooks.PCE_HOOK.new_watch()
    assert watch.pending() is None  # nothing started: a daemon that loaded its PCE is stopped at once
    watch.feed([daemon_line("cuzk_core::engine", "received proof job=1"),
                daemon_line("cuzk_core::engine", "background PCE extraction starting for PoRep 32G")])
    assert watch.pending() == "its background PCE extraction for PoRep 32G and the PCE file's save"
    # The extraction's own end and the save are not the thread's end: the PCE is cached after them.
    watch.feed([daemon_line("cuzk_core::pipeline", "PCE extraction complete circuit_id=porep-32g extract_ms=47000"),
                daemon_line("cuzk_pce::disk", "PCE saved to disk (raw format) path=/p/pce-porep-32g.bin")])
    assert watch.pending() is not None
    watch.feed([daemon_line("cuzk_core::engine", "background PCE extraction complete")])
    assert watch.pending() is None


@pytest.mark.parametrize("end", ["background PCE extraction complete for PoRep 32G",
                                 "background PCE extraction failed error=out of budget",
                                 "background PCE extraction failed for PoRep 32G (non-fatal) error=x"])
def test_each_way_the_real_engine_ends_an_extraction_ends_the_wait(end: str) -> None:
    watch = hooks.PCE_HOOK.new_watch()
    watch.feed([b"background PCE extraction starting for PoRep 32G", b"background PCE extraction starting for "
                b"WindowPoSt"])
    assert watch.pending() == ("its background PCE extraction for PoRep 32G, WindowPoSt and the PCE file's save")
    watch.feed([end.encode()])
    assert watch.pending() == "its background PCE extraction for WindowPoSt and the PCE file's save"
    watch.feed([b"background PCE extraction complete for WindowPoSt"])
    assert watch.pending() is None
    watch.feed([b"background PCE extraction complete"])  # (an end with none started: nothing to take off)
    assert watch.pending() is None


def test_an_end_that_names_its_circuit_ends_that_one() -> None:
    watch = hooks.PCE_HOOK.new_watch()
    watch.feed([b"background PCE extraction starting for PoRep 32G",
                b"background PCE extraction starting for WindowPoSt",
                b"background PCE extraction complete for WindowPoSt"])
    assert watch.pending() == "its background PCE extraction for PoRep 32G and the PCE file's save"



def test_a_failure_that_names_its_circuit_before_its_fields_ends_that_one() -> None:
    # cuzk-core engine.rs: warn!(error = %e, "background PCE extraction failed for SnapDeals"), which tracing prints
    # with its fields after the message: the name read "SnapDeals error=...", matched none, and PoRep's ended.
    watch = hooks.PCE_HOOK.new_watch()
    watch.feed([b"\x1b[2m2026-12-07T10:00:00Z\x1b[0m \x1b[32m INFO\x1b[0m cuzk_core::engine: background PCE extraction "
                b"starting for PoRep 32G",
                b"background PCE extraction starting for SnapDeals",
                b"\x1b[33m WARN\x1b[0m cuzk_core::engine: background PCE extraction failed for SnapDeals "
                b"\x1b[3merror\x1b[0m\x1b[2m=\x1b[0mout of memory"])
    assert watch.pending() == "its background PCE extraction for PoRep 32G and the PCE file's save"
