"""Config validation: bad configs are refused in one line before anything starts; good ones parse as documented.

Fine-grained cases call ``supervisor.config`` directly; what the command line does with them (exit status 2, one
line on stderr naming the key, no traceback, no child started, no directory created) runs the real
``python -m supervisor`` as a subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import PY, REPO, kill_tree, sh, toml_str

from supervisor import __version__
from supervisor.config import (
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_BACKOFF_JITTER,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_RESET_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_EXEC_WAIT_S,
    DEFAULT_LOG_DIR,
    DEFAULT_LOG_FILE_MAX_BYTES,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_BURST,
    DEFAULT_RESTART_WINDOW_S,
    DEFAULT_RING_LINES,
    DEFAULT_STATE_DIR,
    DEFAULT_STOP_GRACE_S,
    MAX_NESTING,
    MAX_RETRIES,
    MAX_RING_LINES,
    MAX_SECONDS,
    ConfigError,
    ConfigPlugin,
    Plan,
    ReadyCheck,
    load_plan,
    parse_plan,
    parse_signal,
)
from supervisor.text.show import shown
from supervisor.text.units import MAX_SIZE

PROG = "prover-supervisor"
CLI_TIMEOUT_S = 20

# ---------------------------------------------------------------- helpers


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without the variables these tests rely on being unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("UNSET_VAR", "SUPERVISOR_CONFIG")}
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "supervisor", *args], capture_output=True, text=True, encoding="utf-8", errors="replace",
        env=env if env is not None else clean_env(), cwd=REPO, timeout=CLI_TIMEOUT_S,
    )


def cli_both(config: Path, env: dict[str, str] | None = None) -> dict[str, subprocess.CompletedProcess[str]]:
    """``check`` and ``run`` on the same config, side by side (they must both refuse it before starting anything)."""
    env = env if env is not None else clean_env()
    procs = {
        sub: subprocess.Popen(
            [PY, "-m", "supervisor", sub, "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, encoding="utf-8", errors="replace", env=env, cwd=REPO, start_new_session=True,
        )
        for sub in ("check", "run")
    }
    check, run = procs["check"], procs["run"]
    try:
        out, err = check.communicate(timeout=CLI_TIMEOUT_S)
        if check.returncode == 0:
            pytest.fail(f"`check` accepted a bad config (exit 0): {out.strip()}")
        results = {"check": subprocess.CompletedProcess(check.args, check.returncode, out, err)}
        try:
            out, err = run.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`run` did not finish within {CLI_TIMEOUT_S}s: it accepted the bad config and ran it")
        results["run"] = subprocess.CompletedProcess(run.args, run.returncode, out, err)
        return results
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.communicate()


def assert_one_line_error(result: subprocess.CompletedProcess[str], prefix: str) -> str:
    """Exit status 2, no traceback, and exactly one stderr line that starts with ``prefix``."""
    what = f"{' '.join(map(str, result.args[2:]))}"
    assert "Traceback" not in result.stderr, f"{what}: traceback instead of a one-line error:\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"{what}: expected exactly one line on stderr, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith(prefix), f"{what}: stderr line should start with {prefix!r}, got:\n{lines[0]}"
    assert result.returncode == 2, f"{what}: exit status {result.returncode}, expected 2; stderr: {result.stderr}"
    return lines[0]


def parse(body: str, environ: dict[str, str] | None = None, plugin: ConfigPlugin | None = None) -> Plan:
    """The generic supervisor's config (no plugin), or with ``plugin`` (PLUGIN: the prover's, as the CLI loads it)."""
    return parse_plan(textwrap.dedent(body), "test.toml", environ or {}, plugin)


def parse_error(body: str, environ: dict[str, str] | None = None, plugin: ConfigPlugin | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(body, environ, plugin)
    return str(info.value)


# ---------------------------------------------------------------- the bad-config table
#
# The command line loads every config with the prover plugin ([cuzk], the fleet keys): the CLI test takes the whole
# table; load_plan here is the generic loader's (no plugin), so it takes the entries of core tables only.
# Every body is rendered with @MARK@ replaced by a command that creates a marker file, and (unless it starts
# with "#raw") with state_dir / log_dir under tmp_path, so that a config accepted by mistake would visibly start
# something. Phase 0 ("mark") is valid and would run first, the bad part comes after it.

MARK_PHASE = '[[phases]]\nname = "mark"\ncommand = @MARK@\n'


def bad_phase(extra: str = "", *, name: str | None = '"b"', kind: str | None = None,
              command: str | None = "@MARK@") -> str:
    """The marker phase, then phases[1] with ``extra`` lines."""
    lines = ["[[phases]]"]
    if name is not None:
        lines.append(f"name = {name}")
    if kind is not None:
        lines.append(f'kind = "{kind}"')
    if command is not None:
        lines.append(f"command = {command}")
    return MARK_PHASE + "\n".join(lines) + "\n" + extra + "\n"


def bad_daemon(extra: str = "", *, name: str | None = '"d"', command: str | None = "@MARK@",
               kind: str = "service", more: str = "") -> str:
    """The marker phase, then phases[1] with one daemon (daemons[0]) with ``extra`` lines (and ``more`` after)."""
    lines = ["[[phases.daemons]]"]
    if name is not None:
        lines.append(f"name = {name}")
    if command is not None:
        lines.append(f"command = {command}")
    return bad_phase("\n".join(lines) + "\n" + extra + "\n" + more, kind=kind)


def sup_section(extra: str) -> str:
    return "[supervisor]\n" + extra + "\n" + MARK_PHASE


P = pytest.param
# A log_dir of 4079 bytes: supervisor.log.1 in it is one byte past PATH_MAX (4095).
LONG_DIR = "/tmp" + ("/" + "d" * 250) * 16 + "/" + "e" * 58
BAD_CONFIGS = [
    # -- the file as a whole
    P(MARK_PHASE + "[[phases]\nname = \n", "not valid TOML:", id="not-toml"),
    P("this is not a config file at all\n" + MARK_PHASE, "not valid TOML:", id="not-toml-prose"),
    P('colour = "blue"\n' + MARK_PHASE, "colour: unknown top-level key", id="unknown-top-level-key"),
    P('"a\\nb" = 1\n' + MARK_PHASE, "'a\\nb': unknown top-level key", id="top-level-key-with-newline"),
    P(MARK_PHASE + '[[phase]]\nname = "q"\ncommand = @MARK@\n', "phase: unknown top-level key (did you mean 'phases'?)",
      id="phases-misspelt"),
    P("#raw\nsupervisor = 5\n" + MARK_PHASE, "supervisor: must be a table", id="supervisor-not-a-table"),
    P(sup_section("stop_grace_s = 1").replace(MARK_PHASE, ""), "phases:", id="missing-phases"),
    P("phases = []\n", "phases:", id="empty-phases"),
    P('[phases]\nname = "x"\ncommand = @MARK@\n', "phases:", id="phases-is-a-table"),
    P('phases = ["x"]\n', "phases[0]: must be a table", id="phase-not-a-table"),
    # -- [supervisor]
    P(sup_section("stop_grace = 3"), "supervisor.stop_grace: unknown key (did you mean 'stop_grace_s'?)",
      id="supervisor-typo-suggests"),
    P(sup_section("stop_grace_s = -1"), "supervisor.stop_grace_s:", id="supervisor-negative-grace"),
    P(sup_section("stop_grace_s = inf"), "supervisor.stop_grace_s:", id="supervisor-inf-grace"),
    P(sup_section('stop_grace_s = "30"'), "supervisor.stop_grace_s:", id="supervisor-grace-string"),
    # -- the stop budget: under docker stop's 10 s by default; too small to stop anything, or no budget at all
    P(sup_section("stop_budget_s = 0.5"), "supervisor.stop_budget_s: must be at least 2 seconds",
      id="stop-budget-too-small"),
    P(sup_section("stop_budget_s = 864001"), "supervisor.stop_budget_s: must be at most 864000 seconds",
      id="stop-budget-too-big"),
    P(sup_section("stop_budget_s = nan"), "supervisor.stop_budget_s:", id="stop-budget-nan"),
    P(sup_section("ring_lines = 0"), "supervisor.ring_lines:", id="ring-lines-zero"),
    P(sup_section('console = "yes"'), "supervisor.console:", id="console-not-bool"),
    P(sup_section("log_file_max_bytes = -1"), "supervisor.log_file_max_bytes:", id="log-max-bytes-negative"),
    P(sup_section("env = { A = [1, 2] }"), "supervisor.env.A:", id="supervisor-env-list-value"),
    # -- phase keys
    P(bad_phase("retry = 1"), "phases[1] (b).retry: unknown key", id="phase-unknown-key"),
    P(bad_phase('"retry\\nx" = 1'), "phases[1]", id="unknown-key-with-newline"),
    P(bad_phase(name=None), "phases[1].name: required key is missing", id="phase-without-name"),
    P(bad_phase(command=None), "phases[1] (b).command: required key is missing", id="phase-without-command"),
    P(bad_phase(command='"touch /tmp/x"'), "phases[1] (b).command:", id="command-is-a-string"),
    P(bad_phase(command="[]"), "phases[1] (b).command:", id="command-empty-list"),
    P(bad_phase(command='["sleep", 1]'), "phases[1] (b).command[1]:", id="command-non-string-arg"),
    P(bad_phase(command='["", "x"]'), "phases[1] (b).command[0]:", id="command-empty-program"),
    P(bad_phase(kind="daemon"), "phases[1] (b).kind:", id="bad-kind"),
    P(bad_phase('restart = "sometimes"', kind="service"), "phases[1] (b).restart:", id="bad-restart-value"),
    P(bad_phase('restart = "always"'), "phases[1] (b).restart:", id="restart-on-oneshot"),
    P(bad_phase('restart = "always"', kind="oneshot"), "phases[1] (b).restart:", id="restart-on-explicit-oneshot"),
    P(bad_phase("retries = 1", kind="service"), "phases[1] (b).retries:", id="retries-on-service"),
    P(bad_phase("timeout_s = 10", kind="service"), "phases[1] (b).timeout_s:", id="timeout-on-service"),
    # (a service that once ended cleanly was resumed as done at every later start, and never started again)
    P(bad_phase('resume = "machine"', kind="service"), 'phases[1] (b).resume: only for kind = "oneshot" (a service '
      "is there to stay up: one resumed as done would never start again)", id="resume-on-service"),
    P(bad_phase('ready = "tcp://127.0.0.1:80"'), "phases[1] (b).ready:", id="ready-on-oneshot"),
    P(bad_phase("retries = -1"), "phases[1] (b).retries:", id="negative-retries"),
    P(bad_phase("retries = true"), "phases[1] (b).retries:", id="bool-retries"),
    P(bad_phase("retries = 1.5"), "phases[1] (b).retries:", id="fractional-retries"),
    P(bad_phase("timeout_s = -5"), "phases[1] (b).timeout_s:", id="negative-timeout"),
    P(bad_phase("timeout_s = 0"), "phases[1] (b).timeout_s:", id="zero-timeout"),
    P(bad_phase("timeout_s = nan"), "phases[1] (b).timeout_s:", id="nan-timeout"),
    P(bad_phase("timeout_s = inf"), "phases[1] (b).timeout_s:", id="inf-timeout"),
    P(bad_phase('timeout_s = "10"'), "phases[1] (b).timeout_s:", id="string-timeout"),
    P(bad_phase("timeout_s = false"), "phases[1] (b).timeout_s:", id="bool-timeout"),
    P(bad_phase("stop_grace_s = -1"), "phases[1] (b).stop_grace_s:", id="phase-negative-grace"),
    P(bad_phase('stop_signal = "SIGFOO"'), "phases[1] (b).stop_signal:", id="bad-signal-name"),
    P(bad_phase("stop_signal = 999"), "phases[1] (b).stop_signal:", id="bad-signal-number"),
    P(bad_phase("stop_signal = 0"), "phases[1] (b).stop_signal:", id="signal-zero"),
    P(bad_phase("stop_signal = true"), "phases[1] (b).stop_signal:", id="signal-bool"),
    # -- SIGSTOP freezes a child, which then sat out its grace before SIGKILL: no stop signal
    P(bad_phase('stop_signal = "SIGSTOP"'), "phases[1] (b).stop_signal: SIGSTOP stops nothing", id="signal-sigstop"),
    P(bad_daemon(f"stop_signal = {int(signal.SIGSTOP)}"), "phases[1] (b).daemons[0] (d).stop_signal: SIGSTOP stops "
      "nothing", id="signal-sigstop-number"),
    P(bad_phase('cwd = ""'), "phases[1] (b).cwd:", id="empty-cwd"),
    P(bad_phase("backoff_s = 10\nbackoff_max_s = 5", kind="service"), "phases[1] (b).backoff_max_s:",
      id="backoff-max-below-backoff"),
    P(bad_phase("backoff_max_s = -inf", kind="service"), "phases[1] (b).backoff_max_s:", id="backoff-max-neg-inf"),
    P(bad_phase("backoff_jitter = 1.5", kind="service"), "phases[1] (b).backoff_jitter:", id="jitter-above-one"),
    P(bad_phase("backoff_jitter = -0.1", kind="service"), "phases[1] (b).backoff_jitter:", id="jitter-negative"),
    P(bad_phase("backoff_factor = 0.5", kind="service"), "phases[1] (b).backoff_factor:", id="factor-below-one"),
    P(bad_phase("restart_burst = 0", kind="service"), "phases[1] (b).restart_burst:", id="restart-burst-zero"),
    P(bad_phase("restart_window_s = 0", kind="service"), "phases[1] (b).restart_window_s:", id="restart-window-zero"),
    # -- names
    P(bad_phase(name='"mark"'), "phases[1] (mark).name: duplicate", id="duplicate-phase-name"),
    P(bad_phase(name='"a b"'), "phases[1].name:", id="name-with-space"),
    P(bad_phase(name='"../x"'), "phases[1].name:", id="name-with-dotdot-slash"),
    P(bad_phase(name='""'), "phases[1].name:", id="name-empty"),
    P(bad_phase(name='"-x"'), "phases[1].name:", id="name-leading-dash"),
    P(bad_phase(name='"' + "n" * 64 + '"'), "phases[1].name:", id="name-too-long"),
    P(bad_phase(name="5"), "phases[1].name:", id="name-not-a-string"),
    P(bad_phase(name='"a\\n"'), "phases[1].name:", id="name-trailing-newline"),
    # -- env
    P(bad_phase("env = { A = { b = 1 } }"), "phases[1] (b).env.A:", id="env-value-table"),
    P(bad_phase("env = { A = [1] }"), "phases[1] (b).env.A:", id="env-value-list"),
    P(bad_phase('env = { "1BAD" = "x" }'), "phases[1] (b).env.1BAD:", id="env-key-invalid"),
    P(bad_phase('env = { "A=B" = "x" }'), "phases[1] (b).env.A=B:", id="env-key-with-equals"),
    P(bad_phase('env = { "FOO\\n" = "x" }'), "phases[1] (b).env", id="env-key-trailing-newline"),
    P(bad_phase('env = "A=1"'), "phases[1] (b).env:", id="env-not-a-table"),
    # -- the supervisor's own variables: a state_dir set here hid the child from the sweep after a SIGKILL
    P(bad_phase('env = { PROVER_SUPERVISOR_STATE_DIR = "/elsewhere" }'),
      "phases[1] (b).env.PROVER_SUPERVISOR_STATE_DIR: the supervisor sets this variable itself, for every child",
      id="env-own-state-dir"),
    P(sup_section('env = { PROVER_SUPERVISOR_TAG = "x" }'), "supervisor.env.PROVER_SUPERVISOR_TAG: the supervisor "
      "sets this variable itself", id="env-own-tag"),
    P(bad_daemon('env = { SUPERVISOR_MEMORY_AVAILABLE_BYTES = 1 }'), "phases[1] (b).daemons[0] (d).env."
      "SUPERVISOR_MEMORY_AVAILABLE_BYTES: the supervisor sets this variable itself", id="env-own-memory"),
    # -- ${VAR}
    P(bad_phase(command=sh("touch ${UNSET_VAR}")), "phases[1] (b).command[2]: ${UNSET_VAR} is not set",
      id="unset-var-in-command"),
    P(bad_phase('env = { A = "${UNSET_VAR}" }'), "phases[1] (b).env.A: ${UNSET_VAR} is not set", id="unset-var-in-env"),
    # -- a "${" that begins no reference reached the child as text, or half expanded ("${X:-${Y}}" gave "xx}")
    P(bad_phase(command='["${CURIO_BIN:-curio"]'), "phases[1] (b).command[0]: '${CURIO_BIN:-curio' is not a "
      "${NAME} or ${NAME:-default} reference (write $$ for a literal $, $${ for a shell's own ${)",
      id="reference-unterminated"),
    P(bad_phase('env = { A = "${X-default}" }'), "phases[1] (b).env.A: '${X-default}' is not a ${NAME}",
      id="reference-shell-form"),
    P(bad_phase('env = { A = "${}" }'), "phases[1] (b).env.A: '${}' is not a", id="reference-empty"),
    P(bad_phase('env = { A = "a ${1X} b" }'), "phases[1] (b).env.A: '${1X} b' is not a", id="reference-bad-name"),
    P(bad_phase('env = { A = "${UNSET_VAR:-${HOME}}" }'), "phases[1] (b).env.A: '${UNSET_VAR:-${HOME}}' is not a",
      id="reference-nested"),
    P(sup_section('env = { A = "x${UNSET_VAR}y" }'), "supervisor.env.A: ${UNSET_VAR} is not set",
      id="unset-var-in-supervisor-env"),
    # -- daemons
    P(bad_daemon("timeout_s = 5"), "phases[1] (b).daemons[0] (d).timeout_s: unknown key", id="daemon-unknown-key"),
    P(bad_daemon(name=None), "phases[1] (b).daemons[0].name: required key is missing", id="daemon-without-name"),
    P(bad_daemon(command=None), "phases[1] (b).daemons[0] (d).command: required key is missing",
      id="daemon-without-command"),
    P(bad_daemon(name='"b"'), "phases[1] (b).daemons[0] (b).name:", id="daemon-named-like-its-phase"),
    P(bad_daemon(name='"a/b"'), "phases[1] (b).daemons[0].name:", id="daemon-name-with-slash"),
    P(bad_daemon(more='[[phases.daemons]]\nname = "d"\ncommand = @MARK@\n'),
      "phases[1] (b).daemons[1] (d).name: duplicate", id="duplicate-daemon-name"),
    P(bad_daemon('lifetime = "forever"'), "phases[1] (b).daemons[0] (d).lifetime:", id="daemon-bad-lifetime"),
    P(bad_daemon('stop_signal = "SIGNOPE"'), "phases[1] (b).daemons[0] (d).stop_signal:", id="daemon-bad-signal"),
    P(bad_daemon("stop_grace_s = nan"), "phases[1] (b).daemons[0] (d).stop_grace_s:", id="daemon-nan-grace"),
    P(bad_daemon("ready_timeout_s = 0"), "phases[1] (b).daemons[0] (d).ready_timeout_s:",
      id="daemon-zero-ready-timeout"),
    P(bad_daemon("exec_wait_s = -1"), "phases[1] (b).daemons[0] (d).exec_wait_s:", id="daemon-negative-exec-wait"),
    P(bad_phase('exec_wait_s = "5s"'), "phases[1] (b).exec_wait_s:", id="phase-exec-wait-text"),
    P(bad_phase("exec_wait_s = 61"), "phases[1] (b).exec_wait_s: must be at most 60 seconds (the supervisor's loop "
      "is held for the whole wait), got 61", id="phase-exec-wait-past-its-most"),
    # -- a timeout shorter than any healthy start, probe or call: every one failed ("within 0.0001s")
    P(bad_phase("exec_wait_s = 0.0001"), "phases[1] (b).exec_wait_s: must be at least 0.1 seconds (a shorter wait "
      "fails on a healthy machine), got 0.0001", id="exec-wait-below-its-least"),
    P(bad_daemon("ready_timeout_s = 0.01"), "phases[1] (b).daemons[0] (d).ready_timeout_s: must be at least 0.1 "
      "seconds", id="ready-timeout-below-its-least"),
    P("[manager]\nconnect_timeout_s = 0.001\n" + MARK_PHASE, "manager.connect_timeout_s: must be at least 0.1 "
      "seconds", id="connect-timeout-below-its-least"),
    P("[manager]\nread_timeout_s = 0.0002\n" + MARK_PHASE, "manager.read_timeout_s: must be at least 0.1 seconds",
      id="read-timeout-below-its-least"),
    P(bad_daemon("env = { B = { c = 1 } }"), "phases[1] (b).daemons[0] (d).env.B:", id="daemon-env-value-table"),
    P(bad_daemon('cwd = "${UNSET_VAR}/work"'), "phases[1] (b).daemons[0] (d).cwd: ${UNSET_VAR} is not set",
      id="unset-var-in-daemon-cwd"),
    P(bad_phase('daemons = { name = "d" }', kind="service"), "phases[1] (b).daemons:", id="daemons-not-an-array"),
    P(bad_phase('daemons = ["d"]', kind="service"), "phases[1] (b).daemons[0]:", id="daemon-not-a-table"),
    # -- ready URLs (on a daemon)
    P(bad_daemon('ready = "ftp://x"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-ftp"),
    P(bad_daemon('ready = "tcp://nohost"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-tcp-no-port"),
    P(bad_daemon('ready = "tcp://h..:80"'), "phases[1] (b).daemons[0] (d).ready: 'tcp://h..:80' must look like "
      "tcp://host:port", id="ready-tcp-no-host-name"),
    P(bad_daemon('ready = "http://h..:80/"'), "phases[1] (b).daemons[0] (d).ready: 'http://h..:80/': 'h..' is no "
      "host name", id="ready-http-no-host-name"),
    P(bad_daemon('ready = "tcp://h:99999"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-tcp-port-too-big"),
    P(bad_daemon('ready = "tcp://h:0"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-tcp-port-zero"),
    P(bad_daemon('ready = "tcp://:80"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-tcp-no-host"),
    # -- a host no connect can reach ("ho", its "/st:80" taken as a path; a space): passed check, then timed out
    P(bad_daemon('ready = "tcp://ho/st:80"'), "phases[1] (b).daemons[0] (d).ready: 'tcp://ho/st:80' must look like "
      "tcp://host:port", id="ready-tcp-slash-in-host"),
    P(bad_daemon('ready = "tcp://a b:80"'), "phases[1] (b).daemons[0] (d).ready: 'tcp://a b:80' must look like "
      "tcp://host:port", id="ready-tcp-space-in-host"),
    P(bad_daemon('ready = "tcp://host:80/path"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-tcp-path"),
    P(bad_daemon('ready = "run/ready"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-relative-path"),
    P(bad_daemon('ready = "file://run/ready"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-file-url-relative"),
    P(bad_daemon('ready = "http://"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-http-no-host"),
    # -- a URL http.client refuses at every probe: the phase failed "timeout" only after ready_timeout_s
    P(bad_daemon('ready = "http://127.0.0.1:8080/a b"'), "phases[1] (b).daemons[0] (d).ready: "
      "'http://127.0.0.1:8080/a b' holds ' ': a URL may hold only printable ASCII", id="ready-http-space"),
    P(bad_daemon('ready = "http://127.0.0.1:1/\u00e9"'), "phases[1] (b).daemons[0] (d).ready: "
      "'http://127.0.0.1:1/\u00e9' holds '\\xe9'", id="ready-http-non-ascii"),
    P(bad_daemon('ready = ""'), "phases[1] (b).daemons[0] (d).ready:", id="ready-empty"),
    P(bad_daemon("ready = 9821"), "phases[1] (b).daemons[0] (d).ready:", id="ready-number"),
    P(bad_daemon('ready = "http://h:99999/status"'), "phases[1] (b).daemons[0] (d).ready:",
      id="ready-http-port-too-big"),
    P(bad_daemon('ready = "http://h:abc/status"'), "phases[1] (b).daemons[0] (d).ready:",
      id="ready-http-port-not-number"),
    P(bad_daemon('ready = "http://h:0/status"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-http-port-zero"),
    P(bad_daemon('ready = "http://[::1/status"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-http-bad-ipv6"),
    # -- digits that str.isdigit() takes and int() does not
    P(bad_daemon('ready = "tcp://h:²"'), "phases[1] (b).daemons[0] (d).ready:", id="ready-tcp-superscript-port"),
    P(bad_daemon('ready = "tcp://h:00000000000000000080"'), "phases[1] (b).daemons[0] (d).ready:",
      id="ready-tcp-long-port"),
    P(bad_daemon('ready = "http://h:00000080/status"'), "phases[1] (b).daemons[0] (d).ready: "
      "'http://h:00000080/status': the port has more than 5 digits (a port is 1-65535)", id="ready-http-long-port"),
    P(sup_section('http_port = "${UNSET_VAR:-²}"'), "supervisor.http_port: must be a whole number",
      id="http-port-superscript"),
    P('[cuzk]\nbench_concurrency = "${UNSET_VAR:-١٢}"\n' + MARK_PHASE, "cuzk.bench_concurrency:",
      id="bench-concurrency-arabic-digits"),
    # -- sizes
    P(bad_phase('min_memory = "1e999"'), "phases[1] (b).min_memory:", id="size-exponent-overflow"),
    P(bad_phase('min_memory = "²GiB"'), "phases[1] (b).min_memory:", id="size-superscript"),
    P(bad_phase('memory_max = "2048TiB"'), "phases[1] (b).memory_max:", id="size-above-max"),
    P(bad_phase("memory_max = 99999999999999999999"), "phases[1] (b).memory_max:", id="size-huge-int"),
    P(bad_phase('min_memory = "nan"'), "phases[1] (b).min_memory:", id="size-nan"),
    # -- a bare number is bytes: memory_max = 1 (meant 1GiB) OOM-killed the phase at once; "1.5" was cut to 1 byte
    P(bad_phase("memory_max = 1"), 'phases[1] (b).memory_max: must be at least 4MiB (a bare number is bytes: did you '
      'mean "1GiB"?), got 1', id="memory-max-one-byte"),
    P(bad_phase('memory_max = "100B"'), "phases[1] (b).memory_max: must be at least 4MiB (a smaller limit OOM-kills "
      "the phase as it starts), got '100B'", id="memory-max-100-bytes"),
    P(bad_phase('memory_max = "1.5"'), "phases[1] (b).memory_max: '1.5' is not a whole number of bytes (a bare "
      'number is bytes: did you mean "1.5GiB"?)', id="size-fraction-of-a-byte"),
    P(bad_phase('min_memory = "0.5b"'), "phases[1] (b).min_memory: '0.5b' is not a whole number of bytes",
      id="size-half-a-byte"),
    # -- counts
    P(sup_section("ring_lines = 99999999999999999999"), "supervisor.ring_lines: must be at most",
      id="ring-lines-huge"),
    # -- a port is 0..65535, in one check (a huge one was told "must be at most 1000000")
    P(sup_section("http_port = 2000000"), "supervisor.http_port: 2000000 is not a TCP port (0 to 65535; 0 turns it "
      "off)", id="http-port-huge"),
    P(sup_section("http_port = 70000"), "supervisor.http_port: 70000 is not a TCP port (0 to 65535; 0 turns it off)",
      id="http-port-above-65535"),
    P(sup_section("http_port = -1"), "supervisor.http_port: -1 is not a TCP port (0 to 65535; 0 turns it off)",
      id="http-port-negative"),
    P(sup_section("log_file_max_bytes = 99999999999999999999"), "supervisor.log_file_max_bytes: 99999999999999999999 "
      "bytes is more than the 1PiB a size may be", id="log-file-max-bytes-huge"),
    P(sup_section('log_file_max_bytes = "2TiB"'), "supervisor.log_file_max_bytes: must be at most 1024.0GiB "
      "(1099511627776 bytes), got '2TiB'", id="log-file-max-bytes-past-its-most"),
    P(sup_section('log_file_max_bytes = "64 parsecs"'), "supervisor.log_file_max_bytes: '64 parsecs' is not a size",
      id="log-file-max-bytes-no-size"),
    P('[manager]\nlog_backlog_bytes = "0MiB"\n' + MARK_PHASE, "manager.log_backlog_bytes: must be at least 1 bytes",
      id="log-backlog-zero"),
    P(bad_phase("retries = 9223372036854775807"), "phases[1] (b).retries: must be at most", id="retries-huge"),
    P(bad_phase("restart_burst = 1000000000", kind="service"), "phases[1] (b).restart_burst: must be at most",
      id="restart-burst-huge"),
    P("[manager]\nlog_backlog_bytes = 99999999999999\n" + MARK_PHASE, "manager.log_backlog_bytes: must be at most",
      id="log-backlog-huge"),
    P(bad_phase("backoff_factor = 1e300", kind="service"), "phases[1] (b).backoff_factor: must be at most",
      id="backoff-factor-huge"),
    P("[manager]\nmin_rate = -1\n" + MARK_PHASE, "manager.min_rate:", id="min-rate-negative"),
    P("[manager]\nmin_rate = 1e300\n" + MARK_PHASE, "manager.min_rate: must be at most 1e+06 proofs/hour",
      id="min-rate-no-bench-passes"),
    # -- seconds: every *_s key is bounded
    P(bad_phase("timeout_s = 2200000"), "phases[1] (b).timeout_s: must be at most 864000 seconds",
      id="timeout-25-days"),
    P(bad_phase("timeout_s = 1e300"), "phases[1] (b).timeout_s: must be at most", id="timeout-1e300"),
    P(bad_phase("timeout_s = 1" + "0" * 400), "phases[1] (b).timeout_s:", id="timeout-int-beyond-float"),
    P(sup_section("stop_grace_s = 1e12"), "supervisor.stop_grace_s: must be at most", id="grace-huge"),
    P(bad_phase("backoff_max_s = 1e9", kind="service"), "phases[1] (b).backoff_max_s: must be at most",
      id="backoff-max-huge"),
    P(bad_phase("stall_s = 1e9"), "phases[1] (b).stall_s: must be at most", id="stall-huge"),
    # -- interval knobs have a floor: more often is a spin, not a closer watch
    P(bad_phase("stall_s = 0.001"), "phases[1] (b).stall_s: must be at least 1 seconds", id="stall-tiny"),
    P("[manager]\nlog_push_interval_s = 0.000001\n" + MARK_PHASE,
      "manager.log_push_interval_s: must be at least 0.1 seconds", id="log-push-interval-tiny"),
    P("[production]\nwatch_s = 0.001\n" + MARK_PHASE, "production.watch_s: must be at least 0.2 seconds",
      id="watch-s-tiny"),
    # -- a deadline and a window have the timeouts' floor: timeout_s = 1e-9 killed its command at once
    P(bad_phase("timeout_s = 1e-9"), "phases[1] (b).timeout_s: must be at least 0.1 seconds", id="timeout-tiny"),
    P(bad_phase('progress_path = "/p"\nprogress_total = "1GiB"\nprogress_deadline_s = 1e-320'),
      "phases[1] (b).progress_deadline_s: must be at least 0.1 seconds", id="progress-deadline-tiny"),
    P(bad_phase('progress_path = "/p"\nprogress_total = "1GiB"\nprogress_window_s = 0.01'),
      "phases[1] (b).progress_window_s: must be at least 0.1 seconds", id="progress-window-tiny"),
    P("[manager]\nbench_deadline_s = 0.001\n" + MARK_PHASE, "manager.bench_deadline_s: must be 0 (no such clock) or "
      "at least 0.1 seconds", id="bench-deadline-tiny"),
    P("[production]\nproof_failure_window_s = 1e-9\n" + MARK_PHASE, "production.proof_failure_window_s: must be at "
      "least 0.1 seconds", id="proof-window-tiny"),
    # -- curio's metrics URL is read as a ready probe's http(s) URL: "nope" passed check, and every reading failed
    P('[production]\ncurio_metrics = "nope"\n' + MARK_PHASE, "production.curio_metrics: 'nope' must be an http:// or "
      "https:// URL with a host", id="curio-metrics-not-a-url"),
    P('[production]\ncurio_metrics = "ftp://x/y"\n' + MARK_PHASE, "production.curio_metrics: 'ftp://x/y' must be an "
      "http:// or https:// URL with a host", id="curio-metrics-ftp"),
    P('[production]\ncurio_metrics = "http:///debug/metrics"\n' + MARK_PHASE, "production.curio_metrics: "
      "'http:///debug/metrics' has no host", id="curio-metrics-no-host"),
    P('[production]\ncurio_metrics = "http://127.0.0.1:0/m"\n' + MARK_PHASE, "production.curio_metrics: "
      "'http://127.0.0.1:0/m': port 0 cannot be connected to", id="curio-metrics-port-0"),
    # -- curio's metrics are the proofs watch's one count of failed proofs: "" left it nothing to read, or cuzk's
    # /status alone, which counts no GPU failure (tests/prover/test_config_prover.py)
    P('[production]\ncurio_metrics = ""\n' + MARK_PHASE, "production.curio_metrics: \"\" is refused: curio's "
      "metrics are the proofs watch's one count of failed proofs", id="production-reads-nothing"),
    P('[cuzk]\nstatus_listen = ""\n[production]\ncurio_metrics = ""\n' + MARK_PHASE, "production.curio_metrics: \"\" "
      "is refused: curio's metrics are the proofs watch's one count of failed proofs",
      id="production-reads-nothing-either"),
    P(bad_phase('resume = "machine"\nresume_max_age_s = 1e9'), "phases[1] (b).resume_max_age_s: must be at most",
      id="resume-age-huge"),
    P(bad_daemon("ready_timeout_s = 1e9"), "phases[1] (b).daemons[0] (d).ready_timeout_s: must be at most",
      id="ready-timeout-huge"),
    P("[manager]\nbench_gate_s = 1e9\n" + MARK_PHASE, "manager.bench_gate_s: must be at most", id="bench-gate-huge"),
    P("[manager]\nrow_check_s = 1\n" + MARK_PHASE, "manager.row_check_s: must be at least 5 seconds (each look-up "
      "reads the whole fleet's GET /status), got 1", id="row-check-too-often"),
    P("[manager]\nrow_check_s = 0\n" + MARK_PHASE, "manager.row_check_s: must be > 0 seconds", id="row-check-zero"),
    P("[manager]\nbench_deadline_s = -1\n" + MARK_PHASE, "manager.bench_deadline_s:", id="bench-deadline-negative"),
    # -- NUL: no argument, environment value or path can hold one (check said ok, run crashed)
    P(bad_phase(command='["touch", "a\\u0000b"]'), "phases[1] (b).command[1]: contains a NUL", id="nul-in-command"),
    P(bad_phase('env = { A = "x\\u0000" }'), "phases[1] (b).env.A: contains a NUL", id="nul-in-env"),
    P(bad_phase('cwd = "/tmp/\\u0000"'), "phases[1] (b).cwd: contains a NUL", id="nul-in-cwd"),
    P(bad_phase('stall_s = 5\nprogress_path = "/tmp/\\u0000"'), "phases[1] (b).progress_path: contains a NUL",
      id="nul-in-progress-path"),
    P(sup_section('cgroup_root = "/sys\\u0000"'), "supervisor.cgroup_root: contains a NUL", id="nul-in-cgroup-root"),
    P(sup_section('termination_log = "/dev/x\\u0000"'), "supervisor.termination_log: contains a NUL",
      id="nul-in-termination-log"),
    P('#raw\n[supervisor]\nstate_dir = "/tmp/\\u0000x"\n' + MARK_PHASE, "supervisor.state_dir: contains a NUL",
      id="nul-in-state-dir"),
    P('#raw\n[supervisor]\nlog_dir = "/tmp/\\u0000x"\n' + MARK_PHASE, "supervisor.log_dir: contains a NUL",
      id="nul-in-log-dir"),
    P('[cuzk]\nparam_cache = "/p\\u0000"\n' + MARK_PHASE, "cuzk.param_cache: contains a NUL", id="nul-in-cuzk-path"),
    P(bad_phase('env = { "A\\u0000" = "x" }'), "phases[1] (b).env", id="nul-in-env-name"),
    # -- what the kernel cannot take
    P(bad_phase('resume = "machine"\n[[phases.daemons]]\nname = "d"\ncommand = ["true"]\nlifetime = "lifecycle"'),
      "phases[1] (b).resume: a phase resumed as done starts no children", id="resume-with-a-lifecycle-daemon"),
    # A service runs on beside the phases after it: a later daemon on its ready port would fail port_in_use.
    P(bad_phase('ready = "tcp://127.0.0.1:18707"', kind="service") + '[[phases]]\nname = "job"\ncommand = ["true"]\n'
      '[[phases.daemons]]\nname = "d"\ncommand = ["true"]\nready = "http://127.0.0.1:18707/"\n',
      "phases[2] (job).daemons[0] (d).ready: port 18707 is also the ready port of phases[1] (b): two children that "
      "run at once cannot both listen there", id="port-of-a-service-and-a-later-daemon"),
    P(bad_phase("restart_burst = 3"), 'phases[1] (b).restart_burst: only for kind = "service"',
      id="restart-burst-on-a-oneshot"),
    # A service's daemons are stopped with each of its attempts (its end, a restart): one kept for the lifecycle was
    # accepted, and stopped when the service ended cleanly while the phases after it still used it.
    P(bad_daemon('lifetime = "lifecycle"'), 'phases[1] (b).daemons[0] (d).lifetime: "lifecycle" is for a oneshot '
      "phase's daemons; a service's daemons live as long as it does", id="lifecycle-daemon-on-a-service"),
    # -- settle: a oneshot's daemons kept after its command (the prover's settle kind, "cuzk-pce")
    P(bad_phase('settle = "cuzk-pce"\n[[phases.daemons]]\nname = "d"\ncommand = ["true"]', kind="service"),
      'phases[1] (b).settle: only for kind = "oneshot"', id="settle-on-a-service"),
    P(bad_phase('settle = "cuzk-pce"'), "phases[1] (b).settle: needs a daemon", id="settle-without-a-daemon"),
    P(bad_phase('settle = "cuzk-pce"\n[[phases.daemons]]\nname = "d"\ncommand = ["true"]\nlifetime = "lifecycle"'),
      "phases[1] (b).settle: needs a daemon", id="settle-with-only-a-kept-daemon"),
    P(bad_phase('settle = "cuzk-pce"\nsettle_timeout_s = 0\n[[phases.daemons]]\nname = "d"\ncommand = ["true"]'),
      "phases[1] (b).settle_timeout_s:", id="settle-timeout-zero"),
    P(bad_phase("settle_timeout_s = 60"), "phases[1] (b).settle_timeout_s: only with settle",
      id="settle-timeout-without-settle"),
    P(bad_phase('settle = "pce"'), "phases[1] (b).settle: ", id="settle-unknown-kind"),
    # -- a key that tunes what another turns on, written without it: accepted, and it did nothing (one rule, as
    # settle_timeout_s's above)
    P(bad_phase("ready_timeout_s = 5"), 'phases[1] (b).ready_timeout_s: only for kind = "service" or a daemon, with '
      "ready (a oneshot is done when it exits 0)", id="ready-timeout-on-a-oneshot"),
    P(bad_phase("ready_timeout_s = 5", kind="service"), "phases[1] (b).ready_timeout_s: only with ready (it bounds "
      "the wait for it)", id="ready-timeout-without-ready"),
    P(bad_daemon("ready_timeout_s = 5"), "phases[1] (b).daemons[0] (d).ready_timeout_s: only with ready",
      id="daemon-ready-timeout-without-ready"),
    P(bad_phase('restart = "no"\nrestart_burst = 3', kind="service"), 'phases[1] (b).restart_burst: not with '
      'restart = "no" (it counts restarts)', id="restart-burst-without-restarts"),
    P(bad_phase('restart = "no"\nrestart_window_s = 60', kind="service"), "phases[1] (b).restart_window_s: not with "
      'restart = "no"', id="restart-window-without-restarts"),
    P(bad_phase('progress_path = "/p"\nprogress_total = "1GiB"\nprogress_window_s = 30'),
      "phases[1] (b).progress_window_s: only with progress_deadline_s", id="progress-window-without-a-deadline"),
    P(bad_phase("resume_max_age_s = 60"), 'phases[1] (b).resume_max_age_s: only with resume = "machine"',
      id="resume-max-age-without-resume"),
    P(bad_phase('resume = "outputs"\nprogress_path = "/p"\nresume_max_age_s = 60'),
      'phases[1] (b).resume_max_age_s: only with resume = "machine"', id="resume-max-age-with-outputs"),
    P(bad_phase("restart_window_s = 60"), 'phases[1] (b).restart_window_s: only for kind = "service"',
      id="restart-window-on-a-oneshot"),
    P(bad_phase('memory_max = "1GiB"\nmin_memory = "2GiB"'), "phases[1] (b).min_memory: 2.0GiB is above memory_max "
      "1.0GiB: the phase could never start", id="min-memory-above-memory-max"),
    # The phase's own cgroup is made only with cgroups = "auto": with "off" or "shared" its limit was never set,
    # said at run time while the phase allocated past it (with "auto" that stays the host's to decide)
    P('[supervisor]\ncgroups = "off"\n' + bad_phase('memory_max = "1GiB"'), 'phases[1] (b).memory_max: not with '
      'supervisor.cgroups = "off" (it is the limit of the phase\'s own cgroup, which only cgroups = "auto" makes)',
      id="memory-max-with-cgroups-off"),
    P('[supervisor]\ncgroups = "shared"\n' + bad_phase('memory_max = "1GiB"'), 'phases[1] (b).memory_max: not '
      'with supervisor.cgroups = "shared"', id="memory-max-with-cgroups-shared"),
    P(MARK_PHASE + '\n[[phases]]\nname = "supervisor"\ncommand = ["true"]\n', "phases[1] (supervisor): "
      "supervisor/supervisor's output would go to supervisor.log, the file of the supervisor's own lines",
      id="phase-named-like-the-supervisors-log"),
    P(MARK_PHASE + '\n[[phases]]\nname = "a"\ncommand = ["true"]\n[[phases.daemons]]\nname = "b"\n'
      'command = ["true"]\n\n[[phases]]\nname = "a.b"\ncommand = ["true"]\n',
      "phases[2] (a.b): a.b/a.b's output would go to a.b.log, the file of a/b", id="log-file-names-meet"),
    P('#raw\n[supervisor]\nstate_dir = "rel/state"\n' + MARK_PHASE,
      "supervisor.state_dir: 'rel/state' is not an absolute path", id="state-dir-relative"),
    P('#raw\n[supervisor]\nstate_dir = "/tmp/' + "d" * 100 + '"\n' + MARK_PHASE,
      "supervisor.state_dir: too long for the status socket", id="state-dir-too-long-for-socket"),
    # A log_dir within PATH_MAX whose log files are not: each open failed (File name too long), every line dropped.
    P(f'#raw\n[supervisor]\nlog_dir = "{LONG_DIR}"\n' + MARK_PHASE, "supervisor.log_dir: too long for its log "
      "files: supervisor.log.1 in it is a path of 4096 bytes, more than the 4095 a path may have",
      id="log-dir-too-long-for-its-logs"),
    P(f'#raw\n[supervisor]\nlog_dir = "{LONG_DIR[:-40]}"\n' + MARK_PHASE + '[[phases.daemons]]\nname = "'
      + "d" * 50 + '"\ncommand = ["true"]\n', "supervisor.log_dir: too long for its log files: mark." + "d" * 50
      + ".log.1 in it is a path of 4101 bytes", id="log-dir-too-long-for-a-daemons-log"),
    # -- a path read by the supervisor, or by another program from its own cwd, resolved against a cwd the file does
    # not know; a file written where a directory is (found when the write failed, after the parameter fetch)
    P('#raw\n[supervisor]\nlog_dir = "rel/logs"\n' + MARK_PHASE, "supervisor.log_dir: 'rel/logs' is not an "
      "absolute path", id="log-dir-relative"),
    # A directory the supervisor makes that cannot be one: found by check, not by a run that made state_dir first.
    P('#raw\n[supervisor]\nlog_dir = "/etc/passwd/logs"\n' + MARK_PHASE, "supervisor.log_dir: '/etc/passwd/logs' is "
      "under '/etc/passwd', which is a file, not a directory", id="log-dir-under-a-file"),
    P('#raw\n[supervisor]\nstate_dir = "/etc/passwd"\n' + MARK_PHASE, "supervisor.state_dir: '/etc/passwd' is a "
      "file, not a directory", id="state-dir-a-file"),
    P(sup_section('cgroup_root = "relative/cg"'), "supervisor.cgroup_root: 'relative/cg' is not an absolute path",
      id="cgroup-root-relative"),
    P(bad_phase('stall_s = 5\nprogress_path = "rel"'), "phases[1] (b).progress_path: 'rel' is not an absolute path",
      id="progress-path-relative"),
    P(sup_section('termination_log = "term.log"'), "supervisor.termination_log: 'term.log' is not an absolute path",
      id="termination-log-relative"),
    P(sup_section('termination_log = "/tmp"'), "supervisor.termination_log: '/tmp' is a directory; give the path of "
      "the termination log, a file", id="termination-log-a-directory"),
    P('[cuzk]\nconfig_path = "/tmp"\n' + MARK_PHASE, "cuzk.config_path: '/tmp' is a directory; give the path of "
      "cuzk.toml, a file", id="cuzk-config-path-a-directory"),
    # A device, a FIFO or a socket there was replaced by cuzk.toml (a rename over it: /dev/null itself, as root), or
    # hung the termination log's write.
    P(sup_section('termination_log = "/dev/null"'), "supervisor.termination_log: '/dev/null' is not a regular file "
      "(a device, a FIFO or a socket)", id="termination-log-a-device"),
    P('[cuzk]\nconfig_path = "/dev/null"\n' + MARK_PHASE, "cuzk.config_path: '/dev/null' is not a regular file",
      id="cuzk-config-path-a-device"),
    P('[cuzk]\nconfig_path = "/etc/passwd/cuzk/cuzk.toml"\n' + MARK_PHASE, "cuzk.config_path: "
      "'/etc/passwd/cuzk/cuzk.toml' is under '/etc/passwd', which is a file, not a directory",
      id="cuzk-config-path-under-a-file"),
    P('[cuzk]\nconfig_path = "cuzk.toml"\n' + MARK_PHASE, "cuzk.config_path: 'cuzk.toml' is not an absolute path",
      id="cuzk-config-path-relative"),
    P('[cuzk]\nparam_cache = "params"\n' + MARK_PHASE, "cuzk.param_cache: 'params' is not an absolute path",
      id="cuzk-param-cache-relative"),
    P(bad_phase('cwd = "/tmp/' + "n" * 256 + '"'), "phases[1] (b).cwd:", id="path-name-too-long"),
    P(bad_phase('cwd = "' + "/abc" * 1100 + '"'), "phases[1] (b).cwd: a path longer than", id="path-too-long"),
    P(bad_phase(command='["true", "' + "x" * 131072 + '"]'), "phases[1] (b).command[1]: longer than",
      id="argument-too-long"),
    # -- nesting
    P(MARK_PHASE + "x = " + "[" * 30 + "]" * 30 + "\n", "phases[0] (mark).x", id="nesting-30-deep"),
    # -- typos with a deleted letter
    P(bad_phase("timout_s = 3"), "phases[1] (b).timout_s: unknown key (did you mean 'timeout_s'?)",
      id="typo-deleted-letter-timeout"),
    P(bad_phase("backof_s = 3", kind="service"), "phases[1] (b).backof_s: unknown key (did you mean 'backoff_s'?)",
      id="typo-deleted-letter-backoff"),
    # -- [cuzk.overrides]: what cuzkconf.generate() reads is checked before anything starts
    P('[cuzk]\noverrides = { memory = { total_budget = "abc" } }\n' + MARK_PHASE,
      "cuzk.overrides.memory.total_budget:", id="override-budget-not-a-size"),
    P('[cuzk]\noverrides = { memory = { total_budget = 5 } }\n' + MARK_PHASE,
      "cuzk.overrides.memory.total_budget:", id="override-budget-number"),
    # An integer TOML cannot hold (Python's reader takes it): cuzk-daemon refused its whole config at its start.
    P('[cuzk]\noverrides = { gpus = { devices = [0, 99999999999999999999] } }\n' + MARK_PHASE,
      "cuzk.overrides.gpus.devices[1]: 99999999999999999999 does not fit a TOML integer (64 bits)",
      id="override-integer-beyond-64-bits"),
    P('[cuzk]\noverrides = { synthesis = { partition_workers = "x" } }\n' + MARK_PHASE,
      "cuzk.overrides.synthesis.partition_workers:", id="override-workers-string"),
    P('[cuzk]\noverrides = { pipeline = { synthesis_concurrency = 0 } }\n' + MARK_PHASE,
      "cuzk.overrides.pipeline.synthesis_concurrency:", id="override-concurrency-zero"),
    P('[cuzk]\noverrides = { pipeline = 3 }\n' + MARK_PHASE, "cuzk.overrides.pipeline: must be a table",
      id="override-pipeline-not-a-table"),
    P('[cuzk]\noverrides = { memory = [1] }\n' + MARK_PHASE, "cuzk.overrides.memory: must be a table",
      id="override-memory-not-a-table"),
    # -- any table generate() writes, replaced whole by a value that is no table ([srs] lost its param_cache)
    P('[cuzk]\noverrides = { srs = 5 }\n' + MARK_PHASE, "cuzk.overrides.srs: must be a table, got 5",
      id="override-srs-not-a-table"),
    P('[cuzk]\noverrides = { gpus = "x" }\n' + MARK_PHASE, "cuzk.overrides.gpus: must be a table, got 'x'",
      id="override-gpus-not-a-table"),
    P('[cuzk]\noverrides = { logging = [] }\n' + MARK_PHASE, "cuzk.overrides.logging: must be a table",
      id="override-logging-not-a-table"),
    # -- what the supervisor computes for a child, set in an env: last in its environment, it won without a word (a
    # bench count of 0 past bench_count's bound; an address other than the one the ready probe waited for)
    P("[cuzk]\n" + bad_phase('prepare = "cuzk-config"\nenv = { CUZK_BENCH_COUNT = "0" }'),
      'phases[1] (b).env.CUZK_BENCH_COUNT: prepare = "cuzk-config" sets this from [cuzk] bench_count; set that '
      "instead", id="env-sets-what-cuzk-config-sets"),
    P("[cuzk]\n" + bad_phase('prepare = "cuzk-config"\n[[phases.daemons]]\nname = "d"\ncommand = @MARK@\n'
                              'env = { CUZK_ADDR = "http://10.9.9.9:1" }'),
      'phases[1] (b).daemons[0] (d).env.CUZK_ADDR: prepare = "cuzk-config" sets this from [cuzk] listen; set that '
      "instead", id="daemon-env-sets-what-cuzk-config-sets"),
    # (FASTEST_FIRST would number the GPUs otherwise than cuzk.toml's [gpus] devices do; no key sets it)
    P("[cuzk]\n" + bad_phase('prepare = "cuzk-config"\nenv = { CUDA_DEVICE_ORDER = "FASTEST_FIRST" }'),
      'phases[1] (b).env.CUDA_DEVICE_ORDER: prepare = "cuzk-config" sets this from cuzk.toml\'s GPU numbering '
      "(PCI_BUS_ID, NVML's order); leave it out", id="env-sets-the-cuda-device-order"),
    # (RUST_LOG=warn there hid cuzk-daemon's PCE lines from the warm-up: its level is [cuzk.overrides]', or inherited)
    P("[cuzk]\n" + bad_phase('prepare = "cuzk-config"\nenv = { RUST_LOG = "warn" }'),
      'phases[1] (b).env.RUST_LOG: prepare = "cuzk-config" sets this from [cuzk.overrides] logging.level '
      "(cuzk-daemon's log filter, its PCE lines kept); set that instead", id="env-sets-the-cuzk-log-filter"),
    P("[cuzk]\noverrides = { logging = { level = 3 } }\n" + MARK_PHASE,
      'cuzk.overrides.logging.level: must be a level like "warn" or a filter like "warn,cuzk_core=debug", got 3',
      id="override-log-level-not-text"),
    P('[manager]\nurl = "http://127.0.0.1:9"\nlabel = "C.1"\n' + bad_phase('env = { INSTANCE_UUID = "fake" }'),
      "phases[1] (b).env.INSTANCE_UUID: the supervisor sets this from the manager's /register answer (uuid); leave "
      "it out", id="env-sets-the-managers-uuid"),
    P('[manager]\nurl = "http://127.0.0.1:9"\nlabel = "C.1"\n' + sup_section('env = { RUNNER_ID = "3" }'),
      "supervisor.env.RUNNER_ID: the supervisor sets this from the manager's /register answer (runner_id); leave "
      "it out", id="env-sets-the-managers-runner-id"),
    P('[cuzk]\noverrides = { srs = { param_cache = "/elsewhere" } }\n' + MARK_PHASE, "cuzk.overrides.srs.param_cache: "
      "set [cuzk] param_cache instead (the fitness checks of min_param_disk read that one, not cuzk.toml's)",
      id="override-srs-param-cache"),
]


def render(body: str, tmp_path: Path) -> Path:
    text = body.replace("@MARK@", sh(f"touch {tmp_path / 'marker'}"))
    if not text.startswith("#raw"):
        dirs = f"state_dir = {toml_str(str(tmp_path / 'state'))}\nlog_dir = {toml_str(str(tmp_path / 'logs'))}\n"
        if "[supervisor]\n" in text:
            text = text.replace("[supervisor]\n", "[supervisor]\n" + dirs, 1)
        else:  # at the end, so that bare top-level keys at the start stay top-level
            text = text + "\n[supervisor]\n" + dirs
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


def test_bad_config_table_is_big_enough() -> None:
    ids = [p.id for p in BAD_CONFIGS]
    assert len(ids) == len(set(ids)), "duplicate ids in BAD_CONFIGS"
    assert len(ids) >= 20


# The entries about the prover's sections need its plugin: only the command line (the composition root) loads it.
CORE_BAD_CONFIGS = [p for p in BAD_CONFIGS
                    if not any(s in p.values[0] for s in ("[cuzk", "[manager]", "[production]", '"cuzk-pce"'))]


@pytest.mark.parametrize(("body", "expected"), CORE_BAD_CONFIGS)
def test_bad_config_is_refused_by_load_plan(body: str, expected: str, tmp_path: Path) -> None:
    path = render(body, tmp_path)
    try:
        load_plan(path, None, environ={})
    except ConfigError as exc:
        message = str(exc)
    except Exception as exc:  # anything else would reach the user as a traceback
        pytest.fail(f"load_plan raised {type(exc).__name__}: {exc} instead of ConfigError naming {expected!r}")
    else:
        pytest.fail(f"load_plan accepted a bad config; expected an error naming {expected!r}:\n{path.read_text()}")
    assert "\n" not in message, f"error message is not one line: {message!r}"
    assert message.startswith(f"{path}: {expected}"), f"expected '{path}: {expected}...', got: {message}"


@pytest.mark.parametrize(("body", "expected"), BAD_CONFIGS)
def test_bad_config_cli_check_and_run_exit_2_and_start_nothing(body: str, expected: str, tmp_path: Path) -> None:
    path = render(body, tmp_path)
    results = cli_both(path)
    for result in results.values():
        assert_one_line_error(result, f"{PROG}: {path}: {expected}")
        assert result.stdout == "", f"nothing should go to stdout on a config error, got: {result.stdout!r}"
    assert not (tmp_path / "marker").exists(), "a phase command ran although the config is bad"
    assert not (tmp_path / "state").exists(), "state_dir was created although the config is bad"
    assert not (tmp_path / "logs").exists(), "log_dir was created although the config is bad"


DB_SECRET = "hunter2hunter2"


@pytest.mark.parametrize(("body", "said"), [
    ('[[phases]]\nname = "a"\ncommand = "psql --password=${DB_PASSWORD}"\n',
     "phases[0] (a).command: must be a list of strings (argv), not one string: 'psql --password=***'"),
    ('[supervisor.env]\nCURIO_DB_PASSWORD = { value = "${DBP}" }\n[[phases]]\nname = "a"\ncommand = ["true"]\n',
     "supervisor.env.CURIO_DB_PASSWORD: must be a string or number, got a table (not shown: the name looks secret)"),
    # DBP's name looks like nothing: its value is a secret as the config's CURIO_DB_PASSWORD, as the run masks it.
    ('[[phases]]\nname = "a"\ncommand = "psql --password=${DBP}"\n\n'
     '[[phases.daemons]]\nname = "d"\ncommand = ["true"]\nenv = { CURIO_DB_PASSWORD = "${DBP}" }\n',
     "phases[0] (a).command: must be a list of strings (argv), not one string: 'psql --password=***'"),
    ('[supervisor]\nstate_dir = "relative/${DB_PASSWORD}"\n[[phases]]\nname = "a"\ncommand = ["true"]\n',
     "supervisor.state_dir: 'relative/***' is not an absolute path"),
])
def test_a_config_error_never_shows_a_secret(body: str, said: str, tmp_path: Path) -> None:
    """A value is quoted in its refusal before the run knows its secrets: a secret from the environment, or the
    value of an env key with a secret-looking name, was printed on stderr. check, run and status mask it alike."""
    path = tmp_path / "c.toml"
    path.write_text(body)
    env = clean_env(DB_PASSWORD=DB_SECRET, DBP=DB_SECRET)
    results = [*cli_both(path, env).values()]
    if "state_dir" in said:
        results.append(cli("status", "--config", str(path), env=env))
    for result in results:
        assert_one_line_error(result, f"{PROG}: {path}: {said}")
        assert DB_SECRET not in result.stderr + result.stdout


@pytest.mark.parametrize(("table", "target", "own"), [
    ("supervisor", "state/status.json", "status.json"),
    ("supervisor", "logs/supervisor.log", "supervisor.log"),
    ("cuzk", "logs/supervisor.log.1", "supervisor.log"),  # (rolled over: the log's older half)
    ("cuzk", "state/supervisor.lock", "supervisor.lock"),  # (replaced, it let a second supervisor run beside)
    ("cuzk", "state/outbox.sqlite3-wal", "outbox.sqlite3"),  # (replaced, the pending calls were lost)
    ("cuzk", "state/.resume.json.123.tmp", "resume.json"),
    ("cuzk", "state/given-up.json.C.1", "given-up.json"),
    ("cuzk", "linked/first-seen.json", "first-seen.json"),  # state_dir by another name
])
def test_a_file_the_supervisor_writes_is_never_one_of_its_own(table: str, target: str, own: str,
                                                              tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "state")
    path = tmp_path / target
    key = "termination_log" if table == "supervisor" else "config_path"
    body = (sup_section(f"{key} = {toml_str(str(path))}") if table == "supervisor"
            else f"[cuzk]\n{key} = {toml_str(str(path))}\n" + MARK_PHASE)
    config = render(body, tmp_path)
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: {table}.{key}: {shown(str(path))} is the supervisor's own "
                                      f"{own}; give ")
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize(("table", "target", "label"), [
    ("supervisor", "logs/mark.log", "mark/mark"),  # (a failure's verdict line replaced the output that told why)
    ("cuzk", "logs/mark.log", "mark/mark"),  # (cuzk.toml replaced an earlier phase's output)
    ("supervisor", "logs/mark.log.1", "mark/mark"),  # (rolled over)
    ("cuzk", "logs/mark.side.log", "mark/side"),  # (a daemon's)
])
def test_a_file_the_supervisor_writes_is_never_a_childs_log(table: str, target: str, label: str,
                                                           tmp_path: Path) -> None:
    path = tmp_path / target
    key = "termination_log" if table == "supervisor" else "config_path"
    daemon = '[[phases.daemons]]\nname = "side"\ncommand = ["sleep", "1"]\n'
    body = (sup_section(f"{key} = {toml_str(str(path))}") if table == "supervisor"
            else f"[cuzk]\n{key} = {toml_str(str(path))}\n" + MARK_PHASE) + daemon
    config = render(body, tmp_path)
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: {table}.{key}: {shown(str(path))} is the log file of "
                                      f"{label}; give ")
    assert not (tmp_path / "marker").exists()


# Each was taken by check: the start failed after making both (blaming state_dir), or a file was never written.
@pytest.mark.parametrize(("state", "logs", "said"), [
    ("state", "state/supervisor.lock", "log_dir: {logs} is the supervisor's own supervisor.lock"),
    ("state", "state/status.json", "log_dir: {logs} is the supervisor's own status.json"),
    ("state", "state/resume.json", "log_dir: {logs} is the supervisor's own resume.json"),
    ("logs/supervisor.log", "logs", "state_dir: {state} is the supervisor's own supervisor.log"),
    ("logs/mark.log", "logs", "state_dir: {state} is the log file of mark/mark"),
])
def test_state_dir_and_log_dir_are_never_each_others_files(state: str, logs: str, said: str,
                                                          tmp_path: Path) -> None:
    paths = {"state": shown(str(tmp_path / state)), "logs": shown(str(tmp_path / logs))}
    config = render(f"#raw\n[supervisor]\nstate_dir = {toml_str(str(tmp_path / state))}\n"
                    f"log_dir = {toml_str(str(tmp_path / logs))}\n" + MARK_PHASE, tmp_path)
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: supervisor.{said.format(**paths)}; give ")
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()
    assert not (tmp_path / "marker").exists()


# Each was taken: the supervisor's own writes (supervisor.log, status.json) then counted as the phase's progress (the
# stall never fired; resume = "outputs" took them for outputs, changed at every start), or made its child ready.
@pytest.mark.parametrize(("lines", "said"), [
    ('progress_path = "{root}"', "progress_path: {root} holds supervisor.state_dir {state}: "),
    ('progress_path = "{root}/logs"', "progress_path: {logs} is supervisor.log_dir {logs}: "),
    ('progress_path = "{root}/logs/b.log"', "progress_path: {logs_b} is the log file of b/b; give "),
    ('kind = "service"\nready = "{root}/state/status.json"',
     "ready: {status} is in supervisor.state_dir {state}: the supervisor's own files would count as the child's "
     "ready file"),
    ('kind = "service"\nready = "file://{root}/logs"', "ready: {logs} is supervisor.log_dir {logs}: "),
    ('[[phases.daemons]]\nname = "d"\ncommand = ["sleep", "9"]\nready = "{root}/logs/up"',
     "daemons[0] (d).ready: {up} is in supervisor.log_dir {logs}: "),
])
def test_what_tells_how_a_phase_does_is_not_where_the_supervisor_writes(lines: str, said: str,
                                                                        tmp_path: Path) -> None:
    paths = {"root": shown(str(tmp_path)), "state": shown(str(tmp_path / "state")),
             "logs": shown(str(tmp_path / "logs")), "logs_b": shown(str(tmp_path / "logs/b.log")),
             "status": shown(str(tmp_path / "state/status.json")), "up": shown(str(tmp_path / "logs/up"))}
    config = render(bad_phase(lines.format(root=tmp_path)), tmp_path)
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: phases[1] (b).{said.format(**paths)}")
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()
    assert not (tmp_path / "marker").exists()


def test_a_download_or_a_ready_file_below_state_dir_is_its_own(tmp_path: Path) -> None:
    # The supervisor writes nothing below state_dir or log_dir: a directory there is the phase's alone.
    plan = parse(f"""
        [supervisor]
        state_dir = "{tmp_path}/state"
        log_dir = "{tmp_path}/state/logs"
        [[phases]]
        name = "a"
        command = ["true"]
        progress_path = "{tmp_path}/state/params"
        [[phases]]
        name = "b"
        kind = "service"
        command = ["true"]
        ready = "{tmp_path}/state/params/up"
    """)
    assert plan.phases[0].progress_path == f"{tmp_path}/state/params"


def test_the_profiles_progress_path_over_state_dir_names_both_variables() -> None:
    line = assert_one_line_error(cli("check", env=clean_env(FIL_PROOFS_PARAMETER_CACHE="/data",
                                                            SUPERVISOR_STATE_DIR="/data/state",
                                                            SUPERVISOR_LOG_DIR="/var/log/x")),
                                 f"{PROG}: built-in prover profile: phases[0] (paramfetch).progress_path: ")
    assert line.endswith(" holds supervisor.state_dir '/data/state': the supervisor's own files would count as the "
                         "phase's (from $FIL_PROOFS_PARAMETER_CACHE; supervisor.state_dir from $SUPERVISOR_STATE_DIR)"
                         ), line


@pytest.mark.parametrize(("key", "under"), [("state_dir", ""), ("log_dir", ""), ("state_dir", "/sub")])
def test_a_dir_that_is_a_link_to_nothing_is_refused_by_check_as_by_run(key: str, under: str, tmp_path: Path) -> None:
    """check took a state_dir or log_dir that is a symbolic link to nothing (it followed the link), and run then
    refused it ("cannot use …: not a directory"): mkdir cannot make a link's target. Both refuse it in the same
    line; a path under such a link too."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    dirs = {"state_dir": tmp_path / "state", "log_dir": tmp_path / "logs", key: Path(f"{link}{under}")}
    config = render("#raw\n[supervisor]\n" + "".join(f"{k} = {toml_str(str(v))}\n" for k, v in dirs.items())
                    + MARK_PHASE, tmp_path)
    gone = f"a symbolic link to {shown(str(tmp_path / 'gone'))}, which does not exist"
    said = f"is under {shown(str(link))}, which is {gone}" if under else f"is {gone}"
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: supervisor.{key}: {shown(str(dirs[key]))} {said}")
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()
    assert not (tmp_path / "gone").exists() and not (tmp_path / "marker").exists()


