"""A deadline or a stall exits 124, as timeout(1) does, whatever the child did on the SIGTERM that ended it.

Before, the same timeout gave 143 (the child died of the SIGTERM), 137 (it ignored it and was killed
after the grace) or 1 (it trapped it and exited 1): a fleet could not tell "too slow" from a crash.
"""

from __future__ import annotations

import signal

import pytest
from helpers import Runner, one_verdict, py_script, read, toml_str, wait_for

from supervisor.exits import EXIT_FAILURE, EXIT_TIMEOUT
from supervisor.lifecycle.verdict import (
    GPU_FAULT,
    GPU_UNRESPONSIVE,
    SIGNAL,
    STALLED,
    TIMEOUT,
    TOO_SLOW,
    failure_status,
)

# How the child meets the SIGTERM that ends it, and the status it would have passed on before.
ON_TERM = {
    "dies": "pass",  # default action: killed by SIGTERM (143)
    "ignores": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",  # SIGKILLed after the grace (137)
    "exits-1": "signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))",  # its own exit 1
}


def test_the_status_of_a_timed_out_failure_is_timeouts() -> None:
    assert failure_status(TIMEOUT, 143) == EXIT_TIMEOUT == 124
    assert failure_status(STALLED, 1) == EXIT_TIMEOUT
    assert failure_status(TOO_SLOW, 143) == EXIT_TIMEOUT  # it could not make it in time: a timeout foreseen
    # A watcher's finding: the child's answer to being stopped for it (143, 0, 137) says nothing. A plugin's
    # reason exits with the status it registered (the prover's proofs_failing: tests/prover/test_production_rules.py).
    added = {"widget_jammed": EXIT_FAILURE}
    assert failure_status(GPU_FAULT, 143) == failure_status("widget_jammed", 0, added) == EXIT_FAILURE
    # NVML that stopped answering fails the attempt as a GPU gone does: it exited 143, the child's answer to the
    # SIGTERM, as if the container had been stopped (docs/verdicts.md lists it under 1).
    assert failure_status(GPU_UNRESPONSIVE, 143) == failure_status(GPU_UNRESPONSIVE, 137) == EXIT_FAILURE
    assert failure_status(SIGNAL, 143) == 143  # anything else passes the child's status on
    assert failure_status("widget_jammed", 143) == 143, "a reason nobody registered is anything else"
    assert failure_status(TIMEOUT, 143, {TIMEOUT: 1}) == EXIT_TIMEOUT, "a plugin cannot change the core's"


@pytest.mark.parametrize("on_term", sorted(ON_TERM))
@pytest.mark.parametrize("clock", ["timeout_s", "stall_s"])
def test_a_deadline_or_a_stall_exits_124(sup: Runner, clock: str, on_term: str) -> None:
    child = py_script(sup.tmp, "slow", f"""
        import signal, sys, time
        {ON_TERM[on_term]}
        print("started", flush=True)
        time.sleep(60)
    """)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {child}
        {clock} = 1
        stop_grace_s = 0.5
        """)
    result = sup.run(config, timeout=40)
    reason = "timeout" if clock == "timeout_s" else "stalled"
    assert f" reason={reason} " in one_verdict(result.output, "p", "p", kind="FAILED"), result.output
    assert result.returncode == EXIT_TIMEOUT, result.output


@pytest.mark.parametrize("clock", ["timeout_s", "stall_s"])
def test_a_stop_signal_during_the_grace_of_a_timed_out_child_keeps_124(sup: Runner, clock: str) -> None:
    # docker stop comes while the timed-out child, which ignores SIGTERM, runs out its grace: the timeout came
    # first and is the run's (124, the phase failed, the termination log says why), not the signal's 143.
    child = py_script(sup.tmp, "deaf", f"""
        import signal, time
        {ON_TERM["ignores"]}
        print("started", flush=True)
        time.sleep(60)
    """)
    termination = sup.tmp / "termination.log"
    termination.write_text("")  # (written only where it exists, as Kubernetes makes it)
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {child}
        {clock} = 1
        stop_grace_s = 30
        """)
    config.write_text(config.read_text().replace(
        "[supervisor]\n", f"[supervisor]\ntermination_log = {toml_str(str(termination))}\n", 1))
    proc = sup.start(config)
    log = sup.log_dir / "supervisor.log"
    wait_for(lambda: log.exists() and "phase p: running → stopping" in read(log), timeout=20)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=40)
    reason = "timeout" if clock == "timeout_s" else "stalled"
    assert proc.returncode == EXIT_TIMEOUT, out
    assert f"phase p: stopping → failed ({reason}: " in out and "(then supervisor shutdown)" in out, out
    # The verdict of the child's exit, which came after the signal: how it ended (SIGKILL after its grace).
    assert f"reason={reason} signal=SIGKILL" in read(termination), read(termination)
