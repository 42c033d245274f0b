"""Knowing early when it cannot make it (issue 17): aria2c's lines read, the paramfetch stand-in fetching
with the real aria2c from a local HTTP server (or in its shape without it), a download that cannot make the
manager's clock given up, one that can left alone, a restart that keeps the clock, a bench cut once it
cannot pass any more."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import (
    PY,
    REPO,
    Runner,
    dead_gateway,
    failure,
    first_line,
    one_verdict,
    seconds_between,
    toml_list,
    toml_str,
)
from profilekit import parsed, standin_env

from supervisor.evidence.progress import tree_done
from supervisor.exits import EXIT_TIMEOUT
from supervisor.lifecycle.resume import output_files
from supervisor.lifecycle.states import PhaseState
from supervisor.prover.bench import BenchResult
from supervisor.prover.benchlimits import BenchCut, hopeless
from supervisor.prover.standins.paramserve import ParamServer
from supervisor.state import files as state_files
from supervisor.wiring import PhaseView

MIB = 1 << 20
ARIA2C = shutil.which("aria2c")


def _downloader() -> str:
    if ARIA2C is None:
        print("aria2c is not installed (Debian package aria2): the stand-in prints aria2c's lines itself")
        return "simulated"
    return "aria2c"


@pytest.fixture
def gateway() -> Any:
    server = ParamServer(20 * MIB).start()
    yield server
    server.close()


# ---------------------------------------------------------------- the lines


def test_aria2c_lines_give_the_bytes_of_the_file_under_way_and_of_those_complete() -> None:
    text = ("\n12/01 14:43:45 [\x1b[1;32mNOTICE\x1b[0m] Downloading 1 item(s)\n"
            "[#00ad52 16KiB/6.0MiB(0%) CN:1 DL:15KiB ETA:6m23s]\n"
            "[#00ad52 5.0MiB/6.0MiB(83%) CN:1 DL:854KiB ETA:1s]\n"
            "\n12/01 14:43:51 [\x1b[1;32mNOTICE\x1b[0m] Download complete: /p/a.params\n"
            "\nDownload Results:\ngid   |stat|avg speed  |path/URI\n======+====+===========+==========\n"
            "00ad52|OK  |   0.9MiB/s|/p/a.params\n\nStatus Legend:\n(OK):download completed.\n"
            "2026-12-01T14:44:52.853Z\tINFO\tparamfetch\tparamfetch.go:229\tParameter file /p/a.params is ok\n"
            "[#11aa22 8.2MiB/57MiB(14%) CN:1 DL:4.0MiB ETA:12s]\n"
            "12/01 14:44:00 [\x1b[1;31mERROR\x1b[0m] CUID#7 - Download aborted. URI=http://x\n")
    result = parsed("paramfetch", text)
    reading = result.progress()
    assert reading is not None
    assert reading.in_flight_bytes == int(8.2 * MIB)
    assert reading.done_bytes == 6 * MIB + int(8.2 * MIB)
    assert reading.done_files == 1
    assert result.last_error == "CUID#7 - Download aborted. URI=http://x"
    assert result.problem() is None
    assert parsed("paramfetch", "nothing of it").progress() is None


def test_files_fetched_at_once_are_each_read_by_their_own_gid(tmp_path: Path, gateway: Any) -> None:
    """curio runs one aria2c per file, all at once, on its one stdout: their block-buffered readouts come mixed.
    Read back, each file is complete at its own size (its gid's readout, named by its results row), not at
    the size of whichever readout came last."""
    how = _downloader()
    cache = tmp_path / "params"
    gateway._server.size = 3 * MIB
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_FILES="3", STANDIN_PARAM_BYTES="3MiB",
                      STANDIN_PARAM_RATE="1MiB", IPFS_GATEWAY=gateway.url, STANDIN_PARAM_DOWNLOADER=how)
    done = subprocess.run([PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"], env=env,
                          cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.decode(errors="replace")
    starts = [i for i, line in enumerate(lines.splitlines()) if "\tGET " in line]
    firsts = [i for i, line in enumerate(lines.splitlines()) if "Parameter file" in line and " is ok" in line]
    assert len(starts) == 3 and max(starts) < min(firsts), "every fetch begins before any ends: at once"
    result = parsed("paramfetch", lines)
    fetched = sorted(str(p) for p in cache.iterdir() if p.suffix in (".params", ".vk"))
    assert sorted(result.completed) == fetched and len(result.files) == 3, (how, result)
    for path, size in result.completed.items():  # (aria2c shows 3.0MiB; the stand-in's own lines alike)
        assert abs(size - 3 * MIB) <= 0.05 * MIB, (how, path, size)
    assert result.under_way == {}, result.under_way


def test_the_standin_fetches_like_curio_preallocated_with_a_control_file(tmp_path: Path, gateway: Any) -> None:
    how = _downloader()
    cache = tmp_path / "params"
    env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_FILES="1", STANDIN_PARAM_BYTES="8MiB",
                      STANDIN_PARAM_RATE="4MiB", IPFS_GATEWAY=gateway.url, STANDIN_PARAM_DOWNLOADER=how)
    # (aria2c preallocates files of 5 MiB and more: --no-file-allocation-limit)
    gateway._server.size = 8 * MIB
    proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen_control_with_full_size = False
    lone_file_judged = []  # the file judged on its own (a progress_path naming it), while it is under way
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        for control in cache.glob("*.aria2") if cache.is_dir() else ():
            target = control.with_suffix("")
            if target.exists() and target.stat().st_size == 8 * MIB:
                seen_control_with_full_size = True
                judged = (tree_done(target)[2:4], output_files(str(target)))
                if control.exists():  # (still under way after the look: the look saw it under way)
                    lone_file_judged.append(judged)
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert seen_control_with_full_size, f"no preallocated file with its .aria2 beside it ({how})"
    # Neither the download figures nor resume count the preallocated file as done while its .aria2 is there.
    assert lone_file_judged and all(j == ((0, 0), {}) for j in lone_file_judged), (how, lone_file_judged)
    assert not list(cache.glob("*.aria2"))
    result = parsed("paramfetch", out)
    assert result.readouts >= 1 and len(result.files) == 1, out


def one_file_fetch(tmp_path: Path, gateway: Any, how: str, mib: int, rate: str) -> dict[str, str]:
    """The environment of the paramfetch stand-in fetching one file of ``mib`` MiB at ``rate`` into tmp_path/params
    from the test's gateway, with ``how`` (the real aria2c: skipped where it is not installed)."""
    if how == "aria2c" and ARIA2C is None:
        pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it)")
    gateway._server.size = mib * MIB
    return standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), STANDIN_PARAM_FILES="1",
                       STANDIN_PARAM_BYTES=f"{mib}MiB", STANDIN_PARAM_RATE=rate, IPFS_GATEWAY=gateway.url,
                       STANDIN_PARAM_DOWNLOADER=how)