@pytest.mark.parametrize("logs", ["state", "state/logs"])
def test_log_dir_may_be_state_dir_or_inside_it(logs: str, tmp_path: Path) -> None:
    config = render(f"#raw\n[supervisor]\nstate_dir = {toml_str(str(tmp_path / 'state'))}\n"
                    f"log_dir = {toml_str(str(tmp_path / logs))}\n" + MARK_PHASE, tmp_path)
    assert cli("check", "--config", str(config)).returncode == 0


@pytest.mark.parametrize(("target", "said"), [
    ("state/supervisor.lock", "is the supervisor's own supervisor.lock; give cuzk's socket"),  # (a second ran beside)
    ("logs/mark.log", "is the log file of mark/mark; give cuzk's socket"),
    ("state/cuzk.toml", "is config_path too: cuzk-daemon removes"),  # (config_path's default)
    ("bad.toml", "is a file, not a socket: cuzk-daemon removes"),  # (the config: gone after the run)
    ("state", "is a directory, not a socket"),
])
def test_cuzks_socket_path_is_never_a_file_of_the_supervisor(target: str, said: str, tmp_path: Path) -> None:
    """cuzk-daemon removes what is at a unix:// listen path before it binds and as it stops: the supervisor's lock
    (a second supervisor then started beside the first), the config file, a child's log."""
    (tmp_path / "state").mkdir()
    path = tmp_path / target
    config = render(f'[cuzk]\nlisten = {toml_str(f"unix://{path}")}\nstatus_listen = ""\n' + MARK_PHASE, tmp_path)
    text = config.read_text()
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: cuzk.listen: {shown(str(path))} {said}")
    assert config.read_text() == text and not (tmp_path / "marker").exists()


