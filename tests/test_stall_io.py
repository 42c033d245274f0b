"""A stall is silence of every sign of life, the kernel's I/O counters among them (issue 21): real programs
that print nothing for long (the real aria2c into a pipe, a hasher, a silent reader) are never stalled while
they move bytes, and those that move none (blocked in recv after 1 MiB, spinning) still are, within stall_s.
What aria2c writes to allocate its file where fallocate is refused (zeros) is life, but no progress.

Each runs the real supervisor against real children and, for the download, Debian's real aria2c (as curio
runs it) from a local HTTP server on 127.0.0.1, throttled with --max-download-limit.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    PACED_WRITER,
    PY,
    REPO,
    Console,
    Runner,
    clean_env,
    dead_gateway,
    first_line,
    one_verdict,
    py_script,
    seconds_between,
    sh,
    status_now,
    toml_list,
    toml_str,
    v1_memory_cgroup_or_skip,
    wait_for,
)
from nofalloc import nofalloc_shim

from supervisor.evidence.iowatch import read_io
from supervisor.exits import EXIT_TIMEOUT

MIB = 1 << 20
ARIA2C = shutil.which("aria2c")


@pytest.fixture(autouse=True)
def _io_accounting() -> None:
    import os

    if read_io(os.getpid()) is None:
        pytest.skip("/proc/<pid>/io is not readable here (a kernel without task I/O accounting)")


def phase(command: str, stall_s: float, extra: str = "") -> str:
    return f"""
        [[phases]]
        name = "p"
        stall_s = {stall_s}
        command = {command}
        {extra}
        """


# ================================================================ a local server


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_args: Any) -> None:  # quiet
        pass


class _Stingy(http.server.BaseHTTPRequestHandler):
    """Promises 16 MiB, sends 1 MiB, then holds the connection open without a byte more."""

    release = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(16 * MIB))
        self.end_headers()
        self.wfile.write(b"x" * MIB)
        self.wfile.flush()
        self.release.wait(60)

    def log_message(self, *_args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(handler: Any) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Stingy.release.set()
        server.shutdown()
        server.server_close()
        _Stingy.release.clear()


def files_handler(root: Path) -> Any:
    class Handler(_Files):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

    return Handler


# ================================================================ silent work is not a stall


def test_a_silent_hasher_is_not_stalled(sup: Runner) -> None:
    # curio checks each parameter file's blake2b before and after the download: minutes of reading, no line.
    data = sup.tmp / "params.bin"
    data.write_bytes(b"p" * (16 * MIB))
    hasher = py_script(sup.tmp, "hasher", f"""
        import hashlib, time
        end = time.monotonic() + 5
        while time.monotonic() < end:
            with open({str(data)!r}, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    hashlib.blake2b(chunk)
        """)
    result = sup.run(sup.write(phase(hasher, 1.5)), timeout=40)
    out = result.output
    assert result.returncode == 0, out
    assert "reason=stalled" not in out, out
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p")


def test_a_daemon_that_left_with_its_environment_cleared_is_still_the_phases_io(sup: Runner) -> None:
    # setsid -f env -i: out of the process group, out of the parent chain, and without the supervisor's tag, so
    # none of the trees knew it; only the phase's cgroup does. Its steady writes were no sign of life: the phase,
    # silent itself while it waited on it, was stalled at stall_s and the writer killed as an escapee.
    v1_memory_cgroup_or_skip()
    writer = sup.tmp / "writer.py"
    writer.write_text(textwrap.dedent(f"""\
        import time
        with open({str(sup.tmp / "out.bin")!r}, "wb") as fh:
            for _ in range(24):
                fh.seek(0)
                fh.write(b"x" * (1 << 20))
                fh.flush()
                time.sleep(0.25)
        """))
    command = sh(f"echo go; setsid -f env -i {PY} {writer}; sleep 5; echo finished")
    result = sup.run(sup.write(phase(command, 2)), timeout=40)
    out = result.output
    assert "per-phase mode" in out, out  # (else no cgroup of its own knows the writer)
    assert result.returncode == 0, out
    assert "reason=stalled" not in out, out
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p")


def aria2c_dirs(sup: Runner) -> tuple[Path, Path]:
    """The folder served and aria2c's cache, made; the test skipped where aria2c is not installed."""
    if ARIA2C is None:
        pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it)")
    served, cache = sup.tmp / "served", sup.tmp / "cache"
    served.mkdir()
    cache.mkdir()
    return served, cache