@pytest.mark.parametrize("how", ["simulated", "aria2c"])
def test_the_readout_reaches_a_pipe_in_one_burst_when_the_file_is_done(tmp_path: Path, gateway: Any,
                                                                       how: str) -> None:
    # The real aria2c's readout into a pipe is block-buffered (shared/domain/production.md); the stand-in's must be
    # too, or the supervisor is tested against a kinder program than the one it meets.
    env = one_file_fetch(tmp_path, gateway, how, 3, "1MiB")
    proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    arrivals: list[tuple[float, bytes]] = []  # (when, line), as the supervisor's reader would see them
    started = time.monotonic()
    for line in proc.stdout:
        arrivals.append((time.monotonic() - started, line))
    assert proc.wait(30) == 0, b"".join(line for _, line in arrivals)
    readouts = [at for at, line in arrivals if line.startswith(b"[#")]
    complete = next(at for at, line in arrivals if b"Download complete" in line)
    downloading = next(at for at, line in arrivals if b"Downloading 1 item" in line)
    assert len(readouts) >= 2, arrivals
    # About 3 s of download: the NOTICE at once, the readouts only with the file's end, all together.
    assert complete - downloading >= 2.0, arrivals
    assert min(readouts) >= complete - 0.5, f"a readout arrived before the file was done: {arrivals}"
    assert max(readouts) - min(readouts) < 0.5, arrivals