def test_cuzks_socket_path_may_hold_a_stale_socket(tmp_path: Path) -> None:
    """What an earlier daemon left (killed before it could remove it) is the daemon's to replace."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "cuzk.sock"))
    stale.close()
    config = render(f'[cuzk]\nlisten = {toml_str(f"unix://{tmp_path}/cuzk.sock")}\n' + MARK_PHASE, tmp_path)
    assert cli("check", "--config", str(config)).returncode == 0


@pytest.mark.parametrize("table", ["supervisor", "cuzk"])
def test_a_file_the_supervisor_writes_is_never_the_config_itself(table: str, tmp_path: Path) -> None:
    """A failure's termination log written over the config left it holding one verdict line, and the next start
    refused it as not TOML."""
    config = tmp_path / "bad.toml"
    key = "termination_log" if table == "supervisor" else "config_path"
    body = (sup_section(f"{key} = {toml_str(str(config))}") if table == "supervisor"
            else f"[cuzk]\n{key} = {toml_str(str(config))}\n" + MARK_PHASE)
    assert render(body, tmp_path) == config
    text = config.read_text()
    for result in cli_both(config).values():
        assert_one_line_error(result, f"{PROG}: {config}: {table}.{key}: {shown(str(config))} is the config file "
                                      "itself; give ")
    assert config.read_text() == text and not (tmp_path / "marker").exists()


def test_unset_var_message_names_variable_and_suggests_default() -> None:
    message = parse_error("""\
        [[phases]]
        name = "p"
        command = ["x", "--size", "${SECTOR_SIZE}"]
        """)
    assert message.startswith("test.toml: phases[0] (p).command[2]: ")
    assert "${SECTOR_SIZE}" in message
    assert "${SECTOR_SIZE:-" in message, f"should suggest giving a default: {message}"


def test_a_huge_variable_name_is_shown_cut() -> None:
    """An unset ${VAR} of 100 KB made an error line of 200 KB, a token_env of 100 KB one of 100 KB."""
    name = "A" * 100_000
    unset = parse_error(f'[[phases]]\nname = "p"\ncommand = ["x"]\ncwd = "${{{name}}}"\n')
    token = parse_error(f'[manager]\nurl = "http://h:1"\nlabel = "C.1"\ntoken_env = "{name}"\n'
                        '[[phases]]\nname = "p"\ncommand = ["x"]\n')
    assert unset.startswith("test.toml: phases[0] (p).cwd: ${AAA") and "is not set" in unset and len(unset) < 300
    assert token.startswith("test.toml: manager.token_env: $AAA") and len(token) < 200, token


def test_unset_var_in_supervisor_dirs_names_the_key() -> None:
    message = parse_error("""\
        [supervisor]
        log_dir = "${LOGS}/x"
        [[phases]]
        name = "p"
        command = ["x"]
        """)
    assert message.startswith("test.toml: supervisor.log_dir: ${LOGS} is not set")


# ---------------------------------------------------------------- files that cannot be read


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_config_file_exit_2_one_line(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(ConfigError, match="no such file" if kind == "missing" else "cannot read"):
        load_plan(path)
    for result in cli_both(path).values():
        line = assert_one_line_error(result, f"{PROG}: {path}: ")
        assert ("no such file" if kind == "missing" else "cannot read") in line


def test_run_reads_supervisor_config_from_environment(tmp_path: Path) -> None:
    path = render(bad_phase("retries = -3"), tmp_path)
    result = cli("run", env=clean_env(SUPERVISOR_CONFIG=str(path)))
    assert_one_line_error(result, f"{PROG}: {path}: phases[1] (b).retries:")
    assert not (tmp_path / "marker").exists()
    assert not (tmp_path / "logs").exists()


def test_run_supervisor_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    result = cli("run", env=clean_env(SUPERVISOR_CONFIG=str(path)))
    assert_one_line_error(result, f"{PROG}: {path}: no such file")


def test_run_config_option_beats_environment(tmp_path: Path) -> None:
    bad = render(bad_phase("retries = -3"), tmp_path)
    result = cli("run", "--config", str(bad), env=clean_env(SUPERVISOR_CONFIG=str(tmp_path / "other.toml")))
    assert_one_line_error(result, f"{PROG}: {bad}: phases[1] (b).retries:")


# ---------------------------------------------------------------- the command line itself


def test_unknown_subcommand_exit_2() -> None:
    result = cli("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "frobnicate" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["frobnicate"], "prover-supervisor: argument COMMAND: invalid choice: 'frobnicate'"),
    (["status", "--watch", "--interval", "abc"], "prover-supervisor status: argument --interval: 'abc' is not a "
                                                 "number of seconds from 0.1 to 86400"),
    (["dev-manager", "--port", "abc"], "prover-supervisor dev-manager: argument --port: 'abc' is not a TCP port"),
    (["demo", "--fail", "explode"], "prover-supervisor demo: argument --fail: invalid choice: 'explode'"),
    (["standins"], "prover-supervisor standins: the following arguments are required: --bin-dir"),
    (["check", "--frob"], "prover-supervisor: unrecognized arguments: --frob"),
    # A command's option before it: its value was taken for the command (invalid choice: 'base.toml').
    (["--config", "base.toml", "check"], "prover-supervisor: --config goes after the command: "
                                         "`prover-supervisor check --config …`"),
    (["--config=base.toml"], "prover-supervisor: --config goes after a command (run, status, check): "
                             "e.g. `prover-supervisor run --config …`"),
    (["--state-dir", "/x", "status", "--json"], "prover-supervisor: --state-dir goes after the command: "
                                                "`prover-supervisor status --state-dir …`"),
])
def test_a_command_line_mistake_is_one_line_naming_it(args: list[str], said: str) -> None:
    # argparse's own form was its usage block, then the error: two or three lines for one mistake.
    result = cli(*args)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(said), result.stderr
    assert result.stderr.rstrip("\n").endswith("--help)"), result.stderr


def test_check_reads_the_config_run_would_read() -> None:
    # Without --config, $SUPERVISOR_CONFIG, else the built-in profile with this environment's ${VAR}s: what
    # `run` will run can be checked before it runs.
    result = cli("check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("built-in prover profile: ok: 4 phase(s): paramfetch (oneshot)"), result.stdout
    missing = "/nonexistent/prover.toml"
    assert_one_line_error(cli("check", env=clean_env(SUPERVISOR_CONFIG=missing)), f"{PROG}: {missing}: no such file")


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("PROVER_FETCH_STALL_S", "-1", "phases[0] (paramfetch).stall_s: must be > 0 seconds, got -1"),
    ("PROVER_FETCH_STALL_S", "ten", "phases[0] (paramfetch).stall_s: must be a number, got 'ten'"),
    ("SUPERVISOR_STATE_DIR", "var/state", "supervisor.state_dir: 'var/state' is not an absolute path"),
])
def test_a_refused_profile_value_names_its_variable(variable: str, value: str, said: str) -> None:
    # The built-in profile is a file the operator never wrote: the knob to turn is the variable.
    line = assert_one_line_error(cli("check", env=clean_env(**{variable: value})), f"{PROG}: built-in prover profile: ")
    assert said in line and line.endswith(f" (from ${variable})"), line


@pytest.mark.parametrize(("variable", "value"), [("PROVER_FETCH_DEADLINE_S", "5400.5"),
                                                 ("PROVER_SLOW_WINDOW_S", "1.5")])
def test_a_profile_seconds_variable_takes_a_fraction(variable: str, value: str) -> None:
    result = cli("check", env=clean_env(**{variable: value}))
    assert result.returncode == 0, result.stderr


def test_text_from_a_variable_is_the_number_or_boolean_it_spells(tmp_path: Path) -> None:
    body = sup_section('stop_grace_s = "${GRACE_S:-30}"\nconsole = "${CONSOLE:-false}"') + \
        '[[phases]]\nname = "b"\ncommand = ["true"]\nretries = "${RETRIES}"\n'
    result = cli("check", "--config", str(render(body, tmp_path)), env=clean_env(RETRIES="2"))
    assert result.returncode == 0, result.stderr
    plan = load_plan(render(body, tmp_path), environ={"RETRIES": "2", "GRACE_S": "7.5"})
    assert (plan.supervisor.stop_grace_s, plan.supervisor.console, plan.phases[1].retries) == (7.5, False, 2)
    written_text = render(sup_section('stop_grace_s = "30"'), tmp_path)
    assert_one_line_error(cli("check", "--config", str(written_text)),
                          f"{PROG}: {written_text}: supervisor.stop_grace_s: must be a number, got '30' "
                          "(text: write it without quotes)")


@pytest.mark.parametrize(("table", "key", "text", "wants"), [
    ("supervisor", "http_port", "8080", "a whole number"),
    ("supervisor", "require_gpus", "false", "true or false"),
    ("supervisor", "memory_warn", "0.9", "a number"),
    ("supervisor", "stop_budget_s", "8", "a number"),
    ("phase", "stall_s", "600", "a number"),
    ("phase", "gpu_health", "false", "true or false"),
    ("manager", "row_check_s", "30", "a number"),
])
def test_one_rule_for_text_on_every_number_or_boolean_key(tmp_path: Path, table: str, key: str, text: str,
                                                           wants: str) -> None:
    # Some keys took any text that spelled a number (a quoted one in the file too), the rest none: now text from
    # ${VAR} counts everywhere, and a quoted one in the file nowhere.
    def config(value: str) -> str:
        line = f"{key} = {value}\n"
        phase = '[[phases]]\nname = "b"\ncommand = ["true"]\n'
        if table == "phase":
            return phase + line
        manager = 'url = "http://127.0.0.1:9"\nlabel = "C.1"\n' if table == "manager" else ""
        return f"[{table}]\n{manager}{line}{phase}"

    where = f"phases[0] (b).{key}" if table == "phase" else f"{table}.{key}"
    with pytest.raises(ConfigError) as refused:
        parse_plan(config(f'"{text}"'), "t.toml", {})
    assert str(refused.value) == f"t.toml: {where}: must be {wants}, got '{text}' (text: write it without quotes)"
    parse_plan(config('"${V}"'), "t.toml", {"V": text})


def test_status_reads_only_the_state_dir_of_its_config(tmp_path: Path) -> None:
    # An operator's shell has neither the run's token nor its ${PROG}: status needs only the state_dir.
    state = tmp_path / "state"
    config = tmp_path / "run.toml"
    config.write_text(f"[supervisor]\nstate_dir = {toml_str(str(state))}\n"
                      '[manager]\nurl = "http://127.0.0.1:9"\ntoken_env = "MGR_TOKEN_UNSET"\n'
                      '[[phases]]\nname = "a"\ncommand = ["${PROG}"]\n')
    assert cli("check", "--config", str(config)).returncode == 2  # the whole config is not runnable here
    result = cli("status", "--config", str(config))
    assert result.returncode == 3, result.stderr  # no supervisor runs: said, not refused
    assert f"no answer on {state}/status.sock" in result.stdout, result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[supervisor]\nstate_dir = "${STATE:-relative/dir}"\n')
    assert_one_line_error(cli("status", "--config", str(bad)),
                          f"{PROG}: {bad}: supervisor.state_dir: 'relative/dir' is not an absolute path")


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"{PROG} {__version__}"


# ---------------------------------------------------------------- good configs

EXAMPLE = """\
[supervisor]
state_dir = "{state}"
log_dir = "{logs}"
stop_grace_s = 30

