"""A full disk costs log lines and durability, never the lifecycle: real tmpfs mounts filled for real.

``log_dir`` and ``state_dir`` are put on small tmpfs mounts (root only: skipped elsewhere) and filled with a
file from the test, before the start or in the middle of a run; the supervisor must pass on the child's
exit status, say once what it cannot write, say when it can again, and lose no manager call.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sqlite3
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from helpers import (
    PY,
    Console,
    Runner,
    fill,
    free_port,
    py_script,
    sh,
    toml_list,
    toml_str,
    verdict_lines,
    wait_for,
)

from supervisor.app.cli import dev_manager
from supervisor.app.startup import SetupError, prepare_dirs
from supervisor.config import load_plan
from supervisor.engine import logs
from supervisor.engine.logs import LogFile
from supervisor.exits import EXIT_ALREADY_RUNNING
from supervisor.manager import outbox as outbox_mod
from supervisor.manager.outbox import Outbox
from supervisor.text.show import PATH_CHARS, shown

EXIT_CHILD = 4


# ================================================================ log_dir


def test_logfile_on_a_full_disk_says_once_drops_and_says_when_it_works_again(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    disk = tmpfs(tmp_path / "logs", "64k")
    monkeypatch.setattr(logs, "RETRY_WRITE_S", 0.0)  # try again at every write: the test need not wait
    notes: list[str] = []
    log = LogFile(disk / "c.log", 0, notes.append)
    log.write(b"before\n")
    filler = fill(disk)
    for _ in range(50):
        log.write(b"x" * 1000 + b"\n")
    assert len(notes) == 1 and "cannot write" in notes[0] and "No space left" in notes[0], notes
    filler.unlink()
    log.write(b"after\n")
    assert len(notes) == 2 and "works again" in notes[1], notes
    lost = int(re.search(r"(\d+) byte\(s\) of output were lost", notes[1]).group(1))  # type: ignore[union-attr]
    assert lost > 0
    log.close()
    content = (disk / "c.log").read_bytes()
    assert content.startswith(b"before\n") and content.endswith(b"x\nafter\n")
    # (+1: the disk cut a line, ended before "after", which begins a line of its own)
    assert len(content) + lost == len(b"before\n") + 50 * 1001 + len(b"after\n") + 1


def log_until_the_disk_is_full(disk: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LogFile, list[str], Path, int]:
    """A LogFile on ``disk`` (a 64 KiB tmpfs, 30,000 bytes of it taken by a filler) written 1000-byte lines until it
    says it cannot write: 1000 does not divide what is left, so the disk fills inside a line. Returns the file, its
    notes, the filler (unlink it to make room) and the lines sent."""
    monkeypatch.setattr(logs, "RETRY_WRITE_S", 0.0)
    notes: list[str] = []
    log = LogFile(disk / "c.log", 0, notes.append)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * 30_000)
    line, sent = b"x" * 999 + b"\n", 0
    while not notes:
        log.write(line)
        sent += 1
    return log, notes, filler, sent


def test_a_line_a_full_disk_cut_is_ended_before_the_next_one(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # The disk fills in the middle of a line: its rest is lost, and the first line written once the disk has room
    # again began on that cut line (a bug hunter's p.log: "xxxx...xxxline 54 of p", the next line glued on).
    disk = tmpfs(tmp_path / "logs", "64k")
    log, notes, filler, sent = log_until_the_disk_is_full(disk, monkeypatch)
    assert not (disk / "c.log").read_bytes().endswith(b"\n")  # a line cut, and the file ends inside it
    filler.unlink()
    log.write(b"after\n")
    log.close()
    assert len(notes) == 2 and "works again" in notes[1], notes
    lost = int(re.search(r"(\d+) byte\(s\) of output were lost", notes[1]).group(1))  # type: ignore[union-attr]
    lines = (disk / "c.log").read_bytes().split(b"\n")
    assert lines[-2:] == [b"after", b""] and set(lines[-3]) == {ord("x")} and len(lines[-3]) < 999, lines[-3:]
    assert (disk / "c.log").stat().st_size + lost == sent * 1000 + len(b"after\n") + 1  # (+ the cut line's end)


def test_a_log_file_that_works_again_for_one_write_says_so_and_counts_every_byte_lost(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Room comes back, and the first write after it fills the disk again: that write worked in part, yet the file
    # was never said to work again nor to fail again, and its bytes lost, then and since, were never counted (a bug
    # hunter's a.log: lines 0-393, then 1501-2288, and not a word after the first failure, not even at the exit).
    disk = tmpfs(tmp_path / "logs", "64k")
    log, notes, filler, sent = log_until_the_disk_is_full(disk, monkeypatch)
    line = b"x" * 999 + b"\n"
    log.write(line * 3)  # (the disk still full: dropped, counted)
    filler.unlink()
    log.write(line * 50)  # 50 KB into the 32 KiB set free: written in part, then the disk is full again
    log.write(line * 3)
    assert len(notes) == 3, notes
    assert "cannot write" in notes[0] and "works again" in notes[1] and notes[2] == notes[0], notes
    log.close()
    log.close()  # (said once)
    assert len(notes) == 4 and f"writing {disk / 'c.log'} ends still failing; " in notes[3], notes
    lost = [int(n) for n in re.findall(r"(\d+) byte\(s\) of output were lost", "\n".join(notes))]
    assert len(lost) == 2 and lost[0] >= 3 * 1000 and lost[1] >= 3 * 1000, notes
    # Every byte sent is in the file or counted lost (+1: the line the first failure cut, ended in the file).
    assert (disk / "c.log").stat().st_size + sum(lost) == (sent + 3 + 50 + 3) * 1000 + 1


def test_a_console_on_a_full_disk_ends_the_line_it_cut_and_counts_only_the_lines_lost(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # stdout into a file (Vast's ``nohup ... > /var/log/entrypoint.log``) on a disk that fills inside a line: the cut
    # line was glued to the first line written once the disk had room again, and every line of the batch that failed
    # was said lost, the hundreds written before the cut too (a bug hunter's "601 line(s) were lost" for ~270).
    disk = tmpfs(tmp_path / "con", "64k")
    monkeypatch.setattr(logs, "RETRY_WRITE_S", 0.0)  # try again at every batch: the test need not wait
    (disk / "filler").write_bytes(b"\0" * 30_000)
    fd = os.open(disk / "out", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    console = logs.Console(fd)
    notes: list[str] = []
    console.notify = notes.append
    try:
        console.put(b"".join(b"line %05d %s\n" % (i, b"x" * 38) for i in range(1000)))  # 50 KB: more than it holds
        assert wait_for(lambda: notes), "the console never said its write failed"
        lost = console._lost_lines
        console.put(b"still full\n")  # (the disk has no room yet: even the cut line's end cannot be written)
        assert wait_for(lambda: console._lost_lines > lost), "the console never tried again"
        (disk / "filler").unlink()
        console.put(b"after\n")
    finally:
        console.close()
        os.close(fd)
    assert len(notes) == 2 and "cannot write stdout (No space left on device)" in notes[0], notes
    lines = (disk / "out").read_bytes().split(b"\n")
    assert lines[-2:] == [b"after", b""], lines[-3:]
    whole, cut = lines[:-3], lines[-3]
    assert all(len(line) == 49 for line in whole) and cut.startswith(b"line ") and len(cut) < 49, lines[-4:]
    assert notes[1] == f"console: writing stdout works again; {1000 - len(whole) + 1} line(s) were lost there"


def test_logfile_close_and_roll_on_a_full_disk_never_raise(tmp_path: Path,
                                                          tmpfs: Callable[[Path, str], Path]) -> None:
    disk = tmpfs(tmp_path / "logs", "64k")
    notes: list[str] = []
    log = LogFile(disk / "c.log", 8192, notes.append)
    log.write(b"a" * 8000)
    fill(disk)
    log.write(b"b" * 8000)  # past max_bytes: rolls (a rename works), then the write fails
    log.write(b"c" * 8000)  # within the retry interval: dropped without a word
    log.close()
    log.close()
    assert len(notes) == 2 and "cannot write" in notes[0] and "ends still failing" in notes[1], notes


def test_full_log_dir_costs_lines_not_the_lifecycle(sup: Runner,
                                                    tmpfs: Callable[[Path, str], Path]) -> None:
    """A child prints far more than log_dir holds, then exits 4: the supervisor exits 4 with that verdict."""
    tmpfs(sup.log_dir, "64k")
    # Large writes (a pipe read takes up to 64 KiB at once): the file fills in the middle of one.
    chatty = py_script(sup.tmp, "chatty", """
        import os, sys
        for i in range(40):
            os.write(1, b"".join(b"line %d.%d " % (i, j) + b"y" * 200 + b"\\n" for j in range(300)))
        sys.exit(int(sys.argv[1]))
        """, EXIT_CHILD)
    config = sup.write(f"""
        [[phases]]
        name = "chatty"
        command = {chatty}
        """)
    result = sup.run(config, timeout=60)
    assert result.returncode == EXIT_CHILD, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    verdicts = verdict_lines(result.output)
    assert len(verdicts) == 1 and "reason=exit_code" in verdicts[0] and "phase=chatty" in verdicts[0], verdicts
    said = [line for line in result.output.splitlines() if "cannot write" in line]
    # Once per file that filled (the child's, and the supervisor's own): never once per line.
    assert 1 <= len(said) <= 2, said
    assert any("chatty.log" in line for line in said), said
    # Closed still failing: what it lost is counted all the same.
    assert re.search(r"writing \S+/chatty\.log ends still failing; [1-9]\d* byte\(s\) of output were "
                     r"lost there", result.output), result.output[-3000:]
    assert f"exiting with status {EXIT_CHILD}" in result.output


def test_fifos_in_log_dir_are_refused_not_waited_on(sup: Runner) -> None:
    """A FIFO where a log file goes (the supervisor's own, a child's) hung the start, or the loop at the child's
    first line, in open(): no line said, no signal heard, SIGKILL alone ended it. Each is refused in one line, its
    lines dropped, and the lifecycle runs."""
    sup.log_dir.mkdir(parents=True)
    os.mkfifo(sup.log_dir / "supervisor.log")
    os.mkfifo(sup.log_dir / "talks.log")
    config = sup.write(f"""
        [[phases]]
        name = "talks"
        command = {sh("echo hello; exit 3")}
        """)
    result = sup.run(config, timeout=30)
    assert result.returncode == 3, result.output[-3000:]
    for name in ("supervisor.log", "talks.log"):
        assert f"cannot write {sup.log_dir / name}: not a regular file" in result.output, result.output[-3000:]
    assert "[talks/talks] hello" in result.output and "exiting with status 3" in result.output


def refused_at_start(sup: Runner, said: str, log_dir: str | None = None) -> None:
    """A one-phase run (log_dir moved to ``log_dir`` if given) exits 2 before anything starts, its last line
    ``said`` after the config file's name (a config error's, or a start's that names a key of it)."""
    config = sup.write(f"""
        [[phases]]
        name = "p"
        command = {sh("true")}
        """)
    if log_dir is not None:
        config.write_text(config.read_text().replace(toml_str(str(sup.log_dir)), toml_str(log_dir)))
    result = sup.run(config, timeout=30)
    assert result.returncode == 2, result.output[-3000:]
    assert result.output.strip().splitlines()[-1] == f"prover-supervisor: {config}: {said}", result.output[-3000:]