def summary_every(tmp_path: Path, seconds: int) -> dict[str, str]:
    """The environment that gives aria2c (the real one and the stand-in's) its ``--summary-interval`` as curio's gets
    one, which passes none: aria2c's configuration file (a home of its own, so no aria2.conf of the machine's)."""
    (tmp_path / "xdg" / "aria2").mkdir(parents=True)
    (tmp_path / "xdg" / "aria2" / "aria2.conf").write_text(f"summary-interval={seconds}\n")
    (tmp_path / "home").mkdir()
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def arrivals_of(proc: subprocess.Popen[bytes], seconds: float | None = None) -> list[tuple[float, bytes]]:
    """(when, line) of each line ``proc`` prints, as the supervisor's reader would see them: to its end, or for
    ``seconds`` and then it is stopped (SIGTERM)."""
    assert proc.stdout is not None
    arrivals: list[tuple[float, bytes]] = []
    started = time.monotonic()
    if seconds is not None:
        threading.Timer(seconds, proc.terminate).start()
    for line in proc.stdout:
        arrivals.append((time.monotonic() - started, line))
    proc.wait(30)
    return arrivals


def bursts(arrivals: list[tuple[float, bytes]]) -> list[list[bytes]]:
    """The readouts and summaries, in the reads they arrived in (lines within 0.2 s of each other)."""
    said = [(at, line) for at, line in arrivals if line.startswith((b"[#", b" *** Download Progress Summary"))]
    groups: list[list[tuple[float, bytes]]] = []
    for at, line in said:
        if groups and at - groups[-1][-1][0] < 0.2:
            groups[-1].append((at, line))
        else:
            groups.append([(at, line)])
    return [[line for _, line in group] for group in groups]


def ends_with_a_summary(burst: list[bytes]) -> bool:
    """``burst`` (bursts') ends with aria2c's progress summary: its header and the readout it shows (and, from the
    real one at times, that second's readout, which more often comes with the next burst)."""
    header = [i for i, line in enumerate(burst) if line.startswith(b" *** Download Progress Summary")]
    return len(header) == 1 and 1 <= len(burst) - 1 - header[0] <= 2 and \
        all(line.startswith(b"[#") for line in burst[header[0] + 1:])


@pytest.mark.parametrize("how", ["simulated", "aria2c"])
def test_the_readouts_reach_a_pipe_in_a_burst_at_each_progress_summary(tmp_path: Path, gateway: Any, how: str) -> None:
    # aria2c prints a progress summary every --summary-interval (60 s unless told) and its readouts go out with it: a
    # download longer than that is not silent until its end. 6 MiB at 1 MiB/s, a summary every 2 s.
    env = {**one_file_fetch(tmp_path, gateway, how, 6, "1MiB"), **summary_every(tmp_path, 2)}
    proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    arrivals = arrivals_of(proc)
    assert proc.returncode == 0, b"".join(line for _, line in arrivals)
    complete = next(at for at, line in arrivals if b"Download complete" in line)
    before = [burst for burst in bursts(arrivals) if b"Progress Summary" in b"".join(burst)]
    assert len(before) >= 2, arrivals  # (about 6 s of download: a burst every 2 s)
    for burst in before:  # each: the readouts of the seconds before it, then the summary (which repeats one)
        assert burst[0].startswith(b"[#") and ends_with_a_summary(burst), arrivals
    summaries = [at for at, line in arrivals if b"Progress Summary" in line]
    assert min(summaries) < complete - 1.0, arrivals


@pytest.mark.parametrize("how", ["simulated", "aria2c"])
def test_against_a_dead_gateway_aria2c_repeats_its_figures_at_each_summary(tmp_path: Path, how: str) -> None:
    # A gateway that takes the connection and never answers: aria2c learns no size, writes no file, tries again
    # silently (-m100), and prints the same readout a second, which reaches a pipe with each summary, for as long
    # as it runs (measured with aria2 1.36.0). The stand-in's simulated aria2c is told so (its gateway is none).
    if how == "aria2c" and ARIA2C is None:
        pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it)")
    with dead_gateway() as url:
        env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(tmp_path / "params"), STANDIN_PARAM_FILES="1",
                          IPFS_GATEWAY=url, STANDIN_PARAM_DOWNLOADER=how, STANDIN_PARAM_DEAD_GATEWAY="1",
                          **summary_every(tmp_path, 2))
        proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"], env=env,
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        arrivals = arrivals_of(proc, 7)
    said = bursts(arrivals)
    assert len(said) >= 2, arrivals
    readouts = {line.split(b"]")[0].split(b" ", 1)[1] for burst in said for line in burst if line.startswith(b"[#")}
    assert readouts == {b"0B/0B CN:1 DL:0B"}, arrivals  # the same figures, a size never learnt
    assert all(ends_with_a_summary(burst) for burst in said[:2]), arrivals
    assert not list((tmp_path / "params").glob("*.params")), arrivals  # no answer, no file