def test_the_real_aria2c_into_a_pipe_is_not_stalled_and_its_progress_is_live(sup: Runner) -> None:
    served, cache = aria2c_dirs(sup)
    (served / "f.params").write_bytes(b"\x07" * (6 * MIB))
    with serving(files_handler(served)) as url:
        # As curio runs it (lib/fastparamfetch/paramfetch.go), throttled: 6 MiB at 512 KiB/s is 12 s of work,
        # three times stall_s; its readout stays in its pipe's buffer until the file is done.
        argv = [ARIA2C, "--max-download-limit=512K", "--lowest-speed-limit", "16K", "-m100", "--retry-wait", "10",
                "--continue", "-x16", "-s16", "--dir", str(cache), "-o", "f.params", f"{url}/f.params"]
        config = sup.write(phase(toml_list(argv), 4, f"progress_path = {toml_str(str(cache))}\n"
                                                      f"progress_total = \"6MiB\""))
        run = Console(sup, config)
        seen: list[dict[str, Any]] = []

        def mid_file_progress() -> bool:
            snap = status_now(sup)
            ph = next((p for p in snap.get("phases", []) if p.get("name") == "p"), {})
            progress = ph.get("progress") or {}
            incomplete = (cache / "f.params.aria2").exists()
            if incomplete and progress.get("done_bytes", 0) > 0:
                seen.append({**progress, "stall": (ph.get("timers") or {}).get("stall")})
                return True
            return run.proc.poll() is not None

        wait_for(mid_file_progress, 30, 0.3)
        code = run.finish(60)
    out = run.text()
    assert code == 0, out
    assert "reason=stalled" not in out, out
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p")
    assert seen, f"no done_bytes while the file was under way (its readout is buffered): {out[-2000:]}"
    assert 0 < seen[0]["done_bytes"] < 6 * MIB, seen
    assert "I/O" in (seen[0]["stall"] or {}).get("signs", {}), seen  # the status shows each sign's age


def test_the_real_aria2c_as_the_runs_last_phase_leaves_its_whole_figure_in_status_json(sup: Runner) -> None:
    """A download that ended well takes its last figures from a settled walk, off the loop: as the run's last phase
    it ended with the run, and status.json kept the last tick's (90% and 0 file(s) complete of a fetch that was
    whole). The exit now waits for that walk (a bound of seconds)."""
    served, cache = aria2c_dirs(sup)
    (served / "f.params").write_bytes(b"\x07" * (3 * MIB))
    with serving(files_handler(served)) as url:
        argv = [ARIA2C, "--max-download-limit=1M", "--continue", "-x16", "-s16", "--dir", str(cache),
                "-o", "f.params", f"{url}/f.params"]
        config = sup.write(phase(toml_list(argv), 10, f"progress_path = {toml_str(str(cache))}\n"
                                                       f"progress_total = \"3MiB\""))
        result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    saved = json.loads((sup.state_dir / "status.json").read_text())
    [progress] = [p["progress"] for p in saved["phases"] if p["name"] == "p"]
    assert (progress["done_bytes"], progress["files_done"], progress["eta_s"]) == (3 * MIB, 1, 0.0), progress


def stall_timer(sup: Runner) -> dict[str, Any]:
    """Phase p's stall timer as ``status`` shows it now ({} while there is none)."""
    ph = next((p for p in status_now(sup).get("phases", []) if p.get("name") == "p"), {})
    return (ph.get("timers") or {}).get("stall") or {}


