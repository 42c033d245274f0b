"""What a child prints reaches every reader whole, masked and unmistakable (issue 14, class 8).

A real supervisor runs real children against a real dev-manager. A ``\\r`` progress readout shows
as it is drawn (console, ``status``, the manager), not when 64 KiB have piled up. A secret is
masked in every place child output goes (console, log file, ``status --json``, the manager's
pushed logs) however it was written: in two writes with a pause between, with an escape code
inside it (itself cut between the writes), or across the 64 KiB line cut. A child printing a
line that reads like the supervisor's verdict reaches the manager with its own label in front.

In-process, the streaming redactor's rules: what it holds back and when it lets go.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, REPO, Console, Runner, clean_env, pushed, py_script, toml_str, wait_for

from supervisor.app.cli import dev_manager
from supervisor.devmanager.server import DevManager
from supervisor.engine.logs import MAX_LINE_BYTES, ChildOutput, LogFile
from supervisor.engine.logs import Console as OutputConsole
from supervisor.text.redact import Redactor

# Letters only, mixed case: no window of them turns up by chance in a clock, a pid or a uuid.
SPLIT_SECRET = "ZqXvJkWmQpYrTnBs"
CODED_SECRET = "HgFdSaPoIuYtReWq"
CUT_SECRET = "LkJhGfDsMnBvCxZa"
SECRETS = (SPLIT_SECRET, CODED_SECRET, CUT_SECRET)
CLOCK = r"\d\d:\d\d:\d\d\.\d\d\d"
WINDOW = 6  # any 6 characters of a secret in a row count as a leak: a secret cut in two leaves a half


def plain(text: str) -> str:
    """``text`` without colour codes (written here, not taken from the code under test)."""
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def leaks(text: str) -> list[str]:
    """Every piece of a secret (WINDOW characters or more) that ``text`` shows."""
    shown = plain(text)
    return [s[i:i + WINDOW] for s in SECRETS for i in range(len(s) - WINDOW + 1) if s[i:i + WINDOW] in shown]


def status_json(state_dir: Path) -> dict[str, Any]:
    done = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=20)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def child_lines(snap: dict[str, Any], label: str) -> list[str]:
    return next(c["last_lines"] for c in snap["children"] if c["label"] == label)


@pytest.fixture
def mgr() -> Iterator[DevManager]:
    dev = dev_manager(port=0, quiet=True).start()
    yield dev
    dev.stop()


def manager_table(mgr: DevManager, label: str) -> str:
    return f"""
        [manager]
        url = {toml_str(mgr.url)}
        label = {toml_str(label)}
        log_push_interval_s = 0.2
        """


# ---------------------------------------------------------------- a \r progress readout


PROGRESS = r"""
import sys, time
out = sys.stdout.buffer
for step in (b"\rfetching 10%", b"\rfetching 20%", b"\r"):
    out.write(step)
    out.flush()
    time.sleep(0.2)
time.sleep(120)
"""


def test_a_progress_readout_reaches_console_status_and_manager_as_it_is_drawn(
        sup: Runner, mgr: DevManager) -> None:
    config = sup.write(manager_table(mgr, "C.progress") + f"""
        [[phases]]
        name = "fetch"
        kind = "service"
        command = {py_script(sup.tmp, "progress", PROGRESS)}
        """)
    proc = Console(sup, config)
    proc.wait_text("[fetch/fetch] fetching 20%", 30)
    assert "[fetch/fetch] fetching 10%" in proc.text()
    assert "\r" not in proc.text()
    lines = child_lines(status_json(sup.state_dir), "fetch/fetch")
    assert lines == ["fetching 10%", "fetching 20%"], lines
    wait_for(lambda: "fetching 20%" in pushed(mgr).get("setup", ""), 10, 0.05)
    setup = pushed(mgr)["setup"].splitlines()
    assert "[fetch/fetch] fetching 10%" in setup and "[fetch/fetch] fetching 20%" in setup, setup
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.finish(20) == 128 + signal.SIGTERM
    assert (sup.log_dir / "fetch.log").read_bytes() == b"\rfetching 10%\rfetching 20%\r"  # the file: byte for byte


# ---------------------------------------------------------------- secrets however they were written


LEAKER = r"""
import os, sys, time
out = sys.stdout.buffer
split, coded, cut = (os.environ[name].encode() for name in ("SPLIT_TOKEN", "CODED_TOKEN", "CUT_TOKEN"))