@pytest.mark.parametrize("how", ["simulated", "aria2c"])
def test_a_fetch_on_a_dead_gateway_is_stalled_though_aria2c_repeats_its_readout(sup: Runner, tmp_path: Path,
                                                                                how: str) -> None:
    # The same fetch under the supervisor, its output read by the paramfetch parser: each burst of unmoved readouts
    # and its summary said nothing moved, so the phase is stalled at stall_s; it ran to timeout_s before (85 minutes
    # in the profile), its bursts taken for life. Sped up: a summary every 2 s, stall_s 8.
    if how == "aria2c" and ARIA2C is None:
        pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it)")
    cache = tmp_path / "params"
    with dead_gateway() as url:
        env = standin_env(FIL_PROOFS_PARAMETER_CACHE=str(cache), STANDIN_PARAM_FILES="1", IPFS_GATEWAY=url,
                          STANDIN_PARAM_DOWNLOADER=how, STANDIN_PARAM_DEAD_GATEWAY="1", **summary_every(tmp_path, 2))
        command = [PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"]
        config = sup.write(f"""
            [[phases]]
            name = "fetch"
            command = {toml_list(command)}
            parse = "paramfetch"
            progress_path = {toml_str(str(cache))}
            progress_total = "1MiB"
            stall_s = 8
            timeout_s = 40
            """)
        result = sup.run(config, env=env, timeout=90)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out[-4000:]
    record = one_verdict(out, "fetch")
    assert " reason=stalled " in record and "output since then said nothing moved" in record, record
    assert out.count("Download Progress Summary") >= 2, out[-4000:]  # it printed all along, and was no sign
    took = seconds_between(first_line(out, "phase fetch: pending → starting"), first_line(out, "phase fetch: stalled"))
    assert took < 8 + 15, out[-4000:]  # generous; far from timeout_s


@pytest.mark.parametrize("how", ["simulated", "aria2c"])
def test_a_link_under_16_kib_s_is_given_up_by_aria2c_and_costs_curio_the_file(tmp_path: Path, gateway: Any,
                                                                             how: str) -> None:
    # curio's --lowest-speed-limit 16K: the real aria2c gives the link up after about 10 s ("Too slow", exit 5),
    # -m100 notwithstanding, leaving the preallocated file and its control file. curio does not resume from
    # them: its Go fallback asks for a Range past the preallocated end (a 416, nothing appended), the check
    # fails, the file is deleted and fetched again from zero (aria2c drops the control file left beside no
    # file); the second failure is the fetch's, exit 1, and the file is deleted again. The stand-in's simulated
    # downloader must do all this too, or it is kinder than what it stands in for.
    env = one_file_fetch(tmp_path, gateway, how, 8, "8KiB")
    cache = tmp_path / "params"
    done = subprocess.run([PY, "-m", "supervisor.prover.standins.paramfetch", "fetch-params", "8MiB"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=90)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert out.count("errorCode=5 Too slow Downloading speed: ") == 2, out
    assert out.count("aria2c fetch failed: exit status 5") == 2, out
    # each aria2c ends with its results table, its download's row ERR (and its gid no longer under way)
    assert len(re.findall(r"^[0-9a-f]{6}\|ERR \|", done.stdout, re.MULTILINE)) == 2, out
    assert parsed("paramfetch", done.stdout).under_way == {}, out
    assert "sanity checking fetched file failed, removing and retrying: checksum mismatch in param file" in out
    assert "Removed the defunct control file " in out, out
    assert "ERROR: re-checking file " in out, out
    assert list(cache.glob("*.params")) == [], out  # nothing left to resume


# ---------------------------------------------------------------- the bench cut, in-process


def test_a_bench_is_hopeless_only_past_n_over_min_rate() -> None:
    # 12 proofs at min_rate 50/h: 14.4 min. At exactly that it could still pass (rate == min_rate passes).
    assert hopeless(12, 5, 14.4 * 60, 50.0) is None
    why = hopeless(12, 5, 14.4 * 60 + 1, 50.0)
    assert why is not None and "5 of 12 proofs done" in why and "< min_rate 50/h" in why
    assert "14.4 min since it began" in why
    assert hopeless(12, 0, 10_000, 0.0) is None  # no min_rate: nobody judges it


class _Production:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str, str]] = []

    def hold(self, phase_name: str, why: str) -> None: ...

    def release(self, phase_name: str) -> None: ...

    def stop_from_outside(self, why: str, status: int) -> None: ...

    def fail_phase(self, name: str, reason: str, detail: str) -> bool:
        self.ended.append((name, reason, detail))
        return True