def test_the_real_aria2c_on_a_dead_gateway_is_stalled_though_it_repeats_its_readout(sup: Runner) -> None:
    """A gateway that takes the connection and never answers: aria2c waits for headers (no size, no file, no body
    for --lowest-speed-limit to judge), tries again silently (-m100), and prints the same readout a second, which
    reaches the pipe with its progress summary (every --summary-interval: 60 s as curio runs it, 2 s here). Each
    burst was output, so the phase was never stalled: it ran to timeout_s (85 minutes in the profile), status saying
    it was alive. Its parser (parse = "paramfetch") marks those lines as saying nothing moved: stalled at stall_s."""
    _, cache = aria2c_dirs(sup)
    with dead_gateway() as url:
        argv = [ARIA2C, "--summary-interval=2", "--lowest-speed-limit", "16K", "-m100", "--retry-wait", "10",
                "--continue", "-x16", "-s16", "--dir", str(cache), "-o", "f.params", f"{url}/f.params"]
        config = sup.write(phase(toml_list(argv), 8, f"progress_path = {toml_str(str(cache))}\n"
                                                      f"parse = \"paramfetch\"\nprogress_total = \"1GiB\"\n"
                                                      f"timeout_s = 40"))
        run = Console(sup, config)
        shown: list[dict[str, Any]] = []

        def said_nothing_moved() -> bool:
            timer = stall_timer(sup)
            if timer.get("idle_output_s") is not None:
                shown.append(timer)
                return True
            return run.proc.poll() is not None

        wait_for(said_nothing_moved, 50, 0.3)  # (past timeout_s: a phase never stalled ends at it)
        code = run.finish(60)
    out = run.text()
    assert code == EXIT_TIMEOUT, out[-4000:]
    record = one_verdict(out, "p")
    assert " reason=stalled " in record, record
    assert "output since then said nothing moved" in record, record
    assert out.count("Download Progress Summary") >= 2, out[-4000:]  # it printed all along, and was no sign
    took = seconds_between(first_line(out, "phase p: pending → starting"), first_line(out, "phase p: stalled: "))
    print(f"stalled {took:.1f}s after the start (stall_s=8, a summary every 2 s): {record}")
    assert 8 <= took < 8 + 15, out[-4000:]  # generous; far from timeout_s (40 s here)
    # While it ran, status said how old the last output that was a sign is, and that output since said nothing.
    assert shown and shown[0]["signs"]["output"] > shown[0]["idle_output_s"], shown


def test_the_real_aria2c_read_by_its_parser_is_not_stalled_while_its_readouts_move(sup: Runner) -> None:
    """The same reading of a healthy download, throttled: 6 MiB at 512 KiB/s with a summary every 2 s. Its readouts
    move, so each burst is output (the I/O and the file's writes are signs of their own): never stalled."""
    served, cache = aria2c_dirs(sup)
    (served / "f.params").write_bytes(b"\x07" * (6 * MIB))
    with serving(files_handler(served)) as url:
        argv = [ARIA2C, "--summary-interval=2", "--max-download-limit=512K", "--lowest-speed-limit", "16K", "-m100",
                "--retry-wait", "10", "--continue", "-x16", "-s16", "--dir", str(cache), "-o", "f.params",
                f"{url}/f.params"]
        config = sup.write(phase(toml_list(argv), 4, f"progress_path = {toml_str(str(cache))}\n"
                                                      f"parse = \"paramfetch\"\nprogress_total = \"6MiB\""))
        run = Console(sup, config)
        ages: list[float] = []

        def output_was_life() -> bool:
            timer = stall_timer(sup)
            if (cache / "f.params.aria2").exists() and timer.get("signs", {}).get("output") is not None:
                ages.append(timer["signs"]["output"])
            return run.proc.poll() is not None

        wait_for(output_was_life, 60, 0.3)
        code = run.finish(30)
    out = run.text()
    assert code == 0, out[-4000:]
    assert "reason=stalled" not in out, out[-4000:]
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p")
    assert out.count("Download Progress Summary") >= 2, out[-4000:]
    assert ages and min(ages) < 2.5, ages  # a burst of moving readouts was output, seen within a look or two


def sparse_files(served: Path, sizes: dict[str, int]) -> None:
    """Files to serve, each of its size (sparse: zeros, on no disk)."""
    for name, size in sizes.items():
        with open(served / name, "wb") as fh:
            fh.truncate(size)


def download_phase(sup: Runner, argv: list[str], cache: Path, total: str, deadline_s: int) -> Path:
    """A download phase of ``argv`` into ``cache``: stall_s 60, its deadline, and a window of 8 s."""
    return sup.write(phase(toml_list(argv), 60, f"progress_path = {toml_str(str(cache))}\n"
                                               f"progress_total = \"{total}\"\n"
                                               f"progress_deadline_s = {deadline_s}\nprogress_window_s = 8"))


def progress_while_running(sup: Runner, run: Console) -> tuple[int, list[dict[str, Any]]]:
    """The exit status of ``run``'s supervisor, and each progress figure of phase p status showed while it ran."""
    seen: list[dict[str, Any]] = []

    def look() -> bool:
        ph = next((p for p in status_now(sup).get("phases", []) if p.get("name") == "p"), {})
        if ph.get("state") == "running" and ph.get("progress"):
            seen.append(ph["progress"])
        return run.proc.poll() is not None

    wait_for(look, 120, 0.3)
    return run.finish(30), seen


