"""The bench's verdict as the fleet protocol reports it (the prover's parser of cuzk-bench output, its rate, its
ANSI-coloured lines) and the prover's [manager] switches. The manager client's own tests are tests/test_manager.py.
"""

from __future__ import annotations

import pytest
from profilekit import parsed

from supervisor.config import ConfigError, parse_plan
from supervisor.prover.bench import BenchParser

# ---------------------------------------------------------------- a tiny server with canned answers


GOOD = """\
running 3 porep proofs against http://127.0.0.1:1 with concurrency 1
  [1/3] COMPLETED — 151.9s (prove=41234 ms, queue=10 ms)
  [2/3] COMPLETED — 150.2s (prove=41000 ms, queue=10 ms)
  [3/3] COMPLETED — 152.0s (prove=41100 ms, queue=10 ms)

=== Batch Summary ===
total time:    458.1s
completed:     3
failed:        0
throughput:    0.393 proofs/min (152.8s/proof)
"""


def test_bench_all_good() -> None:
    r = parsed("cuzk-bench", GOOD)
    assert r.problem() is None
    assert r.summary_seen and r.completed == 3 and r.failed == 0 and r.expected == 3
    assert r.proofs == {"COMPLETED": 3}
    assert r.total_time_s == pytest.approx(458.1)
    assert r.rate_per_hour == pytest.approx(3 / 458.1 * 3600, abs=0.001)  # (the line's 0.393 × 60: 23.58)


def test_bench_some_failed() -> None:
    text = GOOD.replace("[2/3] COMPLETED", "[2/3] FAILED").replace("completed:     3", "completed:     2") \
        .replace("failed:        0", "failed:        1")
    r = parsed("cuzk-bench", text)
    problem = r.problem()
    assert problem is not None and "1 FAILED" in problem
    assert r.proofs == {"COMPLETED": 2, "FAILED": 1}


def test_bench_summary_failed_count_alone_fails() -> None:
    r = parsed("cuzk-bench", GOOD.replace("failed:        0", "failed:        2"))
    assert r.problem() is not None and "failed: 2" in r.problem()


def test_bench_timeout_and_cancelled_fail() -> None:
    r = parsed("cuzk-bench",
               GOOD.replace("[1/3] COMPLETED", "[1/3] TIMEOUT").replace("[3/3] COMPLETED", "[3/3] CANCELLED"))
    problem = r.problem()
    assert problem is not None and "TIMEOUT" in problem and "CANCELLED" in problem


def test_bench_no_summary_is_a_failure_not_a_zero_rate() -> None:
    r = parsed("cuzk-bench", GOOD.split("=== Batch Summary ===")[0])
    assert r.problem() is not None and "Batch Summary" in r.problem()
    assert r.rate_per_hour is None
    # A summary line outside the summary is not read.
    r2 = parsed("cuzk-bench", "throughput:    9.0 proofs/min (1s/proof)\n")
    assert r2.proofs_per_min is None


def test_bench_zero_completed_fails() -> None:
    text = "=== Batch Summary ===\ntotal time:    1.0s\ncompleted:     0\nfailed:        0\n" \
           "throughput:    0.000 proofs/min (n/a)\n"
    r = parsed("cuzk-bench", text)
    assert r.problem() is not None and "no proof completed" in r.problem()


def test_bench_ansi_coloured_lines() -> None:
    parser = BenchParser()
    for line in GOOD.splitlines():
        coloured = f"\x1b[32m{line}\x1b[0m" if line.strip() else line
        parser.feed([coloured.encode()])
    r = parser.result
    assert r.problem() is None
    assert r.proofs == {"COMPLETED": 3}
    assert r.proofs_per_min == pytest.approx(0.393)
    assert r.rate_per_hour == pytest.approx(3 / 458.1 * 3600, abs=0.001)


def test_bench_rate_is_proofs_per_minute_times_60() -> None:
    r = parsed("cuzk-bench", GOOD.replace("0.393 proofs/min", "1.025 proofs/min"))
    assert r.rate_per_hour == pytest.approx(61.5)


def test_the_old_and_new_switch_names_must_agree() -> None:
    from supervisor.prover.plugin import PLUGIN  # the switches are the prover's [manager] keys

    phases = '[[phases]]\nname = "a"\ncommand = ["true"]\n'
    plan = parse_plan('[manager]\nreport_bench_failure = false\n' + phases, "old.toml", {}, PLUGIN)
    assert plan.extensions["manager"]["give_up_on_failure"] is False
    assert parse_plan(phases, "default.toml", {}, PLUGIN).extensions["manager"]["give_up_on_failure"] is True
    with pytest.raises(ConfigError) as refused:
        parse_plan('[manager]\nreport_bench_failure = false\ngive_up_on_failure = true\n' + phases, "both.toml", {},
                   PLUGIN)
    assert str(refused.value).startswith("both.toml: manager.report_bench_failure: the old name of "
                                         "give_up_on_failure"), refused.value
