"""A daemon kept from an earlier phase (``lifetime = "lifecycle"``) for the later ones: its bytes moved are a sign
of life of a later phase with stall_s, its output is not (evidence/stall.py, lifecycle/attempt.py's Watched).

The later phase is often a client of the daemon (cuzk-bench of cuzk-daemon, curio of it): the client waits in
silence while the daemon works, so the daemon's work must count, or a healthy phase is failed ``stalled``. But a
daemon's output (a heartbeat: a line, or a chatty log's bytes) is no work, and a later phase that hangs beside it
must still be stalled: the missed stall is the failure this project exists to end.

First the pure rules (``StallSigns``), then the real supervisor with real daemons and clients.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, Console, Runner, one_verdict, py_script, status_now, toml_list, verdict_fields, wait_for

from supervisor.evidence.iowatch import IoLedger, ProcIo, read_io
from supervisor.evidence.stall import IO_SIGN_MIN_BYTES, StallSigns, kept_sign
from supervisor.exits import EXIT_OK, EXIT_TIMEOUT

MIB = 1 << 20

# ================================================================ StallSigns, pure


def kept_watch(stall_s: float = 10.0) -> StallSigns:
    w = StallSigns(stall_s, started=100.0, gpus_visible=False, watches_path=False, watches_io=True,
                   kept=kept_sign(["a/worker"]))
    w.saw_io(0, readable=True, at=100.0)  # the phase's own trees: the baseline, and nothing after it
    return w


def test_a_kept_daemons_storage_bytes_are_a_sign_of_life() -> None:
    w = kept_watch()
    w.saw_kept_io(stored=5 * MIB, readable=True, at=101.0)  # the baseline: its work before the watch
    assert w.ages(101.0) == {"output": 1.0, "I/O": 1.0, "I/O of kept a/worker": 1.0}
    w.saw_kept_io(stored=6 * MIB, readable=True, at=108.0)  # 1 MiB written: work
    assert w.stalled(115.0) is None
    assert w.ages(115.0)["I/O of kept a/worker"] == 7.0
    assert w.stalled(118.0) == ("no output for 18.0s, no I/O for 18.0s, no I/O of kept a/worker for 10.0s "
                                "(no GPU visible)")


def test_a_kept_daemons_output_is_none_of_its_storage_bytes() -> None:
    """A chatty log into its pipe, and on through another process of its tree (``| tee``): rchar and wchar grow
    by each byte two or three times, read_bytes and write_bytes not at all."""
    ledger = IoLedger(from_zero=True)
    for n in range(1, 11):
        printed = n * 4 * IO_SIGN_MIN_BYTES
        ledger.add([ProcIo(10, 1, (0, printed, 0, 0)), ProcIo(11, 10, (printed, printed, 0, 0))])  # the daemon | cat
    assert ledger.moved == 3 * 40 * IO_SIGN_MIN_BYTES and ledger.stored == 0
    w = kept_watch()
    for at in range(101, 111):
        w.saw_kept_io(stored=ledger.stored, readable=True, at=float(at))
    assert w.stalled(110.0) == ("no output for 10.0s, no I/O for 10.0s, no I/O of kept a/worker for 10.0s "
                                "(no GPU visible)")


def test_a_kept_daemons_unreadable_counters_are_no_sign_and_no_silence() -> None:
    w = kept_watch()
    w.saw_kept_io(stored=0, readable=False, at=101.0)
    assert "I/O of kept a/worker" not in w.ages(101.0)


def test_the_kept_sign_names_its_daemons() -> None:
    assert kept_sign(["a/w"]) == "I/O of kept a/w"
    assert kept_sign(["a/w", "b/x"]) == "I/O of kept a/w and b/x"
    assert kept_sign(["a/w", "b/x", "b/y", "b/z"]) == "I/O of kept a/w and 3 more"


# ================================================================ the real supervisor


@pytest.fixture(autouse=True)
def _io_accounting() -> None:
    import os

    if read_io(os.getpid()) is None:
        pytest.skip("/proc/<pid>/io is not readable here (a kernel without task I/O accounting)")


def lifecycle_config(sup: Runner, daemon: str, command: str, stall_s: float) -> Path:
    config = sup.write(f"""
        [[phases]]
        name = "a"
        command = ["true"]

          [[phases.daemons]]
          name = "worker"
          command = {daemon}
          lifetime = "lifecycle"

        [[phases]]
        name = "b"
        stall_s = {stall_s}
        command = {command}
        """, stop_grace_s=1)
    config.write_text(config.read_text().replace("[supervisor]\n", "[supervisor]\nrequire_gpus = false\n", 1))
    return config


def test_a_later_phase_waiting_in_silence_on_a_kept_daemon_that_works_is_not_stalled(sup: Runner) -> None:
    """The reviewer's case: phase a keeps a worker that serves jobs (1 MiB written and a line each); phase b writes a
    request and waits for the answer quietly, for more than twice its stall_s. It was failed ``stalled`` after
    stall_s (``no output for 4.0s, no I/O for 4.0s``) while the worker went on working."""
    req = sup.tmp / "req"
    req.mkdir()
    worker = py_script(sup.tmp, "worker", f"""
        import os, time
        req = {str(req)!r}
        while not os.path.exists(os.path.join(req, "job")):
            time.sleep(0.1)
        for n in range(1, 11):
            with open(os.path.join(req, f"out.{{n}}"), "wb") as fh:
                fh.write(b"w" * {MIB})
            print(f"daemon: job {{n}}/10", flush=True)
            time.sleep(0.5)
        open(os.path.join(req, "answer"), "w").close()
        time.sleep(600)
        """)
    client = py_script(sup.tmp, "client", f"""
        import os, time
        req = {str(req)!r}
        open(os.path.join(req, "job"), "w").close()
        while not os.path.exists(os.path.join(req, "answer")):
            time.sleep(0.2)
        """)
    run = Console(sup, lifecycle_config(sup, worker, client, stall_s=2))
    signs: list[dict[str, Any]] = []

    def kept_sign_shown() -> bool:
        phases = status_now(sup).get("phases", [])
        b = next((p for p in phases if p.get("name") == "b"), {})
        stall = (b.get("timers") or {}).get("stall") or {}
        if "I/O of kept a/worker" in (stall.get("signs") or {}):
            signs.append(stall["signs"])
            return True
        return run.proc.poll() is not None

    wait_for(kept_sign_shown, 30, 0.3)
    code = run.finish(60)
    out = run.text()
    assert code == EXIT_OK, out
    assert "daemon: job 10/10" in out, out
    assert "reason=stalled" not in out, out
    assert verdict_fields(one_verdict(out, "b", "b"))["reason"] == "exit_code", out
    assert signs, f"status never showed the kept daemon's I/O among phase b's signs: {out[-3000:]}"


@pytest.mark.parametrize(("line", "every_s", "through"), [
    pytest.param("daemon: alive", 1.0, "", id="a line a second"),
    # A chatty log: 80 KiB a second into its pipe, more than IO_SIGN_MIN_BYTES between two readings of the I/O.
    pytest.param("x" * 4095, 0.05, "", id="80 KiB of lines a second"),
    # ... carried on by another process of its tree: each byte read and written again on its way.
    pytest.param("x" * 4095, 0.05, " | cat", id="80 KiB of lines a second, through cat"),
])
def test_a_kept_daemons_heartbeat_does_not_keep_a_hung_later_phase_alive(sup: Runner, line: str,
                                                                          every_s: float, through: str) -> None:
    py_script(sup.tmp, "beat", f"""
        import time
        while True:
            print({line!r}, flush=True)
            time.sleep({every_s})
        """)
    daemon = toml_list(["sh", "-c", shlex.join([PY, str(sup.tmp / "beat.py")]) + through])
    hung = py_script(sup.tmp, "hung", "import time\ntime.sleep(600)\n")
    result = sup.run(lifecycle_config(sup, daemon, hung, stall_s=2), timeout=40, name="console")
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out[-3000:]
    record = one_verdict(out, "b", "b")
    assert " reason=stalled " in record, record
    # The kept daemon's I/O was looked at, and was silent: its output is no work.
    assert "no I/O of kept a/worker for " in record, record