@pytest.mark.parametrize("link", ["too-slow", "fast-enough"])
def test_the_real_aria2c_zero_filling_without_fallocate_shows_no_zeros_as_progress(sup: Runner, link: str) -> None:
    """Where the filesystem refuses fallocate, aria2c writes its file whole with zeros first and makes its control
    file only once they are flushed. Measured before: 100% at once in status (the zeros' bytes written), the file
    counted complete while they were flushed, then 'has less complete (a file removed)' as the control file came,
    and a link far too slow for the deadline not given up (the rate the disk's). Now the zeros are no progress:
    the slow link is given up too_slow at its window as on a filesystem with fallocate, and one fast enough is
    never stopped, though its zeros' flush outlasts the window (that time is not the link's)."""
    served, cache = aria2c_dirs(sup)
    shim = nofalloc_shim(sup.tmp)
    size = 64 * MIB
    sparse_files(served, {"f.params": size})
    # 64 MiB at 512 KiB/s is 128 s, with 60 allowed. At 4 MiB/s it is 16 s or so, after a flush of 12 s (longer than
    # the window: the link's first seconds after it, read over the flush too, were a link far too slow) and before
    # the last flush of 12 s, with 90 allowed.
    slow = link == "too-slow"
    rate, flush_s, deadline_s = ("512K", 4, 60) if slow else ("4M", 12, 90)
    with serving(files_handler(served)) as url:
        argv = ["env", f"LD_PRELOAD={shim}", f"NOFALLOC_FSYNC_S={flush_s}", ARIA2C, f"--max-download-limit={rate}",
                "--lowest-speed-limit", "16K", "-m100", "--retry-wait", "10", "--continue", "-x16", "-s16", "--dir",
                str(cache), "-o", "f.params", f"{url}/f.params"]
        config = download_phase(sup, argv, cache, "64MiB", deadline_s)
        run = Console(sup, config)
        code, seen = progress_while_running(sup, run)
    out = run.text()
    assert "Allocating disk space" in out, f"aria2c did not zero-fill (the shim did not hold): {out[-3000:]}"
    assert "no longer count" not in out and "a file removed" not in out, out
    assert seen, out
    assert all(s["files_done"] == 0 for s in seen), seen  # never whole while it was under way
    if slow:
        assert code == EXIT_TIMEOUT, out
        record = one_verdict(out, "p")
        assert " reason=too_slow " in record, record
        assert max(s["done_bytes"] for s in seen) < size // 4, seen  # the link's bytes, never the zeros
        starting, ended = first_line(out, "phase p: pending → starting"), first_line(out, "cannot make it in time")
        print(f"too_slow {seconds_between(starting, ended):.1f}s after the start (progress_window_s=8): {seen[-1]}")
        assert seconds_between(starting, ended) < 8 + 30, out  # generous: at its window, not at the deadline
    else:
        assert code == 0, out
        assert " reason=exit_code exit_code=0 " in one_verdict(out, "p"), out
        assert "too_slow" not in out, out


@pytest.mark.parametrize("link", ["too-slow", "fast-enough"])
def test_the_real_aria2c_fetching_a_list_without_fallocate_shows_no_file_s_zeros_as_progress(sup: Runner,
                                                                                            link: str) -> None:
    """One aria2c fetching a list (``-i``, a file at a time) where fallocate is refused zero-fills each file in its
    turn. Once its first file had held its control file, every later write was taken for the download's: the second
    file's zeros counted as got (status at 100% within seconds), and the too-slow link was given up only at its
    deadline. Each file's zeros are allocation now, and a link fast enough is left to finish."""
    served, cache = aria2c_dirs(sup)
    shim = nofalloc_shim(sup.tmp)
    sizes = {"small.params": 2 * MIB, "big.params": 48 * MIB}
    sparse_files(served, sizes)
    with serving(files_handler(served)) as url:
        listed = sup.tmp / "list.txt"
        listed.write_text("".join(f"{url}/{name}\n" for name in sizes))
        # 50 MiB at 512 KiB/s is 100 s, with 60 allowed: too slow, seen at its window (8 s) once the link is read.
        # At 4 MiB/s it is 13 s or so.
        slow = link == "too-slow"
        argv = ["env", f"LD_PRELOAD={shim}", ARIA2C, "-i", str(listed), "-j1",
                f"--max-download-limit={'512K' if slow else '4M'}",
                "--lowest-speed-limit", "16K", "-m100", "--retry-wait", "10", "--continue", "--dir", str(cache)]
        config = download_phase(sup, argv, cache, "50MiB", 60)
        run = Console(sup, config)
        code, seen = progress_while_running(sup, run)
    out = run.text()
    assert seen and max(s["done_bytes"] for s in seen) <= 50 * MIB, seen
    if not slow:
        assert code == 0 and "too_slow" not in out, out
        return
    assert code == EXIT_TIMEOUT, out
    assert " reason=too_slow " in one_verdict(out, "p"), out
    assert seen and max(s["done_bytes"] for s in seen) < 25 * MIB, seen  # the link's bytes, never the big's zeros
    starting, ended = first_line(out, "phase p: pending → starting"), first_line(out, "cannot make it in time")
    print(f"too_slow {seconds_between(starting, ended):.1f}s after the start: {seen[-1]}")
    assert seconds_between(starting, ended) < 45, out  # generous: at its window once the link is read, not at 60 s