[[phases]]
name = "paramfetch"
kind = "oneshot"
command = ["curio", "fetch-params", "${{SECTOR_SIZE:-32GiB}}"]
timeout_s = 5100
retries = 2

[[phases]]
name = "bench"
kind = "oneshot"
command = ["cuzk-bench", "-a", "http://127.0.0.1:9820", "batch", "-t", "porep", "-c", "12", "-j", "5"]
timeout_s = 2520

  [[phases.daemons]]
  name = "cuzk-daemon"
  command = ["cuzk-daemon", "-c", "${{CUZK_CONFIG:-/data/zk/cuzk.toml}}"]
  ready = "http://127.0.0.1:9821/status"
  stop_signal = "SIGINT"

[[phases]]
name = "curio"
kind = "service"
command = ["curio", "run", "--layers", "gpu"]
restart = "on-failure"
"""


def test_check_accepts_example_config(tmp_path: Path) -> None:
    path = tmp_path / "example.toml"
    path.write_text(EXAMPLE.format(state=tmp_path / "state", logs=tmp_path / "logs"))
    result = cli("check", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert "ok" in out and "3 phase(s)" in out
    assert "paramfetch (oneshot)" in out and "bench (oneshot)" in out and "curio (service)" in out
    # check only validates: it creates nothing
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()


def test_check_accepts_builtin_profile_file() -> None:
    profile = REPO / "supervisor" / "prover" / "profile.toml"
    result = cli("check", "--config", str(profile))
    assert result.returncode == 0, result.stderr
    assert "paramfetch" in result.stdout and "bench" in result.stdout and "curio" in result.stdout


MINIMAL = """\
[[phases]]
name = "p"
command = ["true"]
"""


def test_defaults_applied() -> None:
    plan = parse(MINIMAL)
    sup = plan.supervisor
    assert (sup.state_dir, sup.log_dir) == (DEFAULT_STATE_DIR, DEFAULT_LOG_DIR)
    assert sup.stop_grace_s == DEFAULT_STOP_GRACE_S
    assert sup.ring_lines == DEFAULT_RING_LINES
    assert sup.console is True
    assert sup.log_file_max_bytes == DEFAULT_LOG_FILE_MAX_BYTES
    assert dict(sup.env) == {}
    (phase,) = plan.phases
    assert phase.kind == "oneshot"
    assert phase.retries == 0
    assert phase.timeout_s is None
    assert phase.daemons == ()
    assert (phase.backoff_s, phase.backoff_max_s, phase.backoff_factor, phase.backoff_jitter) == (
        DEFAULT_BACKOFF_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_FACTOR, DEFAULT_BACKOFF_JITTER)
    assert (phase.restart_burst, phase.restart_window_s, phase.backoff_reset_s) == (
        DEFAULT_RESTART_BURST, DEFAULT_RESTART_WINDOW_S, DEFAULT_BACKOFF_RESET_S)
    child = phase.command
    assert child.command == ("true",)
    assert child.stop_signal == signal.SIGTERM
    assert child.stop_grace_s == DEFAULT_STOP_GRACE_S
    assert child.ready is None and child.cwd is None
    assert child.ready_timeout_s == DEFAULT_READY_TIMEOUT_S
    assert child.exec_wait_s == DEFAULT_EXEC_WAIT_S
    assert (child.phase, child.name, child.label) == ("p", "p", "p/p")


def test_stop_grace_inherited_unless_set_per_child() -> None:
    plan = parse("""\
        [supervisor]
        stop_grace_s = 7

        [[phases]]
        name = "a"
        command = ["true"]

          [[phases.daemons]]
          name = "inherits"
          command = ["sleep", "9"]

          [[phases.daemons]]
          name = "own"
          command = ["sleep", "9"]
          stop_grace_s = 0

        [[phases]]
        name = "b"
        kind = "service"
        command = ["true"]
        stop_grace_s = 2.5
        """)
    a, b = plan.phases
    assert a.command.stop_grace_s == 7
    assert [(d.name, d.stop_grace_s) for d in a.daemons] == [("inherits", 7), ("own", 0)]
    assert b.command.stop_grace_s == 2.5
    assert all(d.lifetime == "phase" and d.stop_signal == signal.SIGTERM for d in a.daemons)


@pytest.mark.parametrize("value", ['"SIGINT"', '"INT"', '"int"', '"sigint"', "2"])
def test_stop_signal_spellings(value: str) -> None:
    plan = parse(MINIMAL + f"stop_signal = {value}\n")
    assert plan.phases[0].command.stop_signal == signal.SIGINT == 2


@pytest.mark.parametrize(("value", "expected"), [
    ("SIGINT", 2), ("INT", 2), (2, 2), ("term", signal.SIGTERM), ("SIGKILL", signal.SIGKILL), (15, 15)])
def test_parse_signal(value: object, expected: int) -> None:
    assert parse_signal(value) == expected


@pytest.mark.parametrize("value", ["SIGFOO", "", "SIG_DFL", "SIG_IGN", 0, 999, -1, True, 2.0, None])
def test_parse_signal_rejects(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^where: "):
        parse_signal(value, "where")


@pytest.mark.parametrize(("url", "expected"), [
    ("tcp://127.0.0.1:9820", ReadyCheck("tcp", "127.0.0.1:9820", "127.0.0.1", 9820)),
    ("tcp://localhost:1", ReadyCheck("tcp", "localhost:1", "localhost", 1)),
    ("tcp://[::1]:65535", ReadyCheck("tcp", "[::1]:65535", "::1", 65535)),
    ("http://127.0.0.1:9821/status", ReadyCheck("http", "http://127.0.0.1:9821/status", "127.0.0.1", 9821)),
    ("http://example.com/health", ReadyCheck("http", "http://example.com/health", "example.com", 80)),
    ("https://example.com/health", ReadyCheck("http", "https://example.com/health", "example.com", 443)),
    ("/run/cuzk.ready", ReadyCheck("file", "/run/cuzk.ready")),
    ("file:///run/cuzk.ready", ReadyCheck("file", "/run/cuzk.ready")),
])
def test_ready_kinds(url: str, expected: ReadyCheck) -> None:
    # (A daemon and a service in phases one after the other: two children of one phase may not wait for one port.)
    plan = parse(f"""\
        [[phases]]
        name = "o"
        command = ["true"]

          [[phases.daemons]]
          name = "d"
          command = ["true"]
          ready = "{url}"

        [[phases]]
        name = "p"
        kind = "service"
        command = ["true"]
        ready = "{url}"
        """)
    assert plan.phases[1].command.ready == expected
    assert plan.phases[0].daemons[0].ready == expected


@pytest.mark.parametrize("url", ["http://user:s3cretpw@127.0.0.1:18794/", "https://user@example.com/health"])
def test_a_ready_url_with_a_user_or_password_is_refused_without_showing_it(url: str) -> None:
    # Accepted, the probe never sent them (HTTP 401 until the ready timeout) and the verdict line, in
    # supervisor.log, carried the password.
    with pytest.raises(ConfigError) as refused:
        parse(f'[[phases]]\nname = "p"\nkind = "service"\ncommand = ["true"]\nready = "{url}"\n')
    said = str(refused.value)
    assert said == ("test.toml: phases[0] (p).ready: the URL carries a user or password (user:password@), which "
                    "no probe sends and the log would show: leave it out"), said
    assert url not in said and "s3cretpw" not in said


def test_events_url_without_a_manager_is_refused() -> None:
    # Accepted, no event was ever shipped: the reporting, the event shipper with it, is off without a manager url.
    body = '[manager]\nevents_url = "http://127.0.0.1:18793/events"\n[[phases]]\nname = "p"\ncommand = ["true"]\n'
    assert parse_error(body) == ("test.toml: manager.events_url: needs manager.url (or $MANAGER_URL): without a "
                                 "manager no event is shipped")
    assert parse(body, {"MANAGER_URL": "http://127.0.0.1:1", "VAST_CONTAINERLABEL": "C.1"}).manager.events_url


def test_variable_expansion_everywhere() -> None:
    environ = {"ROOT": "/srv", "SIZE": "64GiB", "TOKEN": "s3cr3t", "EMPTY": ""}
    plan = parse("""\
        [supervisor]
        state_dir = "${ROOT}/state"
        log_dir = "${LOGS:-/tmp/logs}"
        env = { GLOBAL = "${ROOT:-/nope}" }

        [[phases]]
        name = "p"
        kind = "service"
        command = ["fetch", "${SIZE}", "${MISSING:-32GiB}", "cost=$$5", "$${SIZE}", "${EMPTY:-x}", "${NONE:-}"]
        cwd = "${ROOT}/work"
        env = { AUTH = "Bearer ${TOKEN}", LITERAL = "$$HOME" }

          [[phases.daemons]]
          name = "d"
          command = ["${ROOT}/bin/d"]
          ready = "${ROOT}/d.ready"
          env = { PORT = "${PORT:-9821}" }
        """, environ)
    sup = plan.supervisor
    assert sup.state_dir == "/srv/state"
    assert sup.log_dir == "/tmp/logs"
    assert sup.env["GLOBAL"] == "/srv"
    child = plan.phases[0].command
    # a set variable wins over its default, but an empty one is as unset (as a shell's and docker compose's
    # ${VAR:-default}): a template's empty field must not turn a program's name into ""
    assert child.command == ("fetch", "64GiB", "32GiB", "cost=$5", "${SIZE}", "x", "")
    assert child.cwd == "/srv/work"
    assert child.env["AUTH"] == "Bearer s3cr3t"
    assert child.env["LITERAL"] == "$HOME"
    daemon = plan.phases[0].daemons[0]
    assert daemon.command == ("/srv/bin/d",)
    assert daemon.ready == ReadyCheck("file", "/srv/d.ready")
    assert daemon.env["PORT"] == "9821"


def test_a_default_reads_as_a_plain_string_does() -> None:
    # "$$" in a default reached the child as "$$" (a plain string's gives "$"), and "$${" in one was refused
    # as no reference: a default is text like any, with only a reference within it refused.
    command = '["echo", "${A:-p$$w}", "${A:-a$${b}", "${A:-$$$}", "p$$w", "${A:-$${B}"]'
    plan = parse(MINIMAL.replace('["true"]', command), {})
    assert plan.phases[0].command.command == ("echo", "p$w", "a${b", "$$", "p$w", "${B")
    assert parse(MINIMAL.replace('["true"]', '["echo", "${A:-p$$w}"]'), {"A": "set"}).phases[0].command.command == (
        "echo", "set")
    assert parse_error(MINIMAL.replace('["true"]', '["echo", "${A:-$$${B}}"]')) == (
        "test.toml: phases[0] (p).command[1]: '${A:-$$${B}}' is not a ${NAME} or ${NAME:-default} reference (write "
        "$$ for a literal $, $${ for a shell's own ${)")


def test_expanded_values_are_not_expanded_again() -> None:
    plan = parse(MINIMAL.replace('["true"]', '["echo", "${A}"]'), {"A": "${B}"})
    assert plan.phases[0].command.command == ("echo", "${B}")


def test_env_layers_supervisor_phase_daemon() -> None:
    plan = parse("""\
        [supervisor]
        env = { LEVEL = "supervisor", ONLY_SUP = "s", SHARED = "sup" }

        [[phases]]
        name = "p"
        command = ["true"]
        env = { LEVEL = "phase", ONLY_PHASE = "p", SHARED = "phase" }

          [[phases.daemons]]
          name = "d"
          command = ["true"]
          env = { LEVEL = "daemon", ONLY_DAEMON = "d" }

        [[phases]]
        name = "q"
        command = ["true"]
        """)
    p, q = plan.phases
    assert dict(p.command.env) == {"LEVEL": "phase", "ONLY_SUP": "s", "SHARED": "phase", "ONLY_PHASE": "p"}
    assert dict(p.daemons[0].env) == {
        "LEVEL": "daemon", "ONLY_SUP": "s", "SHARED": "phase", "ONLY_PHASE": "p", "ONLY_DAEMON": "d"}
    assert dict(q.command.env) == {"LEVEL": "supervisor", "ONLY_SUP": "s", "SHARED": "sup"}


def test_plan_is_frozen() -> None:
    plan = parse(MINIMAL.replace('["true"]', '["true"]\nenv = { A = "1" }'))
    phase = plan.phases[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.phases = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.supervisor.stop_grace_s = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        phase.retries = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        phase.command.command = ("rm", "-rf", "/")  # type: ignore[misc]
    assert isinstance(plan.phases, tuple) and isinstance(phase.command.command, tuple)
    with pytest.raises(TypeError):
        phase.command.env["A"] = "2"  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.supervisor.env["A"] = "2"  # type: ignore[index]
    assert phase.command.env["A"] == "1"


def test_service_and_daemon_options_parse() -> None:
    plan = parse("""\
        [[phases]]
        name = "svc"
        command = ["true"]

          [[phases.daemons]]
          name = "svc.helper-1"
          command = ["true"]
          lifetime = "lifecycle"
          ready = "/run/svc-helper.ready"
          ready_timeout_s = 0.25
          stop_signal = 9

        [[phases]]
        name = "web"
        kind = "service"
        command = ["true"]
        restart = "always"
        backoff_s = 0
        backoff_max_s = 0
        backoff_factor = 1
        backoff_jitter = 1
        restart_burst = 1
        restart_window_s = 0.5
        """)
    # (the kept daemon is a oneshot's: a service's daemons stop with each of its attempts)
    svc, web = plan.phases
    assert (web.restart, web.backoff_s, web.backoff_max_s, web.backoff_factor, web.backoff_jitter) == (
        "always", 0, 0, 1, 1)
    assert (web.restart_burst, web.restart_window_s) == (1, 0.5)
    (d,) = svc.daemons
    assert (d.name, d.lifetime, d.ready_timeout_s, d.stop_signal, d.label) == (
        "svc.helper-1", "lifecycle", 0.25, signal.SIGKILL, "svc/svc.helper-1")


def test_numbers_and_booleans_in_env_become_strings() -> None:
    # A number's TOML text is lost: it is the fewest digits that read back as it, never an exponent (1e20 reached
    # the child as "1e+20", 1e-5 as "1e-05").
    plan = parse(MINIMAL + "env = { N = 5, F = 1.5, T = true, O = false, E = 6e8, W = 0.1e1, B = 1e20, S = 1e-5, "
                           "M = -2.5e-3, Z = -0.0 }\n")
    assert dict(plan.phases[0].command.env) == {"N": "5", "F": "1.5", "T": "1", "O": "0", "E": "600000000",
                                                "W": "1", "B": "100000000000000000000", "S": "0.00001",
                                                "M": "-0.0025", "Z": "0"}


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_an_env_value_that_is_no_finite_number_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^test\.toml: phases\[0\] \(p\)\.env\.A: must be a string or a "
                                          r"finite number, got -?(nan|inf)$"):
        parse(MINIMAL + f"env = {{ A = {value} }}\n")


def test_error_names_source() -> None:
    with pytest.raises(ConfigError, match=r"^my/config\.toml: phases\[0\] \(p\)\.retries: "):
        parse_plan(MINIMAL + "retries = -1\n", "my/config.toml", {})


# ---------------------------------------------------------------- bounds, digits, environment, hints


def test_bounds_accept_their_maximum() -> None:
    plan = parse(f"""\
        [supervisor]
        ring_lines = {MAX_RING_LINES}
        [[phases]]
        name = "p"
        command = ["true"]
        timeout_s = {MAX_SECONDS:.0f}
        retries = {MAX_RETRIES}
        min_memory = "1024TiB"
        """)
    assert plan.supervisor.ring_lines == MAX_RING_LINES
    assert plan.phases[0].timeout_s == MAX_SECONDS and plan.phases[0].retries == MAX_RETRIES
    assert plan.phases[0].min_memory == MAX_SIZE


def test_the_log_sizes_take_units_as_every_size_key_does() -> None:
    """log_file_max_bytes and log_backlog_bytes took whole numbers only: "64MiB", as every other size key takes it,
    was refused as "must be a whole number". 0 is still log_file_max_bytes's "never rolled"."""
    plan = parse('[supervisor]\nlog_file_max_bytes = "64MiB"\n[manager]\nlog_backlog_bytes = "1.5M"\n' + MINIMAL)
    # ("M" is MiB, as in every size)
    assert (plan.supervisor.log_file_max_bytes, plan.manager.log_backlog_bytes) == (64 << 20, 1536 << 10)
    plan = parse('[supervisor]\nlog_file_max_bytes = "${LOG_MAX}"\n' + MINIMAL, {"LOG_MAX": "1GiB"})
    assert plan.supervisor.log_file_max_bytes == 1 << 30
    assert parse("[supervisor]\nlog_file_max_bytes = 0\n" + MINIMAL).supervisor.log_file_max_bytes == 0
    assert parse("[supervisor]\nlog_file_max_bytes = 20000\n" + MINIMAL).supervisor.log_file_max_bytes == 20000


