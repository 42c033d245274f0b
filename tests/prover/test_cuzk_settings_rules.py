"""The stand-in cuzk-daemon's configuration (standins/cuzk_settings.py), read in-process.

tests/prover/test_standins.py runs the daemon on configs that stop it at start (what it logs, exit 1); these
cover what ``settings`` makes of a config that starts: which listen wins, a disabled or absent status API, where
the parameter cache is, the GPU workers' fallbacks, what each generation does with the memory keys, and the
log's level and filtering.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from supervisor.prover.standins import cuzk_generations as generations
from supervisor.prover.standins import cuzk_settings as cs

GIB = 1024**3


class Said:
    """A Log that keeps (level, msg) pairs instead of printing them."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, level: str, msg: str, target: str = "cuzk_daemon") -> None:
        self.lines.append((level, msg))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FIL_PROOFS_PARAMETER_CACHE", "STANDIN_DAEMON_MIN_BUDGET",
                 "STANDIN_PW_BASELINE", "STANDIN_PW_PER_WORKER"):
        monkeypatch.delenv(name, raising=False)


def unified(cfg: dict[str, Any], listen_flag: str | None = None) -> tuple[cs.Settings, Said]:
    log = Said()
    cfg = {"memory": {"total_budget": "100GiB"}} | cfg
    return cs.settings(cfg, listen_flag, generations.UNIFIED_GENERATION, log), log  # type: ignore[arg-type]


def test_defaults_of_an_empty_config() -> None:
    """The real daemon's (cuzk-core config.rs): a unix socket, and no status API."""
    found, log = unified({})
    assert found.listen == ("unix", "/run/curio/cuzk.sock") and found.listen_text == cs.DEFAULT_LISTEN
    assert found.status_listen is None
    assert found.param_cache == cs.DEFAULT_CACHE
    assert (found.devices, found.workers_per_device, found.gpu_workers) == ([0], 2, 2)
    assert found.synthesis_concurrency == 1
    assert found.budget == 100 * GIB and found.pw is None
    assert log.lines == [("info", "memory budget: 100.00 GiB (configured)")]


def test_the_listen_flag_wins_over_the_config() -> None:
    found, _ = unified({"daemon": {"listen": "127.0.0.1:7000"}}, listen_flag="unix:///run/cuzk.sock")
    assert found.listen == ("unix", "/run/cuzk.sock") and found.listen_text == "unix:///run/cuzk.sock"
    found, _ = unified({"daemon": {"listen": "[::1]:7000"}})
    assert found.listen == ("tcp", ("::1", 7000))


@pytest.mark.parametrize("listen", ["http://127.0.0.1:9820", "localhost:9820", "127.0.0.1", "::1:9820",
                                    "[127.0.0.1]:9820", "127.0.0.1:65536", "tcp://127.0.0.1:9820", "nowhere"])
def test_a_listen_that_is_no_socket_address_fails_the_start_as_the_real_daemon(listen: str) -> None:
    """cuzk-daemon main.rs parses a TCP listen as a Rust SocketAddr: an IP address (IPv6 in brackets) and a port,
    no scheme, no host name. Read, it is None; the start raises the real one's error at the bind."""
    found, _ = unified({"daemon": {"listen": listen}})
    assert found.listen is None and found.listen_text == listen
    assert str(cs.invalid_listen(listen)) == f"invalid listen address: {listen}: invalid socket address syntax"


def test_an_empty_status_listen_disables_the_status_api() -> None:
    for text in ("", "   "):
        found, _ = unified({"daemon": {"status_listen": text}})
        assert found.status_listen is None


@pytest.mark.parametrize("status", ["localhost", "http://127.0.0.1:9821", "127.0.0.1:99999", "no such host:9821"])
def test_a_status_listen_it_cannot_bind_leaves_it_without_a_status_api(status: str) -> None:
    """The real one's status task binds with Tokio (a name resolved) and, failing, logs it and ends: the daemon
    serves on without /status (its start does not fail)."""
    found, _ = unified({"daemon": {"status_listen": status}})
    assert found.status_listen == ("unbindable", status)