# ================================================================ no data yet is no rate

LATE_S = 6  # before the first byte: a gateway slow to answer, aria2c retrying its connection
LATE_RATE = 4 * MIB  # then, a second
LATE_SIZE = 16 * MIB


class _Late(http.server.BaseHTTPRequestHandler):
    """Answers after LATE_S, then sends LATE_SIZE at LATE_RATE."""

    def do_GET(self) -> None:
        time.sleep(LATE_S)
        self.send_response(200)
        self.send_header("Content-Length", str(LATE_SIZE))
        self.end_headers()
        chunk = LATE_RATE // 8
        for _ in range(LATE_SIZE // chunk):
            self.wfile.write(b"\x01" * chunk)
            time.sleep(1 / 8)

    def log_message(self, *_args: Any) -> None:
        pass


def late_phase(sup: Runner, command: str, size: int, deadline_s: int) -> Path:
    cache = sup.tmp / "cache"
    return sup.write(phase(command, 30, f"progress_path = {toml_str(str(cache))}\nprogress_total = {size}\n"
                                        f"progress_deadline_s = {deadline_s}\nprogress_window_s = 3"))


@pytest.mark.parametrize("downloader", ["silent", "one-line", "aria2c"])
def test_a_download_whose_data_comes_late_is_judged_on_its_data_not_its_silence(sup: Runner, downloader: str) -> None:
    """A download that moved no data for longer than its window was judged on every byte its tree wrote (the spawn's
    own setup writes, a line of output): a few bytes a second, too_slow, never retried, the instance given up
    (measured: "80.0MiB left at 0B/s", "80.0MiB left at 18B/s"; with the real aria2c "48.0MiB left at 85B/s", its
    NOTICE line). Silence is the stall watch's: the window and the rate begin with the data."""
    cache = sup.tmp / "cache"
    cache.mkdir()
    if downloader == "aria2c":
        if ARIA2C is None:
            pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it)")
        with serving(_Late) as url:
            argv = [ARIA2C, "-x1", "--dir", str(cache), "-o", "params.bin", f"{url}/params.bin"]
            result = sup.run(late_phase(sup, toml_list(argv), LATE_SIZE, 60), timeout=60)
    else:
        line = ["fetching params.bin"] if downloader == "one-line" else []
        writer = py_script(sup.tmp, "late", PACED_WRITER, cache, LATE_RATE, LATE_SIZE, LATE_S, *line)
        result = sup.run(late_phase(sup, writer, LATE_SIZE, 60), timeout=60)
    out = result.output
    assert result.returncode == 0, out[-4000:]
    assert "too_slow" not in out and "cannot make it in time" not in out, out[-4000:]
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p"), out[-4000:]
    assert (cache / "params.bin").stat().st_size == LATE_SIZE


def test_a_link_too_slow_after_a_silence_is_given_up_on_its_own_rate_at_its_window(sup: Runner) -> None:
    """The silence before the data is no rate, but the data's rate still is: 8 KiB/s against a deadline it cannot
    make is given up one window after it began, at its own rate (not at the silence's, and not at the deadline)."""
    cache = sup.tmp / "cache"
    cache.mkdir()
    writer = py_script(sup.tmp, "late", PACED_WRITER, cache, 8 << 10, LATE_SIZE, LATE_S)
    result = sup.run(late_phase(sup, writer, LATE_SIZE, 300), timeout=60)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out[-4000:]
    record = one_verdict(out, "p")
    assert " reason=too_slow " in record, record
    detail = first_line(out, "cannot make it in time")
    rate = detail.split(" left at ")[1].split("/s")[0]
    assert rate.endswith("KiB") and 6 <= float(rate[:-3]) <= 12, detail  # 8 KiB/s, as the tree wrote it
    took = seconds_between(first_line(out, "phase p: pending → starting"), detail)
    print(f"too_slow {took:.1f}s after the start (silent {LATE_S}s, progress_window_s=3): {detail}")
    assert LATE_S + 3 <= took < LATE_S + 3 + 15, out[-4000:]  # at its window after the data began (generous)