def watched_bench() -> tuple[BenchResult, _Production, list[Any], Callable[[float], None]]:
    """A running bench at min_rate 3600/h under the cut: its parser's result (to feed), what the cut ended, the
    cut's looks due, and ``tick(at)``: the clock at ``at``, the next look taken."""
    now = [0.0]
    timers: list[Any] = []
    production = _Production()
    cut = BenchCut(3600.0, production, lambda delay, cb: timers.append(cb), now=lambda: now[0])
    result = BenchResult()
    cut.transition(PhaseView("bench", "oneshot", PhaseState.RUNNING, "", 1, False, False, "bench-done", result))

    def tick(at: float) -> None:
        now[0] = at
        timers.pop(0)()

    return result, production, timers, tick


def test_the_cut_counts_from_the_benchs_header_and_stops_at_the_boundary() -> None:
    # The real cuzk-bench at -j 3 prints no proof line until count - 3 proofs are done: counted from its first
    # proof line, the cut came most of the way through the bench, too late to spare its cost.
    result, production, timers, tick = watched_bench()
    tick(100.0)  # no header yet: nothing counts, however long cuzk-bench took to start
    result.started, result.expected = True, 4
    tick(102.0)  # the header: the count starts here, no proof line yet
    tick(106.0)  # 4 s since: 4 proofs at 3600/h may take 4 s: it could still pass
    assert production.ended == []
    tick(106.5)  # not one proof line came: it cannot pass any more all the same
    assert [(p, r) for p, r, _ in production.ended] == [("bench", "too_slow")]
    assert timers == []


def test_without_a_header_the_cut_counts_from_the_first_proof_line() -> None:
    result, production, timers, tick = watched_bench()
    tick(100.0)  # no proof line yet: nothing counts, however long cuzk-bench took to start
    result.proofs["COMPLETED"], result.expected = 1, 4
    tick(102.0)  # the first proof line: the count starts here
    tick(106.0)  # 4 s since: 4 proofs at 3600/h may take 4 s: it could still pass
    assert production.ended == []
    tick(106.5)
    assert [(p, r) for p, r, _ in production.ended] == [("bench", "too_slow")]
    assert timers == []  # no more looks


# ---------------------------------------------------------------- the supervisor, end to end


def _slow_env(profile: Any, gateway: Any, **extra: str) -> dict[str, str]:
    # stall_s far shorter than a file takes (20 s at 1 MiB/s): aria2c's readout stays in its pipe until a file
    # is done, so only its writes keep it alive (issue 21); a stall here would fail these tests.
    knobs = {"IPFS_GATEWAY": gateway.url, "STANDIN_PARAM_DOWNLOADER": _downloader(), "STANDIN_PARAM_FILES": "3",
             "STANDIN_PARAM_BYTES": "20MiB", "STANDIN_PARAM_RATE": "1MiB", "PROVER_PARAM_TOTAL": "60MiB",
             "PROVER_FETCH_STALL_S": "4"}
    return profile.env(**{**knobs, **extra})


