"""Run prover-supervisor with timing probes around chosen functions (bench/profile.py uses it).

    PROBE_OUT=events.json PROBES=supervisor.proctable:ProcessTable._read,os:killpg \
        python bench/probe.py run --config F

Each probe appends ("<name>:in", t) and ("<name>:out", t) with t = time.monotonic()
(CLOCK_MONOTONIC, the clock the bench and its C helper read); the events are
written to $PROBE_OUT at exit. Nothing in supervisor/ is changed: the probes are
installed by replacing the attributes in this process only.
"""

from __future__ import annotations

import time

EVENTS: list[tuple[str, float]] = [("interpreter_ready", time.monotonic())]

import atexit  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import supervisor.cli  # noqa: E402
import supervisor.run  # noqa: E402

EVENTS.append(("imports_done", time.monotonic()))


def install(spec: str) -> None:
    """``module:attr`` or ``module:Class.method``; ``os:killpg`` works too."""
    module_name, _, path = spec.partition(":")
    owner = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    fn = getattr(owner, attr)
    label = f"{module_name.rsplit('.', 1)[-1]}.{path}"

    @functools.wraps(fn)
    def probed(*args, **kwargs):
        EVENTS.append((label + ":in", time.monotonic()))
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((label + ":out", time.monotonic()))

    setattr(owner, attr, probed)


def install_console_probe() -> None:
    """The moment the console thread writes a verdict line (``ended:``/``FAILED:``) out."""
    from supervisor import logs

    fn = logs.Console._write_all

    def probed(self, data):
        fn(self, data)
        if b"ended: " in data or b"FAILED: " in data:
            EVENTS.append(("console_verdict_written", time.monotonic()))

    logs.Console._write_all = probed


def install_fast_feed() -> None:
    """The proposed ChildOutput.feed (see bench/notes.md), to measure it end to end without editing supervisor/.

    Whole chunks instead of per-line Python objects: one bytes.replace puts the
    [phase/name] prefix on every line, only the tail the ring keeps is split.
    Anything unusual (taps, a redactor, a line that may be over MAX_LINE_BYTES)
    takes the current code path.
    """
    from supervisor import logs

    maxlen = logs.MAX_LINE_BYTES
    careful = logs.ChildOutput.feed

    def no_long_line(buf: bytes, end: int) -> bool:
        if end <= maxlen:
            return True
        step = maxlen // 2  # a line over maxlen covers a whole aligned window of maxlen/2 without a newline
        return all(buf.find(b"\n", i, min(i + step, end)) >= 0 for i in range(0, end - step, step))

    def feed(self, stream: str, data: bytes) -> None:
        if self.taps or self._redact:
            return careful(self, stream, data)
        splitter = self._splitters.setdefault(stream, logs.LineSplitter())
        whole = splitter._partial + data if splitter._partial else data
        cut = whole.rfind(b"\n") + 1
        if cut == 0 or len(whole) - cut >= maxlen or not no_long_line(whole, cut):
            return careful(self, stream, data)
        self.bytes_seen += len(data)
        self.last_output_at = time.monotonic()
        self.file.write(data)
        splitter._partial = whole[cut:]
        body = whole[: cut - 1]
        if b"\r" in body:
            body = body.replace(b"\r\n", b"\n")
        head = logs.clock() + self._prefix
        self._console.put(head + body.replace(b"\n", b"\n" + head) + b"\n")
        keep = self.ring.maxlen or 0
        if keep:
            self.ring.extend(body.rsplit(b"\n", keep)[-keep:])

    logs.ChildOutput.feed = feed


def install_minimal_feed() -> None:
    """The smallest change to the current feed: no per-line Python where a chunk-level test will do.

    LineSplitter.feed looks for over-long lines only when the chunk is longer than
    the limit (a pipe read rarely is); _emit tests the joined chunk for "\\r"
    instead of every line. Output unchanged.
    """
    from supervisor import logs

    def split_feed(self, data: bytes) -> list[bytes]:
        data = self._partial + data if self._partial else data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) >= self._max:
            cut = len(self._partial) - len(self._partial) % self._max
            lines.extend(self._partial[i : i + self._max] for i in range(0, cut, self._max))
            self._partial = self._partial[cut:]
        if len(data) > self._max and any(len(line) > self._max for line in lines):
            lines = [piece for line in lines for piece in self._pieces(line)]
        return lines

    def emit(self, lines: list[bytes], carriage_returns: bool = True) -> None:
        if not lines:
            return
        if self._redact:
            lines = [self._redact.data(line) for line in lines]
        for tap in self.taps:
            tap(lines)
        maxlen = self.ring.maxlen
        self.ring.extend(lines[-maxlen:] if maxlen is not None else lines)
        head = logs.clock() + self._prefix
        body = (b"\n" + head).join(lines)
        if b"\r" in body:
            body = (b"\n" + head).join(line.rstrip(b"\r") for line in lines)
        self._console.put(head + body + b"\n")

    logs.LineSplitter.feed = split_feed
    logs.ChildOutput._emit = emit


def install_signal_first() -> None:
    """The proposed Child.stop order: the stop signal to the process group first, the /proc scan after."""
    import os as _os

    from supervisor import process

    stop = process.Child.stop

    def stop_signal_first(self, loop, log, reason, on_stopped):
        if self.running and not self._stopping:
            process._quiet(_os.killpg, self.pid, self.spec.stop_signal)  # the group is surely ours: it lives
        return stop(self, loop, log, reason, on_stopped)

    process.Child.stop = stop_signal_first


def dump() -> None:
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump(EVENTS, f)


for item in filter(None, os.environ.get("PROBES", "").split(",")):
    install(item)
if os.environ.get("PROBE_CONSOLE") == "1":
    install_console_probe()
if os.environ.get("PROBE_PATCH") == "fastfeed":
    install_fast_feed()
if os.environ.get("PROBE_PATCH") == "minimalfeed":
    install_minimal_feed()
if os.environ.get("PROBE_PATCH") == "sigfirst":
    install_signal_first()
atexit.register(dump)
sys.exit(supervisor.cli.main(sys.argv[1:]))