def test_a_status_listen_by_name_or_address_binds() -> None:
    assert unified({"daemon": {"status_listen": "localhost:9821"}})[0].status_listen == ("tcp", ("localhost", 9821))
    assert unified({"daemon": {"status_listen": "[::1]:9821"}})[0].status_listen == ("tcp", ("::1", 9821))


def test_param_cache_from_the_config_then_the_environment_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIL_PROOFS_PARAMETER_CACHE", "  /env/params ")
    assert unified({"srs": {"param_cache": "/cfg/params"}})[0].param_cache == "/cfg/params"
    assert unified({"srs": {"param_cache": ""}})[0].param_cache == "/env/params"
    assert unified({})[0].param_cache == "/env/params"
    monkeypatch.setenv("FIL_PROOFS_PARAMETER_CACHE", "  ")
    assert unified({})[0].param_cache == cs.DEFAULT_CACHE


def test_gpu_workers_are_devices_times_workers_with_fallbacks_for_unusable_values() -> None:
    assert unified({"gpus": {"devices": [0, 1, 2], "gpu_workers_per_device": 3}})[0].gpu_workers == 9
    for devices in ([], "0,1", None):
        assert unified({"gpus": {"devices": devices}})[0].devices == [0]
    for workers in (0, -1, "4", 2.5):
        assert unified({"gpus": {"gpu_workers_per_device": workers}})[0].workers_per_device == 2


def test_a_section_that_is_not_a_table_counts_as_absent() -> None:
    found, _ = unified({"daemon": "listen=1", "gpus": [1, 2], "pipeline": 3})
    assert found.listen_text == cs.DEFAULT_LISTEN and found.gpu_workers == 2 and found.synthesis_concurrency == 1


def test_pipeline_keys_are_taken_as_given() -> None:
    found, _ = unified({"pipeline": {"enabled": False, "synthesis_concurrency": 4}})
    assert found.synthesis_concurrency == 4


def test_auto_budget_is_physical_memory_less_the_margin() -> None:
    log = Said()
    found = cs.settings({"memory": {"safety_margin": "1GiB"}}, None, generations.UNIFIED_GENERATION, log)  # type: ignore[arg-type]
    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert found.budget == phys - GIB
    assert re.fullmatch(r"memory budget: .* \(auto \(physical .* - margin 1\.00 GiB\)\)", log.lines[0][1])


def test_a_margin_above_physical_memory_leaves_a_zero_budget_not_a_negative_one() -> None:
    log = Said()
    found = cs.settings({"memory": {"safety_margin": "1024TiB"}}, None, generations.UNIFIED_GENERATION, log)  # type: ignore[arg-type]
    assert found.budget == 0


def test_a_budget_below_the_required_minimum_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_DAEMON_MIN_BUDGET", "64GiB")
    assert unified({"memory": {"total_budget": "64GiB"}})[0].budget == 64 * GIB  # exactly enough
    with pytest.raises(cs.StartupError, match=r"budget 63\.00 GiB < required 64\.00 GiB"):
        unified({"memory": {"total_budget": "63GiB"}})


def test_a_unified_build_warns_about_partition_workers() -> None:
    found, log = unified({"synthesis": {"partition_workers": 3}})
    assert found.pw is None
    assert [lvl for lvl, _ in log.lines] == ["info", "warn"]


def test_a_partition_workers_build_has_no_status_api_and_ignores_total_budget() -> None:
    log = Said()
    cfg = {"daemon": {"status_listen": "127.0.0.1:9999"},
           "memory": {"total_budget": "not a size", "working_memory_budget": "30GiB"},
           "synthesis": {"partition_workers": 2}}
    found = cs.settings(cfg, None, generations.PW_GENERATION, log)  # type: ignore[arg-type]
    assert found.status_listen is None and found.status_text == "127.0.0.1:9999"
    assert found.budget == 0  # the unparseable total_budget is never read
    assert found.pw is not None and found.pw.count == 2
    assert log.lines == [("info", "memory: working_memory_budget = 30GiB"),
                         ("info", "synthesis: partition_workers=2 (estimated peak RSS ~ 109.00 GiB)")]