@pytest.mark.parametrize("digits", ["²", "١٢", "𝟗", "1²", " ", "0x50", "+80"])
def test_digits_from_the_environment_are_ascii_only(digits: str) -> None:
    message = parse_error(MINIMAL + '[supervisor]\nhttp_port = "${PORT}"\n', {"PORT": digits})
    assert message.startswith("test.toml: supervisor.http_port: must be a whole number"), message


@pytest.mark.parametrize("token", ["abc\ndef", "abc\rdef", "tök€n", "a\x7fb"])
def test_manager_token_that_no_header_can_carry_is_refused_unshown(token: str) -> None:
    message = parse_error('[manager]\ntoken_env = "MGR_TOKEN"\n' + MINIMAL, {"MGR_TOKEN": token})
    assert message.startswith("test.toml: manager.token_env: $MGR_TOKEN holds characters"), message
    assert token not in message and token[:3] not in message, "the token is a secret: never shown"


@pytest.mark.parametrize("environ", [{}, {"MGR_TOKEN": ""}], ids=["unset", "empty"])
def test_manager_token_env_naming_no_token_is_refused(environ: dict[str, str]) -> None:
    # A typo in the name sent every call without the token, without a word.
    message = parse_error('[manager]\nurl = "http://127.0.0.1:1"\nlabel = "C.1"\ntoken_env = "MGR_TOKEN"\n'
                          + MINIMAL, environ)
    assert message == "test.toml: manager.token_env: $MGR_TOKEN is not set (or empty): no token to send", message
    # No manager, nothing sent: a config that names a token for production runs locally without it.
    assert parse_plan('[manager]\ntoken_env = "MGR_TOKEN"\n' + MINIMAL, "test.toml", environ).manager.url is None