def test_a_log_dir_that_cannot_be_used_is_said_in_one_line_whatever_its_name(sup: Runner) -> None:
    # A newline in the path printed the error over two lines (the path unquoted, as no other error shows one).
    where = "/sys/kernel/a\nlog"
    refused_at_start(sup, f"supervisor.log_dir: cannot use {shown(where, PATH_CHARS)}: Operation not permitted",
                     log_dir=where)
    assert not sup.state_dir.exists(), "state_dir was made for a log_dir that cannot be"


def test_a_log_dir_root_cannot_write_in_is_refused_at_start(sup: Runner) -> None:
    """Root passes os.access(W_OK) everywhere: a log_dir on sysfs was taken, and every line dropped."""
    if not os.path.isdir("/sys/kernel") or os.access("/sys/kernel", os.W_OK) is False:
        pytest.skip("no /sys/kernel that root is told it may write to")
    refused_at_start(sup, "supervisor.log_dir: cannot use /sys/kernel: Permission denied", log_dir="/sys/kernel")
    assert not sup.state_dir.exists(), "state_dir was made for a log_dir that cannot be"


def test_a_state_dir_that_is_a_file_is_said_as_that(sup: Runner) -> None:
    """mkdir's "File exists" of a state_dir that is a file sent the reader looking for a directory. It is found by
    the config's check now, before anything is made."""
    sup.state_dir.write_text("")
    refused_at_start(sup, f"supervisor.state_dir: {shown(str(sup.state_dir))} is a file, not a directory")


