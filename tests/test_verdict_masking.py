"""A secret in a verdict's own words is masked once, where the verdict is recorded (verdict.VerdictRecord),
so every reader of the record has it masked: the console and supervisor.log, ``status --json``, the
status.json on disk and the termination log. The verdict here is the supervisor's, not a child's output:
a command that cannot start, whose path holds a value of a secret-looking environment variable.
"""

from __future__ import annotations

import json
import subprocess

from helpers import PY, REPO, Runner, clean_env, toml_str

SECRET = "QwErTyUiOpAsDfGh"  # letters only: no window of it turns up in a pid, a clock or a uuid


def test_a_secret_in_a_verdicts_detail_is_masked_wherever_the_verdict_is_read(sup: Runner) -> None:
    missing = f"/nonexistent/{SECRET}/curio"
    termination = sup.tmp / "termination-log"
    termination.write_text("")
    config = sup.write(f"""
        [[phases]]
        name = "work"
        command = [{toml_str(missing)}, "run"]
        env = {{ API_TOKEN = {toml_str(SECRET)} }}
        """, stop_grace_s=1)
    where = f"termination_log = {toml_str(str(termination))}"
    config.write_text(config.read_text().replace("[supervisor]\n", f"[supervisor]\n{where}\n", 1))
    result = sup.run(config, timeout=30)
    assert result.returncode == 127, result.output
    assert "reason=spawn_failed" in result.output and "/nonexistent/***/curio" in result.output, result.output
    readers = {
        "console": result.output,
        "supervisor.log": (sup.log_dir / "supervisor.log").read_text(),
        "status.json": (sup.state_dir / "status.json").read_text(),
        "termination log": termination.read_text(),
    }
    status = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                            capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env())
    readers["status --json"] = status.stdout
    leaks = [name for name, seen in readers.items() if SECRET in seen]
    assert not leaks, f"the secret reached: {leaks}"
    verdicts = json.loads(status.stdout)["verdicts"]
    assert any("/nonexistent/***/curio" in v["detail"] for v in verdicts), verdicts
    assert "/nonexistent/***/curio" in readers["termination log"], readers["termination log"]


def test_a_secret_with_a_quote_or_a_backslash_is_masked_in_the_started_line(sup: Runner) -> None:
    # The argument was escaped for the line first ("pa\"ss\\word9"), and the log's mask, looking for the secret
    # itself, found it no more: the started line carried it, into supervisor.log and the manager's setup tab.
    secret = 'pa"ss\\word9'
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = ["sh", "-c", "echo hi", "x", {toml_str(secret)}]
        env = {{ API_TOKEN = {toml_str(secret)} }}
        """, stop_grace_s=1)
    result = sup.run(config, timeout=30)
    assert result.returncode == 0, result.output
    [started] = [line for line in result.output.splitlines() if "started p/p: pid " in line]
    assert started.endswith(' x ***'), started
    log = (sup.log_dir / "supervisor.log").read_text()
    assert "word9" not in log and "word9" not in result.output, started