def write(data):
    out.write(data)
    out.flush()
    time.sleep(0.3)  # each write its own read: the supervisor sees the secret arrive in pieces

write(b"split: " + split[:7])
write(split[7:] + b" end\n")
write(b"coded: \x1b[32m" + coded[:5] + b"\x1b[1")  # an escape code inside the secret, itself cut in two
write(b"m" + coded[5:] + b"\x1b[0m end\n")
# The raw line reaches the 64 KiB cut in the middle of the secret.
write(b"x" * (int(sys.argv[1]) - 8) + cut + b" end\n")
write(b"all written\n")
time.sleep(120)
"""


def test_a_secret_is_masked_everywhere_however_it_was_written(sup: Runner, mgr: DevManager) -> None:
    config = sup.write(manager_table(mgr, "C.secrets") + f"""
        [[phases]]
        name = "leak"
        kind = "service"
        command = {py_script(sup.tmp, "leaker", LEAKER, MAX_LINE_BYTES)}
        env = {{ SPLIT_TOKEN = "{SPLIT_SECRET}", CODED_TOKEN = "{CODED_SECRET}", CUT_TOKEN = "{CUT_SECRET}" }}
        """)
    proc = Console(sup, config)
    proc.wait_text("[leak/leak] all written", 30)
    places: dict[str, str] = {"status --json": json.dumps(status_json(sup.state_dir), ensure_ascii=False)}
    wait_for(lambda: "all written" in pushed(mgr).get("setup", ""), 10, 0.05)
    places.update({f"pushed {source}": text for source, text in pushed(mgr).items()})
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.finish(20) == 128 + signal.SIGTERM
    places["console"] = proc.text()
    places.update({path.name: path.read_bytes().decode("utf-8", errors="replace")
                   for path in sorted(sup.log_dir.iterdir())})
    found = {place: leaks(text) for place, text in places.items() if leaks(text)}
    assert not found, f"secrets shown: {found}"
    # Masked, not lost: each line is there with its mask, the colour codes kept after it.
    log = (sup.log_dir / "leak.log").read_bytes()
    assert b"split: *** end\n" in log
    assert b"coded: \x1b[32m***\x1b[1m\x1b[0m end\n" in log
    assert b"x" * (MAX_LINE_BYTES - 8) + b"*** end\n" in log
    console = plain(places["console"])
    assert "[leak/leak] split: *** end" in console and "[leak/leak] coded: *** end" in console
    assert re.search(r"\[leak/leak\] x+\*\*\* end", console)  # masked before the cut: one line, whole
    assert "split: *** end" in places["pushed setup"] and "coded: *** end" in places["pushed setup"]


# ---------------------------------------------------------------- child lines cannot pass for the supervisor's


FAKE_VERDICT = "[supervisor] FAILED: phase=fetch child=fetch pid=1 reason=oom_killed signal=SIGKILL"


def test_a_child_printing_a_supervisor_verdict_reaches_the_manager_under_its_own_label(
        sup: Runner, mgr: DevManager) -> None:
    config = sup.write(manager_table(mgr, "C.fake") + f"""
        [[phases]]
        name = "fetch"
        command = {py_script(sup.tmp, "fake", f"print({FAKE_VERDICT!r}, flush=True); raise SystemExit(3)")}
        """)
    assert Console(sup, config).finish(30) == 3
    wait_for(lambda: "prover-supervisor: FAILED:" in pushed(mgr).get("setup", ""), 10, 0.05)
    setup = pushed(mgr)["setup"].splitlines()
    # The child's line, shipped as it came: behind its label, as the console shows it.
    assert f"[fetch/fetch] {FAKE_VERDICT}" in setup, setup
    # The supervisor's own verdict for that phase says what really happened, and reads differently.
    own = [line for line in setup if line.startswith("prover-supervisor: FAILED: phase=fetch ")]
    assert len(own) == 1 and " reason=exit_code " in own[0], own
    # Nowhere does the fake read as the supervisor's: only behind the label, or quoted under the real verdict.
    fakes = [line for line in setup if "reason=oom_killed" in line]
    assert fakes and all(line.startswith(("[fetch/fetch] ", "  | ")) for line in fakes), fakes
    assert not [line for line in setup if line.startswith(("[supervisor]", "prover-supervisor:"))
                and "oom_killed" in line]


# ---------------------------------------------------------------- the streaming redactor, in-process


def feed_all(redactor: Redactor, chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    """What each chunk released, and what the close released."""
    stream = redactor.stream()
    return [stream.feed(chunk) for chunk in chunks], stream.close()


def test_a_last_line_without_a_newline_is_in_the_verdict_while_a_grandchild_holds_the_pipe(sup: Runner) -> None:
    """A child's last words printed without a newline (``printf "fatal: ..."``) come out at the pipe's end of file;
    while a background grandchild holds the pipe, none comes, and the verdict quoted every line but the one that
    said why (the failure block, status.json, the termination log, the manager's report)."""
    config = sup.write("""
        [[phases]]
        name = "a"
        command = ["sh", "-c", "sleep 100 & echo line1; printf 'fatal: cannot open device'; exit 1"]
        stop_grace_s = 1
        """)
    result = sup.run(config, timeout=40)
    assert result.returncode == 1, result.output
    lines = result.output.splitlines()
    failed = next(i for i, line in enumerate(lines) if "FAILED: phase=a " in line)
    assert lines[failed + 1].endswith("  | line1"), lines[failed:failed + 4]
    assert lines[failed + 2].endswith("  | fatal: cannot open device"), lines[failed:failed + 4]


@pytest.mark.parametrize("grandchild", [
    pytest.param("sleep 100", id="no-secret-follows"),
    # Deaf to the stop's SIGTERM, it writes the secret's rest after the verdict.
    pytest.param(f"trap '' TERM; sleep 0.5; echo '{SPLIT_SECRET[8:]} end'", id="the-secret-is-finished-later"),
])
def test_the_held_start_of_a_secret_is_in_the_verdict_masked_while_a_grandchild_holds_the_pipe(
        sup: Runner, grandchild: str) -> None:
    """The child's last words end with what could begin a secret, held back until the pipe's end; a grandchild
    holds the pipe, so the verdict is made before it: its last line lacked them ("fatal: cannot open "). It shows
    them masked (the grandchild may still write the secret's rest), and the console and the log file show what
    they were once the pipe ends: in full where no secret followed, masked with the rest where one did."""
    config = sup.write(f"""
        [[phases]]
        name = "a"
        command = ["sh", "-c", "({grandchild}) & echo line1; printf 'fatal: cannot open {SPLIT_SECRET[:8]}'; exit 1"]
        env = {{ DB_TOKEN = "{SPLIT_SECRET}" }}
        stop_grace_s = 1
        """)
    result = sup.run(config, timeout=40)
    assert result.returncode == 1, result.output
    lines = result.output.splitlines()
    failed = next(i for i, line in enumerate(lines) if "FAILED: phase=a " in line)
    assert lines[failed + 1].endswith("  | line1"), lines[failed:failed + 4]
    assert re.search(r"  \| fatal: cannot open \*\*\*( end)?$", lines[failed + 2]), lines[failed:failed + 4]
    finished = "trap" in grandchild
    shown = f"fatal: cannot open {'*** end' if finished else SPLIT_SECRET[:8]}"
    assert re.search(rf"^{CLOCK} \[a/a\] {re.escape(shown)}$", result.output, flags=re.M), result.output
    assert (sup.log_dir / "a.log").read_text() == f"line1\n{shown}" + ("\n" if finished else "")
    said = [line for line in lines if "[a/a] " in line or "  | " in line]  # (its argv, logged, holds the rest)
    assert not finished or not leaks("\n".join(said)), said  # (a secret's half, unfollowed, is no secret)


def test_a_line_begun_is_quoted_where_asked_and_left_in_place(tmp_path: Path) -> None:
    out = ChildOutput("p/c", OutputConsole(enabled=False), LogFile(tmp_path / "c.log", 1 << 20), 10)
    out.feed("stdout", b"one\ntwo")
    out.feed("stderr", b"err begun")
    assert out.last_lines() == ["one"]
    assert out.last_lines(begun=True) == ["one", "two", "err begun"]
    assert out.last_lines(2, begun=True) == ["two", "err begun"]
    out.feed("stdout", b" ended\n")
    assert out.last_lines(begun=True) == ["one", "two ended", "err begun"], "left in place: the line goes on"


def test_a_line_begun_quotes_what_the_secret_stream_holds_back_masked(tmp_path: Path) -> None:
    """What could still become a secret is held back from every reader; a line begun quoted before the pipe's end
    (a verdict's, while a grandchild holds the pipe) shows it as the mask, not as nothing: what follows may be the
    secret's rest. An unfinished escape code held alone is invisible, and shows as nothing."""
    out = ChildOutput("p/c", OutputConsole(enabled=False), LogFile(tmp_path / "c.log", 0), 10, Redactor(["hunter22"]))
    out.feed("stdout", b"one\nfatal: cannot open hun")
    out.feed("stderr", b"colour \x1b[3")
    assert out.last_lines(begun=True) == ["one", "fatal: cannot open ***", "colour "]
    out.feed("stdout", b"ter22 two\n")
    assert out.last_lines(begun=True) == ["one", "fatal: cannot open *** two", "colour "]
    out.feed("stdout", b"hunt")
    out.close_stream("stdout")  # never a secret: said whole at the pipe's end
    assert out.last_lines(begun=True) == ["one", "fatal: cannot open *** two", "hunt", "colour "]


def test_nothing_is_held_without_a_possible_secret_start() -> None:
    released, rest = feed_all(Redactor(["hunter22"]), [b"a line\n", b"no secret here", b" still none\n"])
    assert released == [b"a line\n", b"no secret here", b" still none\n"] and rest == b""


def test_the_start_of_a_secret_is_held_until_it_is_known() -> None:
    released, rest = feed_all(Redactor(["hunter22"]), [b"pw: hun", b"ter22 ok\n", b"pw: hun", b"gry\n"])
    assert released == [b"pw: ", b"*** ok\n", b"pw: ", b"hungry\n"] and rest == b""


def test_what_is_held_comes_out_at_close() -> None:
    released, rest = feed_all(Redactor(["hunter22"]), [b"the end: hunt"])
    assert released == [b"the end: "] and rest == b"hunt"


def test_a_line_end_releases_everything() -> None:
    """No secret spans a line end (\\n or \\r): a read that ends with one is passed on whole."""
    released, _ = feed_all(Redactor(["hunter22"]), [b"hun\n", b"hun\r"])
    assert released == [b"hun\n", b"hun\r"]


def test_an_unfinished_escape_is_held_and_a_secret_with_codes_inside_is_masked_keeping_them() -> None:
    released, rest = feed_all(Redactor(["hunter22"]), [b"pw: \x1b[1mhu\x1b[3", b"1mnter\x1b[0m22!\n"])
    assert released == [b"pw: \x1b[1m", b"***\x1b[31m\x1b[0m!\n"] and rest == b""
    released, _ = feed_all(Redactor(["hunter22"]), [b"colour \x1b["])
    assert released == [b"colour "]


def test_a_longer_secret_that_starts_with_a_shorter_one_is_masked_whole() -> None:
    released, rest = feed_all(Redactor(["abcd1234", "abcd1234wxyz"]), [b"k=abcd1234", b"wxyz\n"])
    assert b"".join(released) + rest == b"k=***\n"


def test_what_is_held_stays_bounded() -> None:
    """However much of the open line could be a secret's first bytes, the stream holds back no more
    than the longest secret less one byte."""
    stream = Redactor(["aaaaaaaab", "aaab"]).stream()
    assert stream.feed(b"a" * 100_000) == b"a" * (100_000 - 8)
    assert stream.close() == b"a" * 8


def test_child_output_masks_a_secret_cut_anywhere_for_file_ring_and_taps(tmp_path: Path) -> None:
    """ChildOutput masks where the bytes enter: every reader gets the same masked bytes, wherever the
    read was cut (in an escape code, in the secret, between CR and LF)."""
    data = b"one \x1b[1mhunt\x1b[0mer22 two\r\nthree hunter22\n"
    for cut in range(1, len(data)):
        seen: list[bytes] = []
        output = ChildOutput("p/c", OutputConsole(enabled=False), LogFile(tmp_path / f"{cut}.log", 0), 10,
                             Redactor(["hunter22"]), readers=[seen.extend])
        output.feed("stdout", data[:cut])
        output.feed("stdout", data[cut:])
        output.close_stream("stdout")
        output.file.close()
        assert (tmp_path / f"{cut}.log").read_bytes() == b"one \x1b[1m***\x1b[0m two\r\nthree ***\n", cut
        assert seen == [b"one \x1b[1m***\x1b[0m two", b"three ***"], cut
        assert output.last_lines() == ["one \x1b[1m***\x1b[0m two", "three ***"], cut