def test_manager_url_from_environment_checked() -> None:
    message = parse_error(MINIMAL, {"MANAGER_URL": "ftp://x"})
    assert message.startswith("test.toml: MANAGER_URL (environment): "), message


URL_PASSWORD = "s3cret-pw"


@pytest.mark.parametrize(("url", "said"), [
    ("ftp://h", "must be an http:// or https:// URL with a host"),
    ("http://", "must be an http:// or https:// URL with a host"),
    ("http:///path", "must be an http:// or https:// URL with a host"),
    ("http://h?x=1", "has a query or fragment"), ("http://h/?", "has a query or fragment"),
    ("http://h#top", "has a query or fragment"),
    ("http://h\t:1", "holds '\\t'"), ("http://h /x", "holds ' '"), ("http://h/x\n", "holds '\\n'"),
    ("http://h\x7f", "holds '\\x7f'"), ("http://hé", "holds '\\xe9'"),
    ("http://h\\@evil", "holds '\\\\'"),
    ("http://h:99999", "Port out of range"), ("http://h:0", "port 0 cannot be connected to"),
    # urllib reads "00000080" as 80; a tcp:// probe refused it: one rule for every port
    ("http://h:00000080", "'http://h:00000080': the port has more than 5 digits (a port is 1-65535)"),
    (f"http://u:{URL_PASSWORD}@h:000080", "the port has more than 5 digits"),
    ("http://h:x", "not a valid URL"), ("http://[::1", "not a valid URL"),
    # A host no connect could reach passed check, and every call failed (LocationParseError) while the phases ran.
    ("http://h..:1", "'h..' is no host name"), ("http://" + "a" * 64 + ".example", "is no host name"),
    ("http://" + "a." * 130 + "b:80", "is no host name"), (f"http://u:{URL_PASSWORD}@.h", "'.h' is no host name"),
    ("http://user@h", "a user without a password (user@host) sends no credentials"),
    (f"http://u:{URL_PASSWORD}@h?x", "has a query or fragment"),
    (f"http://u:{URL_PASSWORD}@h:99999", "not a valid URL (Port out of range 0-65535)"),  # (said the password's)
    (f"http://u:{URL_PASSWORD}@h:port", "not a valid URL (Port could not be cast to integer value as 'port')"),
    (f"http://u:{URL_PASSWORD}/x@h", "not a valid URL (percent-encode any '/', '@' or ':'"),
    (f"http://u:{URL_PASSWORD}@h/a@b", "has an '@' after the host"),
    # A token with a '/' (base64) before the '@': urllib reads its start as the host, which a host check showed.
    (f"http://{URL_PASSWORD}+Zm9v/x@manager:8080", "has an '@' after the host"),
    (f"http://u:{URL_PASSWORD}@h\t", "holds '\\t'"),
])
@pytest.mark.parametrize("where", ["url", "events_url", "MANAGER_URL"])
def test_a_manager_url_a_call_would_get_wrong_is_refused_at_load(url: str, said: str, where: str) -> None:
    if where == "MANAGER_URL":
        message, named = parse_error(MINIMAL, {"MANAGER_URL": url}), "MANAGER_URL (environment)"
    else:
        message, named = parse_error(f"[manager]\n{where} = {toml_str(url)}\n" + MINIMAL), f"manager.{where}"
    assert message.startswith(f"test.toml: {named}: ") and said in message, message
    assert URL_PASSWORD not in message and "\n" not in message and "\t" not in message, message


