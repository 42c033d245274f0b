"""Resume after a SIGKILL of the supervisor: nothing lost, nothing repeated in effect.

The demo lifecycle (stand-ins for paramfetch, cuzk-daemon + cuzk-bench, curio) with ``resume = "outputs"`` on the
fetch and ``resume = "machine"`` on the bench runs against the dev-manager; the supervisor is SIGKILLed mid-fetch,
mid-bench and in production, and started again on the same state_dir. Also: the bench's age and ``--rebench``,
a corrupt status.json where there is no resume.json yet (an upgrade reads an older supervisor's facts from it),
a corrupt outbox. resume.json itself: tests/test_resume_record.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import Console, Runner, sh, toml_str

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager


def instances(mgr: DevManager) -> list[dict[str, Any]]:
    return list(mgr.state.snapshot()["instances"].values())


def history(mgr: DevManager) -> list[str]:
    insts = instances(mgr)
    return insts[0]["history"] if len(insts) == 1 else []


# ---------------------------------------------------------------- the bench's age, --rebench


def counted(sup: Runner, name: str = "bench") -> int:
    path = sup.tmp / f"{name}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def bench_config(sup: Runner, max_age: float = 3600, first: str = "echo first") -> Path:
    return sup.write(f"""
        [[phases]]
        name = "first"
        command = {sh(first)}

        [[phases]]
        name = "bench"
        resume = "machine"
        resume_max_age_s = {max_age}
        command = {sh(f"echo bench ran >> {sup.tmp}/bench.count")}
        """, name=f"bench-{max_age}.toml")


def run_to_end(sup: Runner, config: Path, name: str, *args: str) -> str:
    run = Console(sup, config, name, args=args)
    status = run.finish()
    assert status == 0, run.text()
    return run.text()


def test_a_recent_bench_is_skipped_rebench_runs_it_an_old_one_runs(sup: Runner) -> None:
    config = bench_config(sup)
    run_to_end(sup, config, "one")
    assert counted(sup) == 1
    out = run_to_end(sup, config, "two")
    assert counted(sup) == 1, out
    assert re.search(r"phase bench: pending → done \(resumed: done \d+s before this start "
                     r"\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\) on this same machine "
                     r"\(use --rebench to run it anyway\)\)", out), out
    out = run_to_end(sup, config, "three", "--rebench")
    assert counted(sup) == 2, out
    time.sleep(0.6)
    out = run_to_end(sup, bench_config(sup, max_age=0.5), "four")
    assert counted(sup) == 3, out
    assert re.search(r"phase bench: done \d+s ago, older than resume_max_age_s: running it again", out), out


def test_a_rerun_that_fails_is_never_resumed_as_done(sup: Runner) -> None:
    # The bench passed, then a --rebench failed: the next start must run it again, not resume the old pass
    # (it would report the old rate and start production on a machine whose latest bench failed).
    fail = sup.tmp / "fail-the-bench"
    config = sup.write(f"""
        [[phases]]
        name = "bench"
        resume = "machine"
        command = {sh(f"echo bench ran >> {sup.tmp}/bench.count; test ! -e {fail}")}
        """, name="rerun.toml")
    run_to_end(sup, config, "passes")
    fail.touch()
    rebench = Console(sup, config, "rebench", args=("--rebench",))
    assert rebench.finish() == 1, rebench.text()
    again = Console(sup, config, "again")
    assert again.finish() == 1, again.text()
    assert "resumed" not in again.text(), again.text()
    assert counted(sup) == 3
    fail.unlink()
    run_to_end(sup, config, "passes-again")
    out = run_to_end(sup, config, "resumed")
    assert "phase bench: pending → done (resumed: done" in out, out
    assert counted(sup) == 4


def test_a_stop_before_the_bench_does_not_forget_that_it_passed(
        sup: Runner, orphans: Callable[[int], list[psutil.Process]]) -> None:
    """The bench passed; a later start is SIGKILLed in an earlier phase; the start after must still skip it."""
    gate = sup.tmp / "gate"
    config = bench_config(sup, first=f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done")
    gate.touch()
    run_to_end(sup, config, "one")
    assert counted(sup) == 1
    gate.unlink()
    two = Console(sup, config, "two")
    two.wait_text("[first/first] first")
    two.sigkill()
    for proc in orphans(two.pid):
        with contextlib.suppress(psutil.NoSuchProcess):  # its `sleep 0.05` may end between the listing and this
            proc.kill()
    gate.touch()
    out = run_to_end(sup, config, "three")
    assert counted(sup) == 1, f"the bench ran again although it passed on this machine just before:\n{out}"
    assert "phase bench: pending → done (resumed: done" in out, out


# ---------------------------------------------------------------- corrupt state


CORRUPT_STATE = {
    "garbage-bytes": b"\x00\xff\xfe garbage \x89PNG\r\n\x1a\n" * 20,
    "truncated-json": b'{"version": 1, "pid": 42, "phases": [{"name": "bench", "facts": {"done_at": 17',
    "json-list": b'[{"name": "bench"}]',
    "wrong-shape-phases": b'{"version": 1, "phases": 5}',
    "wrong-shape-facts": b'{"version": 1, "phases": [{"name": "bench", "facts": {"done_at": "yesterday"}}]}',
}


@pytest.mark.parametrize("kind", list(CORRUPT_STATE))
def test_a_corrupt_status_json_means_a_clean_start(sup: Runner, kind: str) -> None:
    """No resume.json: the facts an upgrade would read from status.json are damaged, so nothing resumes."""
    sup.state_dir.mkdir()
    (sup.state_dir / "status.json").write_bytes(CORRUPT_STATE[kind])
    config = bench_config(sup)
    result = sup.run(config, timeout=30)
    assert "Traceback" not in result.output, result.output
    assert result.returncode == 0, result.output
    said = [line for line in result.output.splitlines() if "starting clean" in line]
    assert len(said) == 1 and "status.json" in said[0], result.output
    assert counted(sup) == 1  # the bench ran: nothing was resumed from the corrupt file
    state = json.loads((sup.state_dir / "status.json").read_text())  # written afresh
    assert isinstance(state, dict) and state["lifecycle"]["state"] == "stopped"


def _foreign_outbox(path: Path, sql: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(sql)


# Each a file the outbox could not use: manager reporting was turned off at start ("it could not start"), or
# every call was failed by the sender's bug rule, and the phases ran without the manager knowing.
OUTBOXES = {
    "not-a-database": lambda path: path.write_bytes(b"this is not a database\x00\xff" * 100),
    "calls-of-another-program": lambda path: _foreign_outbox(path, "CREATE TABLE calls (x INTEGER);"),
    "calls-without-response": lambda path: _foreign_outbox(
        path, "CREATE TABLE calls (id INTEGER PRIMARY KEY, kind TEXT, payload TEXT, created REAL, state TEXT, "
              "attempts INTEGER, finished REAL, last_error TEXT);"),
}


@pytest.mark.parametrize("kind", sorted(OUTBOXES))
def test_a_corrupt_outbox_is_moved_aside_and_the_run_goes_on(sup: Runner, kind: str) -> None:
    mgr = dev_manager(quiet=True).start()
    try:
        sup.state_dir.mkdir()
        OUTBOXES[kind](sup.state_dir / "outbox.sqlite3")
        before = (sup.state_dir / "outbox.sqlite3").read_bytes()
        config = sup.write(f"""
            [manager]
            url = {toml_str(mgr.url)}
            label = "C.corrupt"

            [[phases]]
            name = "params"
            report = "param-done"
            command = {sh("echo params ok")}
            """)
        result = sup.run(config, timeout=30)
        assert result.returncode == 0, result.output
        assert "Traceback" not in result.output
        said = [line for line in result.output.splitlines() if "was unreadable" in line]
        assert len(said) == 1 and "moved to" in said[0] and "starting clean" in said[0], result.output
        aside = list(sup.state_dir.glob("outbox.sqlite3.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == before
        assert history(mgr) == ["registered", "params_done"]
    finally:
        mgr.stop()


def test_outputs_resume_a_phase_whose_progress_path_is_one_file(sup: Runner) -> None:
    # progress_path may name a file (docs/configuration.md): its outputs were never listed, so no start resumed it,
    # and nothing said why.
    params, runs = sup.tmp / "params.bin", sup.tmp / "runs"
    config = sup.write(f"""
        [[phases]]
        name = "fetch"
        command = {sh(f"echo run >> {runs}; printf 0123456789 > {params}")}
        progress_path = {toml_str(str(params))}
        resume = "outputs"
        stall_s = 60
        """)
    run_to_end(sup, config, "one")
    out = run_to_end(sup, config, "two")
    assert runs.read_text() == "run\n", out
    assert f"phase fetch: pending → done (resumed: its 1 output file(s) in {params} are all still there)" in out
    params.write_text("0123")  # not the file it left
    out = run_to_end(sup, config, "three")
    assert runs.read_text() == "run\nrun\n", out
    # Why it runs again, in one line (a re-fetch is tens of GiB): it ran again with nothing said.
    assert (f"phase fetch: 1 of another size (params.bin 10B, now 4B) of its 1 output file(s) in {params}: "
            "running it again") in out, out
