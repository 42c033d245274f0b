"""cuzk-bench output as it really comes: the shared/domain/workloads.md shape and the stand-in's own output.

tests/test_manager.py covers the parser's rules on a hand-written sample; here the input is what the
programs print: the summary exactly as shared/domain/workloads.md shows it (with its ``…`` placeholders and em
dashes), the stand-in's ``summary()`` lines, and the stand-in cuzk-bench run against a real stand-in
cuzk-daemon, which EXITS 0 EVEN WHEN PROOFS FAILED.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PY, Runner, free_port, kill_tree, py_script, sh, toml_list, wait_for
from profilekit import parsed, standin_env

from supervisor.engine.logs import ChildOutput, Console, LogFile
from supervisor.exits import EXIT_FAILURE
from supervisor.prover.bench import BenchParser, SingleProofParser
from supervisor.prover.standins.cuzk_bench import Result, proof_line, result_block, summary

# shared/domain/workloads.md, §2, verbatim (the "…" are in the document).
WORKLOADS_SUMMARY = """\
=== Batch Summary ===
total time:    1834.2s
completed:     12
failed:        0
wall time:     avg=…s min=…s max=…s
prove time:    avg=…s min=…s max=…s
throughput:    0.393 proofs/min (152.8s/proof)
"""


def lines_12(status_of: dict[int, str] | None = None) -> str:
    status_of = status_of or {}
    return "".join(f"  [{k}/12] {status_of.get(k, 'COMPLETED')} — 151.9s (prove=41234 ms, queue=10 ms)\n"
                    for k in range(1, 13))


def test_workloads_md_sample_passes_with_its_rate() -> None:
    r = parsed("cuzk-bench", lines_12() + "\n" + WORKLOADS_SUMMARY)
    assert r.problem() is None, r.problem()
    assert r.proofs == {"COMPLETED": 12} and r.expected == 12
    assert (r.completed, r.failed) == (12, 0)
    assert r.total_time_s == pytest.approx(1834.2)
    assert r.proofs_per_min == pytest.approx(0.393)
    # proofs/h = proofs/min × 60, from the counts the line is made of: 12 in 1834.2 s (the line's 0.393 × 60 reads
    # 23.58, 3 decimals of proofs a minute: ±0.03 an hour)
    assert r.rate_per_hour == pytest.approx(12 / 1834.2 * 3600, abs=0.001)


@pytest.mark.parametrize("word", ["FAILED", "CANCELLED", "TIMEOUT"])
def test_workloads_md_status_words_fail_even_with_a_clean_looking_summary(word: str) -> None:
    r = parsed("cuzk-bench", lines_12({7: word}) + "\n" + WORKLOADS_SUMMARY)
    problem = r.problem()
    assert problem is not None and f"1 {word}" in problem


def test_stand_in_summary_lines_round_trip() -> None:
    results = [Result("COMPLETED", 150.0, 41000, 10, ""), Result("FAILED", 3.0, 0, 0, "transport error: x"),
               Result("COMPLETED", 152.0, 41200, 12, ""), Result("TIMEOUT", 900.0, 0, 0, "deadline exceeded")]
    text = "".join(proof_line(k, 4, res) + "\n" for k, res in enumerate(results, 1))
    text += "\n".join(summary(results, 600.0)) + "\n"
    r = parsed("cuzk-bench", text)
    assert r.proofs == {"COMPLETED": 2, "FAILED": 1, "TIMEOUT": 1}
    assert (r.completed, r.failed, r.total_time_s) == (2, 2, 600.0)
    assert r.proofs_per_min == pytest.approx(0.2)  # 2 proofs in 10 minutes
    problem = r.problem()
    assert problem is not None and "1 FAILED" in problem and "1 TIMEOUT" in problem


def test_stand_in_summary_with_nothing_completed_reads_as_a_failure_not_rate_0() -> None:
    """Every proof answered FAILED: as the real tool (main.rs ``if !completed.is_empty()``) the summary has no
    wall, prove or throughput line at all (it once printed ``0.000 proofs/min (n/a)``, which the real one never
    does), so no rate is read, and the bench fails on its counts."""
    results = [Result("FAILED", 1.0, 0, 0, "proof failed: x")] * 3
    text = "\n".join(summary(results, 3.2)) + "\n"
    assert text.splitlines()[-3:] == ["total time:    3.2s", "completed:     0", "failed:        3"], text
    r = parsed("cuzk-bench", text)
    assert r.completed == 0 and r.failed == 3 and r.proofs_per_min is None
    assert r.problem() is not None and "failed: 3" in r.problem()


def test_a_bench_that_got_no_answer_says_so_not_only_that_its_summary_is_missing() -> None:
    """cuzk-bench whose daemon died mid-batch: the proofs before, then its error from main on stderr, no summary
    (main.rs 595; standins/cuzk_bench.py). Its ``Error:`` line is the cause, kept and said first."""
    text = ("=== Batch Benchmark ===\nproof type:  porep\ncount:       4\nconcurrency: 2\n\n"
            "  [1/4] COMPLETED — 151.9s (prove=41234 ms, queue=10 ms)\n"
            "Error: Prove RPC failed\n\nCaused by:\n    0: transport error\n    1: broken pipe\n")
    r = parsed("cuzk-bench", text)
    assert r.error == "Prove RPC failed" and r.proofs == {"COMPLETED": 1} and not r.summary_seen
    assert r.problem() == ("cuzk-bench got no answer from cuzk-daemon (Error: Prove RPC failed): the daemon was "
                           "gone or broke the connection, no '=== Batch Summary ===' in cuzk-bench's output "
                           "(completed=1)"), r.problem()
    other = parsed("cuzk-bench", "Error: failed to read /data/zk/c1.json\n\nCaused by:\n    No such file\n")
    assert other.problem() is not None and other.problem().startswith(
        "cuzk-bench ended with Error: failed to read /data/zk/c1.json, no '=== Batch Summary ==='"), other.problem()
    assert parsed("cuzk-bench", lines_12() + "\n" + WORKLOADS_SUMMARY).error is None


def test_fed_in_pieces_as_the_pipe_delivers_them() -> None:
    """The supervisor feeds the parser batches of raw byte lines, some with CR LF or colour codes."""
    parser = BenchParser()
    raw = (lines_12() + "\n" + WORKLOADS_SUMMARY).encode().splitlines()
    for i in range(0, len(raw), 5):
        parser.feed([line + b"\r" if i % 2 else b"\x1b[1m" + line + b"\x1b[0m" for line in raw[i:i + 5]])
    r = parser.result
    assert r.problem() is None, r.problem()
    assert r.proofs == {"COMPLETED": 12}
    assert r.rate_per_hour == pytest.approx(12 / 1834.2 * 3600, abs=0.001)


@pytest.mark.parametrize(("completed", "total", "line", "rate"), [
    (12, "863.9s", "0.833", 12 / 863.9 * 3600),  # 50.006/h: the line's 0.833 × 60 is 49.98, under a min_rate of 50
    (3, "0.1s", "1900.311", 1900.311 * 60),  # (a stand-in's tenth of a second: the line says it more exactly)
    (1, "1.0s", "0", 0.0),  # counts that do not give the line's figure leave the line's
])
def test_the_rate_is_the_more_exact_of_the_throughput_line_and_the_counts_it_is_made_of(
        completed: int, total: str, line: str, rate: float) -> None:
    r = parsed("cuzk-bench", f"=== Batch Summary ===\ntotal time:    {total}\ncompleted:     {completed}\n"
                             f"failed:        0\nthroughput:    {line} proofs/min\n")
    assert r.rate_per_hour == pytest.approx(rate, abs=0.001), r.rate_per_hour


def test_read_through_the_line_splitter_with_cr_lf_and_a_redrawn_progress_readout(tmp_path: Path) -> None:
    """What the parser gets is what ChildOutput gives it: CR LF line ends and a ``\\r`` progress readout
    between the proof lines, in reads cut anywhere, still make the 12 proofs and the summary."""
    text = (lines_12() + "\n" + WORKLOADS_SUMMARY).replace("\n", "\r\n")
    text = text.replace("  [2/12]", "\rwaiting 1s\rwaiting 2s\r  [2/12]")
    data = text.encode()
    parser = BenchParser()
    output = ChildOutput("bench/bench", Console(enabled=False), LogFile(tmp_path / "bench.log", 0), ring_lines=50,
                         readers=[parser.feed])
    for i in range(0, len(data), 37):
        output.feed("stdout", data[i:i + 37])
    output.close_stream("stdout")
    output.file.close()
    r = parser.result
    assert r.problem() is None, r.problem()
    assert r.proofs == {"COMPLETED": 12} and r.completed == 12 and r.failed == 0
    assert r.rate_per_hour == pytest.approx(12 / 1834.2 * 3600, abs=0.001)
    assert "waiting 2s" in output.last_lines() and not any("\r" in line for line in output.last_lines())
    assert (tmp_path / "bench.log").read_bytes() == data


# ---------------------------------------------------------------- the real stand-in programs


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A stand-in cuzk-daemon on free ports; yields its listen address."""
    tmp = tmp_path_factory.mktemp("bench-daemon")
    listen, status = free_port(), free_port()
    cfg = tmp / "cuzk.toml"
    (tmp / "params").mkdir()
    cfg.write_text(f'[daemon]\nlisten = "127.0.0.1:{listen}"\nstatus_listen = "127.0.0.1:{status}"\n'
                   f'[srs]\nparam_cache = "{tmp / "params"}"\n[gpus]\ndevices = [0, 1]\n')
    def up() -> bool:
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"http://127.0.0.1:{status}/status", timeout=1) as resp:
            return bool(json.load(resp))
        return False

    with open(tmp / "daemon.log", "wb") as log:
        proc = subprocess.Popen([PY, "-m", "supervisor.prover.standins.cuzk_daemon", "-c", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, env=standin_env(), start_new_session=True)
    try:
        wait_for(up, 15, 0.05)
        yield f"http://127.0.0.1:{listen}"
    finally:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(5)


def bench(addr: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The stand-in cuzk-bench against ``addr``; a PoRep is given its (required) --c1."""
    c1 = ["--c1", str(Path(__file__).parent / "c1.json")] if "porep" in args else []
    return subprocess.run([PY, "-m", "supervisor.prover.standins.cuzk_bench", "-a", addr, *args, *c1],
                          capture_output=True, text=True, timeout=30, env=standin_env(**env))


def test_stand_in_batch_passes_and_its_rate_is_its_throughput_times_60(daemon: str) -> None:
    done = bench(daemon, "batch", "-t", "porep", "-c", "4", "-j", "2")
    assert done.returncode == 0, done.stderr
    r = parsed("cuzk-bench", done.stdout)
    assert r.problem() is None, done.stdout
    assert r.proofs == {"COMPLETED": 4} and r.expected == 4
    assert (r.completed, r.failed) == (4, 0)
    throughput = next(line for line in done.stdout.splitlines() if line.startswith("throughput:"))
    per_min = float(throughput.split()[1])
    assert r.proofs_per_min == per_min
    assert r.rate_per_hour == pytest.approx(per_min * 60, abs=0.001)


def test_stand_in_failed_proofs_exit_0_but_the_bench_failed(daemon: str) -> None:
    done = bench(daemon, "batch", "-t", "porep", "-c", "4", "-j", "2", STANDIN_BENCH_FAIL_PROOFS="2")
    assert done.returncode == 0, "the stand-in, like cuzk-bench, exits 0 even when proofs failed"
    # The proof line alone says it: the real batch prints no error line under it (main.rs 597-605).
    assert "error" not in done.stdout, done.stdout
    r = parsed("cuzk-bench", done.stdout)
    assert (r.completed, r.failed) == (2, 2)
    assert r.proofs == {"COMPLETED": 2, "FAILED": 2}
    assert r.proofs_per_min is not None and r.proofs_per_min > 0  # a rate is printed: it must not pass
    problem = r.problem()
    assert problem is not None and "2 FAILED" in problem


def test_stand_in_against_a_dead_daemon(tmp_path: Path) -> None:
    """The field failure: the daemon died. No proof gets an answer: the real tool returns the connect's error
    from main (main.rs 586, 595), exit 1, no proof line and no summary (the stand-in once printed three FAILED
    lines, a summary and exit 0). Read as a bench it is no pass, and says the daemon gave no answer."""
    addr = f"http://127.0.0.1:{free_port()}"
    done = bench(addr, "batch", "-t", "porep", "-c", "3", "-j", "3")
    assert done.returncode == 1, done
    assert done.stderr.startswith(f"Error: failed to connect to daemon at {addr}\n"), done.stderr
    r = parsed("cuzk-bench", done.stdout + done.stderr)
    assert r.proofs == {} and not r.summary_seen and r.completed is None
    problem = r.problem()
    assert problem is not None and f"failed to connect to daemon at {addr}" in problem, problem


def test_stand_in_single_has_no_summary(daemon: str) -> None:
    """The warm-up is ``single``: a result block, no summary; read as a bench it is no pass and no rate."""
    done = bench(daemon, "single", "-t", "porep")
    assert done.returncode == 0, done.stderr
    assert "=== Proof Result ===\nstatus:    COMPLETED\n" in done.stdout
    r = parsed("cuzk-bench", done.stdout)
    assert not r.summary_seen and r.proofs == {}
    assert r.problem() is not None and r.rate_per_hour is None


# ---------------------------------------------------------------- cuzk-bench single (parse = "cuzk-single")


@pytest.mark.parametrize("word", ["FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN"])
def test_single_result_block_that_did_not_complete_fails(word: str) -> None:
    text = "\n".join(result_block("w-1", Result(word, 2.0, 0, 0, "gRPC status: internal"))) + "\n"
    r = parsed("cuzk-single", text)
    problem = r.problem()
    assert problem is not None and word in problem and "gRPC status: internal" in problem, problem


def test_single_result_block_completed_passes() -> None:
    r = parsed("cuzk-single", "\n".join(result_block("w-1", Result("COMPLETED", 1.5, 1200, 3, ""))))
    assert r.problem() is None and r.statuses == ["COMPLETED"]


def test_single_with_no_result_block_fails() -> None:
    """A warm-up that printed only log lines (e.g. killed before answering) is not a pass."""
    r = parsed("cuzk-single", "2026-03-01T00:00:00Z  INFO cuzk_bench: submitting proof\n")
    problem = r.problem()
    assert problem is not None and "=== Proof Result ===" in problem


def test_single_reads_a_batch_style_proof_line_too() -> None:
    failed = parsed("cuzk-single", proof_line(1, 1, Result("FAILED", 1.0, 0, 0, "")) + "\n    error: proof failed: x\n")
    assert failed.problem() is not None and "proof failed: x" in (failed.problem() or "")
    assert parsed("cuzk-single", proof_line(1, 1, Result("COMPLETED", 1.0, 5, 0, ""))).problem() is None


def test_single_fed_in_coloured_pieces() -> None:
    parser = SingleProofParser()
    parser.feed([b"\x1b[1m=== Proof Result ===\x1b[0m", b"status:    \x1b[31mFAILED\x1b[0m", b"error:     boom"])
    assert parser.result.problem() == "the proof ended FAILED (error: boom)"


def test_stand_in_single_with_a_failed_proof_exits_0_but_the_warmup_failed(daemon: str) -> None:
    done = bench(daemon, "single", "-t", "porep", STANDIN_BENCH_FAIL_PROOFS="1")
    assert done.returncode == 0, "the real cuzk-bench single exits 0 whatever the proof's status"
    assert "status:    FAILED" in done.stdout
    problem = parsed("cuzk-single", done.stdout).problem()
    assert problem is not None and "FAILED" in problem and "proof failed" in problem, done.stdout


def test_stand_in_single_that_completed_passes(daemon: str) -> None:
    done = bench(daemon, "single", "-t", "porep")
    assert done.returncode == 0, done.stderr
    assert parsed("cuzk-single", done.stdout).problem() is None, done.stdout
# ---------------------------------------------------------------- what a child prints never raises


@pytest.mark.parametrize("line", [
    "throughput:    1.2.3 proofs/min (152.8s/proof)",
    "throughput:    1e999 proofs/min",
    "throughput:    " + "9" * 400 + ".0 proofs/min",  # a float of it is inf: never a rate
    "completed:     1.2.3",
    "completed:     12.5",
    "completed:     " + "9" * 5000,  # past int()'s 4300-digit limit
    "failed:        abc",
    "total time:    1834.2.1s",
])
def test_a_malformed_summary_line_fails_the_bench_by_name_never_raises(line: str) -> None:
    key = line.split(":")[0]
    good = {k.split(":")[0]: k for k in WORKLOADS_SUMMARY.splitlines()}
    text = lines_12() + "\n" + WORKLOADS_SUMMARY.replace(good[key], line)
    r = parsed("cuzk-bench", text)
    problem = r.problem()
    assert problem is not None and "unreadable summary line: " in problem, problem
    assert line.strip()[:40] in problem
    assert r.rate_per_hour is None or math.isfinite(r.rate_per_hour)


def test_a_proof_counter_too_long_to_be_a_number_is_still_counted() -> None:
    r = parsed("cuzk-bench", f"  [1/{'9' * 5000}] FAILED — 1.0s\n" + WORKLOADS_SUMMARY)
    assert r.proofs == {"FAILED": 1} and r.expected is None
    assert "1 FAILED" in (r.problem() or "")


def test_the_summary_units_still_read() -> None:
    r = parsed("cuzk-bench",
               "=== Batch Summary ===\ntotal time: 12s\ncompleted: 3\nfailed: 0\nthroughput: 2 proofs/min\n")
    assert (r.total_time_s, r.completed, r.failed, r.proofs_per_min, r.unreadable) == (12.0, 3, 0, 2.0, [])


MALFORMED_BENCH = """
import time
print("  [1/1] COMPLETED — 1.0s (prove=1000 ms, queue=1 ms)", flush=True)
print("=== Batch Summary ===")
print("total time:    1.0s")
print("completed:     1")
print("failed:        0")
print("throughput:    1.2.3 proofs/min (60.0s/proof)", flush=True)
"""


def test_a_malformed_summary_from_a_real_bench_fails_the_phase_not_the_supervisor(sup: Runner) -> None:
    """Issue 10, item 4: this one line used to raise ValueError in the loop; the supervisor died and the
    shutdown sweep's SIGKILLs gave the children ``reason=signal``."""
    marker = sup.tmp / "after.marker"
    config = sup.write(f"""
        [[phases]]
        name = "bench"
        command = {py_script(sup.tmp, "bench", MALFORMED_BENCH)}
        parse = "cuzk-bench"

        [[phases.daemons]]
        name = "daemon"
        command = {sh("exec sleep 60")}

        [[phases]]
        name = "after"
        command = {toml_list(["touch", str(marker)])}
        """)
    result = sup.run(config, timeout=60)
    assert result.returncode == EXIT_FAILURE, result.output
    assert "Traceback" not in result.output
    assert "reason=signal" not in result.output
    assert "reason=bench_failed" in result.output
    assert "unreadable summary line: 'throughput:    1.2.3 proofs/min (60.0s/proof)'" in result.output
    assert re.search(r"ended: phase=bench child=daemon pid=\d+ reason=stopped ", result.output), result.output
    assert not marker.exists()


def test_the_header_says_the_bench_began_and_how_many_proofs_it_runs() -> None:
    # The real cuzk-bench prints its header as its own clock starts; at -j above 1 no proof line comes until
    # count - j proofs are done, so the header is what the min_rate cut counts from (benchlimits.py).
    r = parsed("cuzk-bench", "=== Batch Benchmark ===\nproof type:  porep\ncount:       12\nconcurrency: 3\n\n")
    assert r.started and r.expected == 12 and r.proofs == {}
    assert not parsed("cuzk-bench", "count:       12\n").started, "a count line outside the header is no header"
    assert parsed("cuzk-bench", "count:       12\n").expected is None


def test_a_proof_line_right_after_the_header_ends_it() -> None:
    # Were no blank line to end the header, every proof line after it was taken for the header's and dropped.
    r = parsed("cuzk-bench", "=== Batch Benchmark ===\ncount:       2\n"
                             "  [1/2] COMPLETED — 1.0s (prove=1 ms, queue=0 ms)\n"
                             "  [2/2] COMPLETED — 1.0s (prove=1 ms, queue=0 ms)\n")
    assert r.started and r.expected == 2 and r.proofs == {"COMPLETED": 2}