def test_a_download_that_cannot_make_the_deadline_is_given_up(profile: Any, gateway: Any) -> None:
    # (curio fetches the three files at once, each aria2c at 1 MiB/s: 60 MiB take 20 s, past a 12 s deadline)
    run = profile.run(env=_slow_env(profile, gateway, PROVER_FETCH_DEADLINE_S="12", PROVER_SLOW_WINDOW_S="5"),
                      timeout=40)
    assert run.returncode == EXIT_TIMEOUT, run.output[-3000:]  # (too slow to make it: over for time, as timeout(1))
    failed = failure(run.output)
    assert failed["phase"] == "paramfetch" and failed["reason"] == "too_slow", run.output[-3000:]
    assert "left at" in run.output and "before the manager's timeout" in run.output
    assert profile.instance()["state"] == "killed", profile.instance()
    # Given up before the download could end (a check of what happened, not of the time it took: the run's own
    # timeout, 40 s, keeps the test from hanging).
    assert "parameter and key-fetching complete" not in run.output, run.output[-3000:]


def test_a_throttled_download_that_can_make_it_is_never_given_up(profile: Any, gateway: Any) -> None:
    gateway._server.size = 3 * MIB
    env = _slow_env(profile, gateway, STANDIN_PARAM_BYTES="3MiB", PROVER_PARAM_TOTAL="9MiB",
                    PROVER_FETCH_DEADLINE_S="60", PROVER_SLOW_WINDOW_S="2")
    run = profile.run(env=env, timeout=90)
    assert "too_slow" not in run.output, run.output[-3000:]
    assert "reason=stalled" not in run.output, run.output[-3000:]
    assert "phase paramfetch: running → stopping" in run.output or "phase paramfetch: stopping → done" in \
        run.output, run.output[-3000:]
    assert profile.calls("/param-done") == 1
    # Its figures are the whole download's, not those of its last tick before the end (91-97%, with a rate and
    # an ETA, for good): the last walk of an attempt that ended well waits for no quiet (nothing writes any more).
    status = json.loads(state_files.path(profile.state_dir, state_files.STATUS_FILE).read_text())
    fetched = next(p for p in status["phases"] if p["name"] == "paramfetch")
    assert fetched["state"] == PhaseState.DONE.value, fetched
    progress = fetched["progress"]
    assert (progress["done_bytes"], progress["files_done"], progress["eta_s"]) == (9 * MIB, 3, 0.0), progress


def test_a_file_fetched_again_after_a_bad_checksum_counts_again_and_can_still_make_it(profile: Any,
                                                                                     gateway: Any) -> None:
    # curio deletes a file whose digest does not match and fetches it again. A small file is checked within a
    # walk's quiet time and preallocated anew between two walks, so only curio's line says it (measured with
    # the real aria2c): its first copy's bytes counted on (100% while it was fetched again), and the rate fell
    # with the figure (the deadline rule then ended a download that could still make it).
    gateway._server.size = 3 * MIB
    env = _slow_env(profile, gateway, STANDIN_PARAM_FILES="1", STANDIN_PARAM_BYTES="3MiB",
                    PROVER_PARAM_TOTAL="3MiB", PROVER_FETCH_DEADLINE_S="60", PROVER_SLOW_WINDOW_S="2",
                    STANDIN_PARAM_CORRUPT="1")
    run = profile.run(env=env, timeout=90)
    out = run.output
    assert "removing and retrying: checksum mismatch in param file" in out, out[-3000:]
    # (curio's line, with the size aria2c said, and maybe a walk between the delete and the new preallocation:
    # one removal, said once, its bytes taken off once)
    assert [line.split("[supervisor] ", 1)[-1] for line in out.splitlines() if "no longer count" in line] in (
        ["phase paramfetch: the command deletes a file to fetch it again: its 3.0MiB no longer count"],
        [f"phase paramfetch: {profile.tmp}/params has less complete (a file removed): its 3.0MiB no longer count"],
        [f"phase paramfetch: {profile.tmp}/params shrank (a file removed): its 3.0MiB no longer count"],
    ), out[-3000:]
    assert "too_slow" not in out and "reason=stalled" not in out, out[-3000:]
    assert "phase paramfetch: stopping → done" in out, out[-3000:]
    assert profile.calls("/param-done") == 1