# ================================================================ no bytes moved is still a stall


def test_a_downloader_that_receives_1_mib_and_then_blocks_is_stalled(sup: Runner) -> None:
    with serving(_Stingy) as url:
        target = sup.tmp / "got.bin"
        downloader = py_script(sup.tmp, "download", f"""
            import urllib.request
            with urllib.request.urlopen({url + "/f"!r}, timeout=120) as resp, open({str(target)!r}, "wb") as out:
                while chunk := resp.read(65536):
                    out.write(chunk)
                    out.flush()
            """)
        result = sup.run(sup.write(phase(downloader, 2)), timeout=40)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    record = one_verdict(out, "p")
    assert " reason=stalled " in record, record
    assert "no output for" in record and "no I/O for" in record, record
    assert target.stat().st_size == MIB  # it got its 1 MiB, then sat in recv
    starting = first_line(out, "phase p: pending → starting")
    stalled = first_line(out, "phase p: stalled: ")
    named_after = seconds_between(starting, stalled)
    print(f"stall named {named_after:.2f}s after the start (1 MiB at once, then nothing; stall_s=2)")
    assert named_after >= 2 - 0.01
    assert named_after < 2 + 8, out  # generous: the bound that says it is named at all


def test_a_spinning_process_is_stalled(sup: Runner) -> None:
    spinner = py_script(sup.tmp, "spin", """
        import time
        end = time.monotonic() + 60
        while time.monotonic() < end:
            pass
        """)
    result = sup.run(sup.write(phase(spinner, 1.5)), timeout=40)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    record = one_verdict(out, "p")
    assert " reason=stalled " in record, record
    assert "no output for" in record and "no I/O for" in record, record


def test_a_child_stopped_by_sigstop_is_shown_stopped_and_its_stall_says_why(sup: Runner) -> None:
    # Its stop was said in the log, but status listed it "running" and the verdict (the termination log, the
    # manager) gave no cause for the silence (a reviewer's run).
    pidfile = sup.tmp / "w.pid"
    writer = py_script(sup.tmp, "writer", f"""
        import time
        write_pid({str(pidfile)!r})
        while True:
            print("working", flush=True)
            time.sleep(0.1)
        """)
    console = Console(sup, sup.write(phase(writer, 3)))
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30))
    console.wait_text("[p/p] working")
    os.kill(pid, signal.SIGSTOP)
    console.wait_text(f"p/p (pid {pid}) was stopped by SIGSTOP")
    shown = json.loads(subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sup.state_dir)],
                                      capture_output=True, text=True, timeout=30, cwd=REPO, env=clean_env()).stdout)
    assert [c["state"] for c in shown["children"]] == ["stopped by SIGSTOP"], shown["children"]
    assert console.finish() == EXIT_TIMEOUT, console.tail()
    record = one_verdict(console.text(), "p")
    assert " reason=stalled " in record and "; p/p stopped by SIGSTOP (job control: nothing runs until SIGCONT)" in \
        record, record


def test_each_silent_sign_is_named_with_its_age(sup: Runner) -> None:
    # A little output, then writes for a while, then nothing: each sign is named with its own silence.
    writer = py_script(sup.tmp, "writer", f"""
        import time
        print("begun", flush=True)
        with open({str(sup.tmp / "w.bin")!r}, "wb") as fh:
            for _ in range(12):
                fh.write(b"w" * 65536)
                fh.flush()
                time.sleep(0.25)
        time.sleep(60)
        """)
    result = sup.run(sup.write(phase(writer, 2)), timeout=40)
    out = result.output
    assert result.returncode == EXIT_TIMEOUT, out
    record = one_verdict(out, "p")
    fields = dict(part.split(" for ", 1) for part in
                  record.split("stalled: ", 1)[1].split(" (")[0].split(", "))
    output_age = float(fields["no output"].rstrip("s"))
    io_age = float(fields["no I/O"].rstrip("s"))
    assert io_age >= 2 - 0.05 and output_age > io_age + 1.5, record  # output stopped first, I/O 3 s later