def test_a_nul_in_a_manager_url_is_refused() -> None:
    """From TOML escapes (every config string is held to that), or from an environment a test made up."""
    assert "contains a NUL character" in parse_error('[manager]\nurl = "http://h\\u0000"\n' + MINIMAL)
    assert "MANAGER_URL (environment): 'http://h\\x00' holds '\\x00'" in parse_error(MINIMAL, {"MANAGER_URL": "http://h\0"})


@pytest.mark.parametrize(("url", "kept"), [
    ("http://127.0.0.1:1235", "http://127.0.0.1:1235"), ("https://mgr.example/api/v1/", "https://mgr.example/api/v1"),
    ("http://[::1]:1235", "http://[::1]:1235"), (f"http://fleet:{URL_PASSWORD}@h:1", f"http://fleet:{URL_PASSWORD}@h:1"),
    ("http://" + "a" * 63 + ".example.", "http://" + "a" * 63 + ".example."),
    ("http://fleet:p%40ss%2Fword@h", "http://fleet:p%40ss%2Fword@h"), ("HTTP://H:80", "HTTP://H:80"),
    ("http://h:00080", "http://h:00080"),  # (5 digits: as a tcp:// probe takes it)
])
def test_a_good_manager_url_is_kept(url: str, kept: str) -> None:
    assert parse(f"[manager]\nurl = {toml_str(url)}\n" + MINIMAL, {"VAST_CONTAINERLABEL": "C.1"}).manager.url == kept