def test_a_link_curio_cannot_get_through_uses_up_the_retries_its_lost_files_got_nothing(profile: Any,
                                                                                       gateway: Any) -> None:
    """The real aria2c gives a link under 16 KiB/s up after about 10 s (exit 5, "Too slow"), -m100
    notwithstanding; curio's Go fallback then asks past the preallocated end, gets nothing, the check fails, and
    curio deletes the file and fetches it again from zero; a second failure ends it (exit 1). Nothing of the file
    is left for the next attempt. Each attempt had written a MiB and was held to have got further: not counted
    against the retries, for ever (the stand-in resumed from aria2c's control file, which real curio never
    does). What counts is what the next attempt keeps: the complete files."""
    if ARIA2C is None:
        pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it): the simulated "
                    "downloader has no slow link to give up")
    gateway._server.size = 8 * MIB
    gateway._server.slow_below = 8 * MIB  # every answer: a MiB at full speed, then 4 KiB/s
    env = _slow_env(profile, gateway, STANDIN_PARAM_FILES="1", STANDIN_PARAM_BYTES="8MiB",
                    STANDIN_PARAM_RATE="0", PROVER_PARAM_TOTAL="8MiB", PROVER_FETCH_STALL_S="60")
    run = profile.run(env=env, timeout=150)
    out = run.output
    said = [line for line in out.splitlines() if "[paramfetch/paramfetch]" in line]  # (not a verdict's excerpt)
    # Two aria2c runs an attempt, three attempts; each attempt ends with the file deleted.
    assert sum("errorCode=5 Too slow" in line for line in said) == 6, out[-3000:]
    assert sum("aria2c fetch failed: exit status 5" in line for line in said) == 6, out[-3000:]
    assert sum("ERROR: re-checking file " in line for line in said) == 3, out[-3000:]
    assert "got further" not in out, out[-3000:]
    assert "exit_code (all 2 retries used)" in out, out[-3000:]
    assert failure(out)["phase"] == "paramfetch", out[-3000:]
    assert profile.calls("/param-done") == 0


def test_a_restart_keeps_the_manager_clock(profile: Any, gateway: Any) -> None:
    # An earlier start registered 50 s ago: 40 MiB at 1 MiB/s needs 40 s, only 10 s are left of 60. The manager
    # keeps the label's row (a register of the same label returns it): its registered_at is 50 s old too.
    profile.state_dir.mkdir(parents=True, exist_ok=True)
    earlier = time.time() - 50
    state_files.path(profile.state_dir, state_files.FIRST_SEEN).write_text(
        json.dumps({"first_start": earlier - 1, "first_registered": earlier}))
    requests.post(profile.manager.url + "/register", json={"label": profile.label}, timeout=5).raise_for_status()
    with profile.manager.state.lock:
        [row] = [i for i in profile.manager.state.instances.values() if i.label == profile.label]
        row.registered_at = earlier
    gateway._server.size = 20 * MIB
    env = _slow_env(profile, gateway, STANDIN_PARAM_FILES="2", PROVER_PARAM_TOTAL="40MiB",
                    PROVER_FETCH_DEADLINE_S="60", PROVER_SLOW_WINDOW_S="3")
    run = profile.run(env=env, timeout=40)
    failed = failure(run.output)
    assert failed["reason"] == "too_slow", run.output[-3000:]
    assert "from the manager's registered_at" in run.output, run.output[-3000:]
    kept = json.loads(state_files.path(profile.state_dir, state_files.FIRST_SEEN).read_text())
    assert kept["first_registered"] == earlier  # the registration of this start did not move it



def test_a_bench_that_can_no_longer_pass_is_stopped_and_given_up(profile: Any) -> None:
    # 4 proofs one at a time, 3 s each; min_rate 3600/h lets them 4 s from the first proof line: cut at ~4 s.
    env = profile.env(MIN_RATE="3600", BENCH_CONCURRENCY="1", STANDIN_PROOF_S="3")
    run = profile.run(env=env, timeout=90)
    failed = failure(run.output)
    assert failed["phase"] == "bench" and failed["reason"] == "too_slow", run.output[-3000:]
    assert "the bench cannot pass any more" in run.output
    assert "=== Batch Summary ===" not in run.output  # stopped before its end
    assert profile.instance()["state"] == "killed"