SETPRIV = shutil.which("setpriv")
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


def foreign_io_readable() -> bool:
    """Whether this kernel lets root without CAP_SYS_PTRACE read another user's /proc/<pid>/io: the two tests
    below are about the kernels that refuse it (every one these tests have met). Asked of the kernel before the
    run, not read from the supervisor's output, so that a supervisor that stopped saying the refusal fails them
    rather than skipping them."""
    assert SETPRIV is not None
    other = subprocess.Popen([SETPRIV, *NOBODY, "sleep", "30"])
    try:
        until = time.monotonic() + 10
        while "Uid:\t65534" not in Path(f"/proc/{other.pid}/status").read_text():  # (setpriv has switched)
            assert other.poll() is None, f"setpriv could not become uid 65534 (exit {other.returncode})"
            assert time.monotonic() < until, "setpriv never became uid 65534"
            time.sleep(0.01)
        read = f"open('/proc/{other.pid}/io').read()"
        probe = subprocess.run([SETPRIV, "--bounding-set=-sys_ptrace", PY, "-c", read], capture_output=True,
                               text=True, timeout=30)
        return probe.returncode == 0
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(SETPRIV is None, reason="no setpriv (util-linux) to drop CAP_SYS_PTRACE and change user")
@pytest.mark.skipif(os.geteuid() != 0, reason="not root: cannot run a worker as another user (setpriv --reuid)")
def test_a_worker_whose_io_counters_are_not_ours_to_read_is_said_not_taken_for_silence(sup: Runner) -> None:
    """Docker's default set has no CAP_SYS_PTRACE, and a worker run as another user (gosu, setpriv) refuses its
    /proc/<pid>/io to root: the supervisor saw "no I/O for 35s" of a download that had written 35 MiB, and said
    nothing of why. The refusal is said when found, and a stall found meanwhile says the silence is partly
    unmeasured."""
    writer = ("import os, time\nfd = os.open('/dev/null', os.O_WRONLY)\nend = time.monotonic() + 30\n"
              "while time.monotonic() < end:\n    os.write(fd, b'x' * 65536)\n    time.sleep(0.02)\n")
    if foreign_io_readable():
        pytest.skip("this kernel lets root without CAP_SYS_PTRACE read another user's I/O counters")
    worker = [SETPRIV, *NOBODY, PY, "-c", writer]
    config = sup.write(phase(toml_list(["sh", "-c", '"$@"; echo worker-exit=$?', "sh", *worker]), 2),
                       header=False)
    config.write_text(sup.header(extra='cgroups = "off"') + config.read_text())
    done = subprocess.run([SETPRIV, "--bounding-set=-sys_ptrace", PY, "-m", "supervisor", "run", "--config",
                           str(config)], capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == EXIT_TIMEOUT, out
    said = first_line(out, "I/O watch: the I/O counters of pid ")
    assert said.endswith("cannot be read (another user's process, and the supervisor lacks CAP_SYS_PTRACE): its "
                         "reads and writes are no sign of life"), said
    record = one_verdict(out, "p")
    assert " reason=stalled " in record, record
    assert "(the I/O counters of 1 of its processes unreadable: another user's, and no CAP_SYS_PTRACE)" in record, \
        record


@pytest.mark.skipif(SETPRIV is None, reason="no setpriv (util-linux) to drop CAP_SYS_PTRACE and change user")
@pytest.mark.skipif(os.geteuid() != 0, reason="not root: cannot run a worker as another user (setpriv --reuid)")
def test_the_real_aria2c_as_another_user_is_kept_alive_by_its_writes_under_progress_path(sup: Runner) -> None:
    """The real aria2c run as another user, by a supervisor without CAP_SYS_PTRACE: its I/O counters cannot be
    read, its readout sits in its pipe's buffer, and its file is preallocated (full size at once): a healthy
    download was stalled after stall_s with "no progress_path growth". Its writes move the file's mtime, and
    those keep it alive; the refusal of its counters is said all the same."""
    if ARIA2C is None:
        pytest.skip("aria2c is not installed (Debian package aria2; .ci/run installs it)")
    if foreign_io_readable():
        pytest.skip("this kernel lets root without CAP_SYS_PTRACE read another user's I/O counters")
    with tempfile.TemporaryDirectory(dir="/tmp") as reachable:  # (pytest's tmp is root's alone: 0700)
        Path(reachable).chmod(0o755)  # (mkdtemp makes it 0700)
        served, cache = sup.tmp / "served", Path(reachable) / "cache"
        served.mkdir()
        cache.mkdir()
        cache.chmod(0o777)
        (served / "f.params").write_bytes(b"\x07" * (6 * MIB))
        with serving(files_handler(served)) as url:
            # 6 MiB at 512 KiB/s: 12 s of work, three times stall_s, in silence but for its writes.
            argv = [SETPRIV, *NOBODY, ARIA2C, "--max-download-limit=512K",
                    "--lowest-speed-limit", "16K", "-m100", "--retry-wait", "10", "--continue", "-x16", "-s16",
                    "--dir", str(cache), "-o", "f.params", f"{url}/f.params"]
            config = sup.write(phase(toml_list(argv), 4, f"progress_path = {toml_str(str(cache))}"), header=False)
            config.write_text(sup.header(extra='cgroups = "off"') + config.read_text())
            done = subprocess.run([SETPRIV, "--bounding-set=-sys_ptrace", PY, "-m", "supervisor", "run", "--config",
                                   str(config)], capture_output=True, text=True, timeout=90)
        out = done.stdout + done.stderr
        assert (cache / "f.params").stat().st_size == 6 * MIB, out
    assert done.returncode == 0, out
    assert "reason=stalled" not in out, out
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p")
    said = first_line(out, "I/O watch: the I/O counters of pid ")
    assert "cannot be read (another user's process, and the supervisor lacks CAP_SYS_PTRACE)" in said, said


# ================================================================ a child's bytes are not taken from its parent's


@pytest.mark.parametrize("helper", ["zombie", "auto-reaped", "foreign", "reaped"])
def test_a_parent_writing_steadily_is_not_stalled_by_a_finished_child_it_does_not_reap(sup: Runner,
                                                                                        helper: str) -> None:
    """A parent forks a helper that writes 8 MiB in 6 s and is done, and writes 256 KiB/s itself, printing
    nothing. The helper's bytes were taken for a debt of its parent (the kernel adds a reaped child's counters to
    its parent's) as soon as it left the process table, and paid out of the parent's own writes: a helper left a
    zombie (never waited for), one auto-reaped (SIGCHLD ignored: nothing is added to the parent) or one whose
    counters became another user's swallowed the parent's work, stalled (measured: 'no I/O for 2.0s' at 7 s)."""
    if helper == "foreign":
        if SETPRIV is None or os.geteuid() != 0:
            pytest.skip("needs root and setpriv (util-linux) to run the supervisor without CAP_SYS_PTRACE")
        if foreign_io_readable():
            pytest.skip("this kernel lets root without CAP_SYS_PTRACE read another user's I/O counters")
    parent = py_script(sup.tmp, "parent", f"""
        import os, signal, sys, threading, time
        helper = sys.argv[1]
        if helper == "auto-reaped":
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)

        def write_helper() -> None:
            with open({str(sup.tmp / "helper.bin")!r}, "wb") as out:
                for _ in range(8):  # for 6 s: found by a reading of the whole process table (every 5 s)
                    out.write(b"h" * (1 << 20))
                    out.flush()
                    time.sleep(0.75)
            if helper == "foreign":  # its counters another user's from now on
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                time.sleep(60)
            os._exit(0)

        pid = 0
        with open({str(sup.tmp / "parent.bin")!r}, "wb") as out:
            for tick in range(64):  # 16 s
                if tick == 4:
                    pid = os.fork()
                    if pid == 0:
                        write_helper()
                    if helper == "reaped":
                        threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()
                out.write(b"p" * 65536)
                out.flush()
                time.sleep(0.25)
        if helper == "foreign":
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        """, helper)
    if helper == "foreign":
        config = sup.write(phase(parent, 2), header=False)
        config.write_text(sup.header(extra='cgroups = "off"') + config.read_text())
        done = subprocess.run([SETPRIV, "--bounding-set=-sys_ptrace", PY, "-m", "supervisor", "run", "--config",
                               str(config)], capture_output=True, text=True, timeout=60)
        code, out = done.returncode, done.stdout + done.stderr
    else:
        result = sup.run(sup.write(phase(parent, 2)), timeout=60)
        code, out = result.returncode, result.output
    assert "reason=stalled" not in out, out
    assert code == 0, out
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "p"), out