def test_a_log_dir_that_is_a_file_leaves_no_state_dir_made(sup: Runner) -> None:
    """The state_dir was made (and its lock taken) before the log_dir was found to be a file."""
    a_file = sup.tmp / "a-file"
    a_file.write_text("")
    assert not sup.state_dir.exists()
    refused_at_start(sup, f"supervisor.log_dir: {shown(str(a_file))} is a file, not a directory", log_dir=str(a_file))
    assert not sup.state_dir.exists()


def test_a_start_refused_by_the_lock_leaves_no_log_dir_made(sup: Runner) -> None:
    """A second start on a state_dir whose lock is held exits 75; its new log_dir (and the parents it made for it)
    was left behind, empty."""
    sup.state_dir.mkdir(parents=True)
    config = sup.write(f'[[phases]]\nname = "p"\ncommand = {sh("true")}\n')
    config.write_text(config.read_text().replace(toml_str(str(sup.log_dir)), toml_str(str(sup.log_dir / "a/b"))))
    with open(sup.state_dir / "supervisor.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        result = sup.run(config, timeout=30)
    assert result.returncode == EXIT_ALREADY_RUNNING, result.output[-3000:]
    assert result.output.strip() == (f"prover-supervisor: another prover-supervisor (pid 4242) already runs the "
                                     f"lifecycle from {sup.state_dir}; not starting a second one"), result.output
    assert not sup.log_dir.exists(), "the refused start left the log_dir it made"
    assert os.listdir(sup.state_dir) == ["supervisor.lock"]


def test_the_start_looks_at_its_dirs_as_check_did(sup: Runner) -> None:
    """What became of state_dir between the load and the start (a link to nothing: mkdir cannot make its target)
    is said in check's words, before either directory is made."""
    plan = load_plan(sup.write('[[phases]]\nname = "p"\ncommand = ["true"]\n'), None, environ={})
    sup.state_dir.symlink_to(sup.tmp / "gone")
    with pytest.raises(SetupError) as refused:
        prepare_dirs(plan)
    assert str(refused.value) == (f"supervisor.state_dir: {shown(str(sup.state_dir))} is a symbolic link to "
                                  f"{shown(str(sup.tmp / 'gone'))}, which does not exist")
    assert not sup.log_dir.exists() and not (sup.tmp / "gone").exists()


# ================================================================ state_dir: the outbox


def outbox_on(disk: Path, notes: list[str]) -> Outbox:
    return Outbox(disk / "outbox.sqlite3", notes.append)


def drain(box: Outbox) -> list[tuple[int, str]]:
    """Deliver every pending call, in the order the outbox gives them: (id, kind)."""
    out = []
    while (call := box.next_pending()) is not None:
        box.delivered(call.id, {"ok": True})
        out.append((call.id, call.kind))
    return out


def file_rows(path: Path) -> list[tuple[int, str, str]]:
    """(id, kind, state) as another process reads the file."""
    with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
        return db.execute("SELECT id, kind, state FROM calls ORDER BY id").fetchall()


def test_outbox_filling_mid_run_keeps_calls_in_memory_then_writes_them(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    disk = tmpfs(tmp_path / "state", "1m")
    monkeypatch.setattr(outbox_mod, "RETRY_WRITE_S", 0.0)  # try the file at every call: no waiting in the test
    notes: list[str] = []
    box = outbox_on(disk, notes)
    first = box.add("register", {"label": "x"})
    box.put("uuid", "u-1")
    filler = fill(disk)
    ids = [box.add("log", {"text": "y" * 2000, "n": n}) for n in range(40)]  # far more than is left
    assert box.in_memory
    assert len([n for n in notes if "cannot write" in n]) == 1, notes
    assert "kept in memory" in notes[0], notes
    assert ids == sorted(ids) and ids[0] > first
    box.put("runner_id", "7")
    assert box.get("uuid") == "u-1" and box.get("runner_id") == "7"
    assert box.pending() == 41
    # Delivered from memory, in order, while the disk is still full.
    assert [i for i, _ in drain(box)][:3] == [first, ids[0], ids[1]]
    later = box.add("param-done", {})
    assert box.in_memory and box.pending() == 1
    filler.unlink()
    assert box.pending() == 1  # any call tries the file again
    assert not box.in_memory
    assert any("can be written again" in n for n in notes), notes
    box.close()
    rows = file_rows(disk / "outbox.sqlite3")
    assert [r[0] for r in rows] == [first, *ids, later], "every call, with the id it was delivered under"
    assert [r[2] for r in rows] == ["delivered"] * 41 + ["pending"]
    again = Outbox(disk / "outbox.sqlite3")
    assert again.get("runner_id") == "7" and again.next_pending() is not None
    again.close()


def test_outbox_full_a_second_time_does_not_write_the_first_times_changes_again(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """What was kept in memory through one full disk is written once: a later full disk keeps only its own changes
    (written again, the first time's rows would put calls delivered since back to pending: sent twice)."""
    disk = tmpfs(tmp_path / "state", "1m")
    monkeypatch.setattr(outbox_mod, "RETRY_WRITE_S", 0.0)
    notes: list[str] = []
    box = outbox_on(disk, notes)
    filler = fill(disk)
    first = [box.add("log", {"text": "y" * 2000, "n": n}) for n in range(5)]
    assert box.in_memory
    filler.unlink()
    assert box.pending() == 5 and not box.in_memory  # written to the file
    assert [i for i, _ in drain(box)] == first  # delivered from the file
    filler = fill(disk)
    later = [box.add("log", {"text": "z" * 2000, "n": n}) for n in range(5)]
    assert box.in_memory
    filler.unlink()
    assert box.pending() == 5 and not box.in_memory, "only the second time's calls are pending"
    assert [i for i, _ in drain(box)] == later
    box.close()
    assert [r[2] for r in file_rows(disk / "outbox.sqlite3")] == ["delivered"] * 10


def test_outbox_full_at_start_is_not_corruption(tmp_path: Path, tmpfs: Callable[[Path, str], Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at open gives SQLITE_IOERR_SHMSIZE ("disk I/O error"): the file stays where it is, its pending
    calls are read and delivered, nothing is moved aside."""
    disk = tmpfs(tmp_path / "state", "512k")
    path = disk / "outbox.sqlite3"
    box = Outbox(path)
    kept = [box.add("param-done", {}), box.add("bench-done", {"rate": 90.0})]
    box.put("uuid", "u-2")
    box.close()  # a clean close: no -shm is left, so the next open must create one
    filler = fill(disk)
    monkeypatch.setattr(outbox_mod, "RETRY_WRITE_S", 3600.0)
    notes: list[str] = []
    box = outbox_on(disk, notes)
    assert box.corrupt_note is None
    assert not list(disk.glob("*.corrupt-*"))
    assert box.in_memory and len(notes) == 1 and "cannot write" in notes[0], notes
    assert box.get("uuid") == "u-2"
    new = box.add("running", {})
    assert drain(box) == [(kept[0], "param-done"), (kept[1], "bench-done"), (new, "running")]
    filler.unlink()
    monkeypatch.setattr(outbox_mod, "RETRY_WRITE_S", 0.0)
    box.close()  # the last chance: written at close
    assert file_rows(path) == [(kept[0], "param-done", "delivered"), (kept[1], "bench-done", "delivered"),
                               (new, "running", "delivered")]


# ================================================================ state_dir under a running supervisor

# A cuzk-bench look-alike: 3 proofs at 1.5 proofs/min → 90 proofs/h (min_rate 50 passes).
FAKE_BENCH = """\
print("  [1/3] COMPLETED", flush=True)
print("=== Batch Summary ===")
print("completed:     3")
print("failed:        0")
print("throughput:    1.500 proofs/min (40.0s/proof)", flush=True)
"""


def wait_file(path: Path) -> str:
    """A shell loop that waits for ``path`` to appear (the test's go signal)."""
    return f"while [ ! -e {path} ]; do sleep 0.05; done"


def reporting_config(sup: Runner, url: str) -> Path:
    bench = sup.tmp / "fake_bench.py"
    bench.write_text(FAKE_BENCH)
    return sup.write(f"""
        [manager]
        url = {toml_str(url)}
        label = "C.diskfull"
        log_push_interval_s = 0.2

        [[phases]]
        name = "params"
        command = {sh(wait_file(sup.tmp / "go1") + "; echo params ok")}
        report = "param-done"

        [[phases]]
        name = "bench"
        command = {toml_list([PY, str(bench)])}
        parse = "cuzk-bench"
        report = "bench-done"

        [[phases]]
        name = "service"
        kind = "service"
        command = {sh("echo serving; " + wait_file(sup.tmp / "go2"))}
        report = "running"
        """)


def test_state_dir_filling_mid_run_loses_no_manager_call(sup: Runner,
                                                         tmpfs: Callable[[Path, str], Path]) -> None:
    state = tmpfs(sup.state_dir, "1m")
    mgr = dev_manager(quiet=True).start()
    try:
        console = Console(sup, reporting_config(sup, mgr.url))
        wait_for(lambda: mgr.state.snapshot()["instances"], 20)
        filler = fill(state)
        (sup.tmp / "go1").touch()
        # param-done, bench-done and running reach the manager from memory while the disk stays full.
        wait_for(lambda: [i["state"] for i in mgr.state.snapshot()["instances"].values()] == ["running"], 30)
        assert console.proc.poll() is None, console.tail()
        text = console.text()
        assert len(re.findall(r"outbox: cannot write", text)) == 1, console.tail()
        filler.unlink()
        (sup.tmp / "go2").touch()
        assert console.finish() == 0, console.tail()
    finally:
        mgr.stop()
    text = console.text()
    assert "Traceback" not in text, console.tail()
    history = next(iter(mgr.state.snapshot()["instances"].values()))["history"]
    assert history == ["registered", "params_done", "bench_done", "running"]
    rows = file_rows(state / "outbox.sqlite3")
    kinds = [kind for _, kind, _ in rows]
    assert [k for k in kinds if k != "log"] == ["register", "param-done", "bench-done", "running"], rows
    assert all(s == "delivered" for _, _, s in rows), rows
    assert "can be written again" in text, console.tail()
    # status.json: said at most once while it could not be written, and written whole once it could.
    assert len(re.findall(r"status: cannot write", text)) <= 1, console.tail()
    snap = json.loads((state / "status.json").read_text())
    assert [p["state"] for p in snap["phases"]] == ["done", "done", "done"]
    # resume.json: the two phases done while the disk was full could not be kept (said once); the one done after
    # wrote the record again, with all three.
    assert len(re.findall(r"resume: cannot write", text)) == 1, console.tail()
    assert f"resume: {state / 'resume.json'} written again" in text, console.tail()
    assert sorted(json.loads((state / "resume.json").read_text())["phases"]) == ["bench", "params", "service"]


def test_state_dir_full_at_start_runs_and_delivers_the_earlier_calls(sup: Runner,
                                                                      tmpfs: Callable[[Path, str], Path]) -> None:
    """Calls left pending by an earlier start, a state_dir full before this one: one line each for the outbox,
    status.json and resume.json, no traceback, the earlier calls delivered first, the lifecycle completes."""
    state = tmpfs(sup.state_dir, "1m")
    mgr = dev_manager(quiet=True).start()
    try:
        # "The earlier start" registered (straight on the dev-manager) and left a call pending.
        answer = requests.post(mgr.url + "/register", json={"label": "C.diskfull", "min_rate": 50}, timeout=5).json()
        earlier = Outbox(state / "outbox.sqlite3")
        earlier.put("label", "C.diskfull")
        earlier.put("uuid", answer["uuid"])
        earlier.put("runner_id", str(answer["runner_id"]))
        left = earlier.add("log", {"source": "setup", "text": "left over from the earlier start\n"})
        earlier.close()
        fill(state)
        (sup.tmp / "go1").touch()
        (sup.tmp / "go2").touch()
        console = Console(sup, reporting_config(sup, mgr.url))
        assert console.finish() == 0, console.tail()
        text = console.text()
        assert "Traceback" not in text, console.tail()
        assert len(re.findall(r"outbox: cannot write", text)) == 1, console.tail()
        assert len(re.findall(r"status: cannot write", text)) == 1, console.tail()
        assert len(re.findall(r"resume: cannot write", text)) == 1, console.tail()
        assert not list(state.glob("*.corrupt-*")), "a full disk is not corruption"
        uuid = answer["uuid"]
        assert f"reusing uuid {uuid}" in text, console.tail()
        snap = mgr.state.snapshot()
        assert snap["instances"][uuid]["history"] == ["registered", "params_done", "bench_done", "running"]
        assert "left over from the earlier start" in snap["logs"][uuid]["setup"]
        assert [c["path"] for c in snap["calls"]][1] == "/api/log-push", "the earlier call went first"
        assert left == 1
    finally:
        mgr.stop()


def test_calls_kept_in_memory_at_the_exit_are_said_lost_not_kept(sup: Runner,
                                                                   tmpfs: Callable[[Path, str], Path]) -> None:
    """The state_dir stays full to the end, the manager away: the exit said the calls "stay in the outbox for the
    next start", then that they were lost, and they were (a reviewer's run): it says where they are, then what
    became of them."""
    state = tmpfs(sup.state_dir, "1m")
    fill(state)
    config = sup.write(f"""
        [manager]
        url = "http://127.0.0.1:{free_port()}"
        label = "C.diskfull"

        [[phases]]
        name = "work"
        command = {sh("echo done")}
        """)
    console = Console(sup, config)
    assert console.finish() == 0, console.tail()
    text = console.text()
    assert "Traceback" not in text and "stay in the outbox for the next start" not in text, console.tail()
    kept = re.search(r"manager: (\d+) call\(s\) not delivered yet, kept in memory \((.+) cannot be written\): "
                     r"they reach the next start only if the file takes them at the close", text)
    assert kept is not None and int(kept.group(1)) >= 1 and kept.group(2) == str(state / "outbox.sqlite3"), text
    lost = re.search(r"outbox: \d+ change\(s\) kept in memory could not be written to .* before exit; the calls "
                     r"among them are lost", text)
    assert lost is not None and lost.start() > kept.start(), console.tail()


# ================================================================ cuzk.toml in a full state_dir


def test_outbox_that_cannot_even_be_opened_goes_on_in_memory_then_joins_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory where the file should be (SQLITE_CANTOPEN): nothing can be read, so memory starts empty with
    ids far above the file's; once a file can be made, the calls go into it after whatever it holds."""
    monkeypatch.setattr(outbox_mod, "RETRY_WRITE_S", 0.0)
    path = tmp_path / "outbox.sqlite3"
    path.mkdir()
    notes: list[str] = []
    box = Outbox(path, notes.append)
    assert box.in_memory and box.corrupt_note is None
    assert len(notes) == 1 and "could not even be read" in notes[0], notes
    first = box.add("register", {})
    assert first >= outbox_mod.UNREADABLE_FIRST_ID and box.in_memory  # (the directory is still there)
    path.rmdir()
    second = box.add("param-done", {})  # tries the file again first: made, and the first call written into it
    assert not box.in_memory and "can be written again" in notes[-1], notes
    assert second == first + 1
    box.close()
    assert file_rows(path) == [(first, "register", "pending"), (second, "param-done", "pending")]


def test_a_damaged_outbox_that_cannot_be_moved_aside_is_left_alone(tmp_path: Path) -> None:
    """Bind-mounted onto itself the file cannot be renamed (EBUSY): it is salvaged into memory and never
    written again in this run, rather than the run dying or a fresh file being made over it."""
    if os.geteuid() != 0:
        pytest.skip("not root: cannot bind-mount")
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path)
    kept = box.add("param-done", {})
    box.put("uuid", "u-3")
    box.close()
    damaged = bytearray(path.read_bytes())
    page_size = int.from_bytes(damaged[16:18], "big")
    damaged[page_size: 2 * page_size] = b"\xde\xad" * (page_size // 2)  # page 2: the calls table's root
    path.write_bytes(bytes(damaged))
    if subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind failed")
    try:
        notes: list[str] = []
        box = Outbox(path, notes.append)
        assert box.corrupt_note is not None and "could not be moved aside" in box.corrupt_note, box.corrupt_note
        assert box.in_memory
        assert box.get("uuid") == "u-3"
        new = box.add("running", {})
        assert new > kept
        box.close()
        assert path.read_bytes() == bytes(damaged), "never written over"
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def test_a_copy_of_a_file_another_connection_holds_locked_gives_up_and_goes_on(tmp_path: Path) -> None:
    # The outbox copies its file into memory when the file cannot be used; sqlite's backup retries a busy file for
    # ever, and an exit that read the outbox hung there (test_resume_demo's restart ran past its 40 s).
    path = tmp_path / "outbox.sqlite3"
    outbox = Outbox(path)
    outbox.add("param-done", {})
    outbox.close()  # (its connection gone: the next read copies the file into memory)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        read: list[int] = []
        reader = threading.Thread(target=lambda: read.append(outbox.pending()), daemon=True)
        reader.start()
        reader.join(outbox_mod.COPY_WAIT_S + 30)
        assert not reader.is_alive(), "the read waited on the lock for ever"
        assert read == [0]  # the file could not be read: its call goes out once it can be (said in the log)
    finally:
        holder.close()


def test_the_supervisors_own_log_closed_still_failing_counts_what_it_lost(
        sup: Runner, tmpfs: Callable[[Path, str], Path]) -> None:
    """log_dir full from the start: supervisor.log takes none of the supervisor's lines. At the exit it is closed
    like a child's file, and the console hears what it lost there, not only that it could not be written."""
    fill(tmpfs(sup.log_dir, "64k"))
    config = sup.write(f"""
        [[phases]]
        name = "short"
        command = {sh(f"exit {EXIT_CHILD}")}
        """)
    result = sup.run(config, timeout=60)
    assert result.returncode == EXIT_CHILD, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    assert re.search(r"cannot write \S+/supervisor\.log", result.output), result.output[-3000:]
    assert re.search(r"writing \S+/supervisor\.log ends still failing; [1-9]\d* byte\(s\) of output were "
                     r"lost there", result.output), result.output[-3000:]