def test_a_url_password_and_a_token_cannot_both_authorize() -> None:
    message = parse_error('[manager]\ntoken_env = "MGR_TOKEN"\n' + MINIMAL,
                          {"MANAGER_URL": f"http://u:{URL_PASSWORD}@h", "MGR_TOKEN": "tok-123"})
    assert message == ("test.toml: manager.token_env: the url carries a user:password too, and both would set the "
                       "Authorization header; give one of them")


@pytest.mark.parametrize(("events_url", "refused"), [
    (f"http://u:{URL_PASSWORD}@h:1235/ingest", True),  # the manager's own origin: the token goes there too
    (f"HTTP://u:{URL_PASSWORD}@H:1235", True),
    (f"http://u:{URL_PASSWORD}@h/ingest", False),  # port 80: another origin, which is never sent the token
    (f"https://u:{URL_PASSWORD}@h:1235", False),
    (f"http://u:{URL_PASSWORD}@loki.example:1235", False),
    ("http://h:1235/ingest", False),
])
def test_a_token_and_an_events_url_password_are_refused_only_where_both_are_sent(events_url: str,
                                                                                  refused: bool) -> None:
    body = f'[manager]\nurl = "http://h:1235"\ntoken_env = "MGR_TOKEN"\nevents_url = {toml_str(events_url)}\n'
    environ = {"MGR_TOKEN": "tok-123", "VAST_CONTAINERLABEL": "C.1"}
    if not refused:
        assert parse(body + MINIMAL, environ).manager.events_url == events_url
        return
    assert parse_error(body + MINIMAL, environ) == (
        "test.toml: manager.token_env: the events_url carries a user:password too, and is on the manager's own "
        "scheme, host and port, where the token is sent as well: both would set the Authorization header; give "
        "one of them")


@pytest.mark.parametrize(("environ", "table", "named"), [
    ({"VAST_CONTAINERLABEL": "C.\udcff\udcfe"}, "",
     "VAST_CONTAINERLABEL (environment): 'C.\\udcff\\udcfe' is not valid UTF-8"),
    ({"VAST_CONTAINERLABEL": "C.1\r\n2"}, "", "VAST_CONTAINERLABEL (environment): 'C.1\\r\\n2' holds a control"),
    ({"VAST_CONTAINERLABEL": "C." + "9" * 300}, "",
     "VAST_CONTAINERLABEL (environment): 302 characters, more than the 256"),
    ({"CONTAINER_ID": "\udcff"}, "", "CONTAINER_ID (environment): 'C.\\udcff' is not valid UTF-8"),
    ({"CONTAINER_ID": "1\x002"}, "", "CONTAINER_ID (environment): 'C.1\\x002' holds a control character"),
    ({}, 'label = "C.\\u0007"\n', "manager.label: 'C.\\x07' holds a control character"),
    ({}, 'label = "   "\n', "manager.label: '   ' is only spaces: it names no instance"),
    ({"L": "C.\udcff"}, 'label = "${L}"\n', "manager.label: 'C.\\udcff' is not valid UTF-8"),
])
def test_a_label_no_manager_call_can_carry_is_refused(environ: dict[str, str], table: str, named: str) -> None:
    message = parse_error(f"[manager]\nurl = \"http://h\"\n{table}" + MINIMAL, environ)
    assert message.startswith(f"test.toml: {named}"), message


def test_a_strange_label_without_a_manager_harms_nothing() -> None:
    assert parse(MINIMAL, {"VAST_CONTAINERLABEL": "C.\udcff"}).manager.url is None


def test_an_undecodable_label_from_the_environment_is_one_line_exit_2(tmp_path: Path) -> None:
    """os.environ holds the bytes as surrogate escapes: the outbox once raised UnicodeEncodeError on them."""
    config = tmp_path / "c.toml"
    config.write_text(f"[supervisor]\nstate_dir = {toml_str(str(tmp_path / 'state'))}\n"
                      '[manager]\nurl = "http://127.0.0.1:1"\n' + MINIMAL)
    env = {os.fsencode(k): os.fsencode(v) for k, v in clean_env().items()}
    env[b"VAST_CONTAINERLABEL"] = b"C.\xff\xfe"
    for sub in ("check", "run"):
        done = subprocess.run([PY, "-m", "supervisor", sub, "--config", str(config)], capture_output=True, text=True,
                              errors="replace", env=env, cwd=REPO, timeout=CLI_TIMEOUT_S)  # type: ignore[arg-type]
        assert_one_line_error(done, f"{PROG}: {config}: VAST_CONTAINERLABEL (environment): 'C.\\udcff\\udcfe' is "
                                    "not valid UTF-8")
    assert not (tmp_path / "state").exists(), "nothing may start on a config that is refused"


@pytest.mark.parametrize(("typo", "meant"), [
    ("timout_s", "timeout_s"), ("backof_s", "backoff_s"), ("retrys", "retries"), ("stal_s", "stall_s"),
    ("comand", "command"), ("progres_path", "progress_path"), ("restart_brust", "restart_burst"),
])
def test_did_you_mean_uses_edit_distance(typo: str, meant: str) -> None:
    message = parse_error(MINIMAL + f"{typo} = 1\n")
    assert message == f"test.toml: phases[0] (p).{typo}: unknown key (did you mean {meant!r}?)"


@pytest.mark.parametrize("keys", [
    'resume = "outputs"\nprogress_path = "/p"\n',  # the outputs found again under it
    'progress_path = "/p"\nprogress_total = "1GiB"\n',  # the download's figures walk it
    'progress_path = "/p"\n',  # (the prover's parameter cache, else unsaid, is the fetch's progress_path)
], ids=["resume-outputs", "progress-total", "alone"])
def test_progress_path_needs_no_stall_s(keys: str) -> None:
    """progress_path is read by resume = "outputs", the progress figures and a plugin, not by the stall watch
    alone: without stall_s it was refused "only meaningful with stall_s", and resume = "outputs", which needs it,
    needed stall_s too."""
    (phase,) = parse(MINIMAL + keys).phases
    assert phase.progress_path == "/p" and phase.stall_s is None


@pytest.mark.parametrize(("table", "meant"), [
    ('[[phase]]\nname = "q"\ncommand = ["true"]\n', "phases"), ("[supervisr]\n", "supervisor"),
    ("[managr]\n", "manager"),
])
def test_did_you_mean_for_a_top_level_table(table: str, meant: str) -> None:
    """A misspelt table was told the tables expected but not the near one, as a key in a table is."""
    typo = table.split("\n")[0].strip("[]")
    assert parse_error(MINIMAL + table) == f"test.toml: {typo}: unknown top-level key (did you mean {meant!r}?)"


def test_no_hint_for_a_key_like_none() -> None:
    assert parse_error(MINIMAL + "zzzzzz = 1\n") == "test.toml: phases[0] (p).zzzzzz: unknown key"


def test_a_very_long_unknown_key_is_shown_short() -> None:
    message = parse_error(MINIMAL + "k" * 5000 + " = 1\n")
    assert len(message) < 200 and message.endswith("...: unknown key"), message


def test_nesting_bound_names_where() -> None:
    message = parse_error(MINIMAL + "x = " + "[" * 40 + "]" * 40 + "\n")
    assert message.startswith("test.toml: phases[0] (p).x[0]") and f"nested more than {MAX_NESTING} deep" in message
    assert len(message) < 200


def test_nul_from_the_environment_cannot_come_but_from_toml_escapes_is_refused() -> None:
    message = parse_error('[[phases]]\nname = "p"\ncommand = ["true", "${A:-x\\u0000y}"]\n')
    assert message.startswith("test.toml: phases[0] (p).command[1]: contains a NUL")


def test_check_shows_an_odd_config_name_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a\nb.toml"
    path.write_text(MINIMAL)
    result = cli("check", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and "ok: 1 phase(s)" in result.stdout, result.stdout
    path.unlink()
    assert_one_line_error(cli("check", "--config", str(path)), f"{PROG}: {str(path)!r}: no such file")


def test_min_memory_equal_to_memory_max_is_taken() -> None:
    # Only above it could the phase never start (the bad-config table); all it may have is all it needs.
    phase = parse('[[phases]]\nname = "a"\ncommand = ["true"]\nmin_memory = "1GiB"\nmemory_max = "1GiB"\n').phases[0]
    assert phase.min_memory == phase.memory_max == 1 << 30


def test_memory_max_is_taken_where_a_phase_cgroup_may_be_made() -> None:
    # cgroups = "auto" (the default) makes the phase's own cgroup where the host allows: whether it does is known
    # only at run time, which says so when it cannot (the bad-config table has "off" and "shared").
    phase = '[[phases]]\nname = "a"\ncommand = ["true"]\nmemory_max = "1GiB"\n'
    for body in (phase, '[supervisor]\ncgroups = "auto"\n' + phase):
        assert parse(body).phases[0].memory_max == 1 << 30
    assert parse('[supervisor]\ncgroups = "off"\n[[phases]]\nname = "a"\ncommand = ["true"]\n').supervisor.cgroups == \
        "off"