def test_read_toml_no_path_missing_file_good_and_malformed(tmp_path: Path) -> None:
    assert cs.read_toml(None) == ({}, "config file None not found, using built-in defaults")
    missing = tmp_path / "absent.toml"
    assert cs.read_toml(str(missing)) == ({}, f"config file {missing} not found, using built-in defaults")
    good = tmp_path / "cuzk.toml"
    good.write_text('[daemon]\nlisten = "127.0.0.1:1"\n')
    assert cs.read_toml(str(good)) == ({"daemon": {"listen": "127.0.0.1:1"}}, f"loaded config from {good}")
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    with pytest.raises(cs.StartupError, match=f"failed to load config {re.escape(str(bad))}: "):
        cs.read_toml(str(bad))


def test_log_filter_from_rust_log_then_the_flag_then_the_config_then_info(monkeypatch: pytest.MonkeyPatch) -> None:
    """As cuzk-daemon main.rs: ``EnvFilter::try_from_default_env()`` (RUST_LOG, when set and every directive parses),
    else ``EnvFilter::new`` of ``--log-level``, else of ``[logging] level`` (a bad directive skipped; none left:
    error)."""
    monkeypatch.delenv("RUST_LOG", raising=False)
    assert cs.log_for("error", {"logging": {"level": "trace"}}).directives == {None: cs.LEVELS["error"]}
    assert cs.log_for(None, {"logging": {"level": "WARN"}}).directives == {None: cs.LEVELS["warn"]}
    assert cs.log_for(None, {"logging": {"level": 3}}).directives == {None: cs.LEVELS["info"]}  # not a string: ignored
    assert cs.log_for(None, {}).directives == {None: cs.LEVELS["info"]}
    # (a word that is no level is a target: that target's every line, and nothing else)
    assert cs.log_for("chatty", {}).directives == {"chatty": cs.LEVELS["trace"]}
    assert cs.log_for("chatty=loud", {}).directives == {None: cs.LEVELS["error"]}  # (nothing valid: error)
    monkeypatch.setenv("RUST_LOG", "warn,cuzk_core::engine=info")
    log = cs.log_for("debug", {"logging": {"level": "trace"}})  # RUST_LOG wins over both
    assert log.enabled("info", "cuzk_core::engine") and not log.enabled("debug", "cuzk_core::engine")
    assert not log.enabled("info", "cuzk_daemon") and log.enabled("warn", "cuzk_core::pipeline")
    monkeypatch.setenv("RUST_LOG", "warn,cuzk_core=loud")  # (one bad directive: RUST_LOG is not used at all)
    assert cs.log_for(None, {"logging": {"level": "debug"}}).directives == {None: cs.LEVELS["debug"]}
    monkeypatch.setenv("RUST_LOG", "")  # (set, empty: nothing at all)
    assert not cs.log_for(None, {}).enabled("error", "cuzk_daemon")


def test_log_filter_takes_the_longest_target_a_line_starts_with() -> None:
    log = cs.Log("info,cuzk_core=warn,cuzk_core::engine=debug,cuzk_core::engine=info,cuzk_pce[span]=trace")
    assert log.enabled("info", "cuzk_daemon") and not log.enabled("debug", "cuzk_daemon")
    assert not log.enabled("info", "cuzk_core::pipeline") and log.enabled("warn", "cuzk_core::pipeline")
    assert log.enabled("info", "cuzk_core::engine") and not log.enabled("debug", "cuzk_core::engine")  # (the later)
    assert not log.enabled("debug", "cuzk_pce::disk")  # (a span's directive: no plain line's)
    assert not cs.Log("cuzk_core=info").enabled("error", "cuzk_daemon")  # (no directive for it: no line)


def test_log_prints_at_or_above_its_level_in_tracing_style(capsys: pytest.CaptureFixture[str]) -> None:
    log = cs.Log("warn")
    log("info", "not shown")
    log("warn", "shown", target="cuzk_core::srs")
    log("error", "also shown")
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\S+Z  WARN cuzk_core::srs: shown", lines[0])
    assert lines[1].endswith("ERROR cuzk_daemon: also shown")
