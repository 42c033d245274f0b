"""Run prover-supervisor with timing probes around chosen functions (bench/profile.py uses it).

    PROBE_OUT=events.json PROBES=supervisor.engine.trees:ProcessTable._read,os:killpg \
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

import supervisor.app.cli  # noqa: E402
import supervisor.app.run  # noqa: E402

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
    from supervisor.engine import logs

    fn = logs.Console._write_all

    def probed(self, chunks):  # the console thread's writev of what it took from its queue
        failure = fn(self, chunks)
        if any(b"ended: " in c or b"FAILED: " in c for c in chunks):
            EVENTS.append(("console_verdict_written", time.monotonic()))
        return failure

    logs.Console._write_all = probed


def install_fast_feed() -> None:
    """The proposed ChildOutput.feed (docs/benchmarks.md), to measure it end to end without editing supervisor/.

    Whole chunks instead of per-line Python objects: one bytes.replace puts the
    [phase/name] prefix on every line, only the tail the ring keeps is split.
    Anything unusual takes today's path (``ChildOutput.feed``): taps, a redactor
    (its SecretStream may hold bytes back), a ``\r`` anywhere (a redraw ends a line,
    LineSplitter's rules), a partial line that a ``\r`` already ended, or a line that
    may be over MAX_LINE_BYTES.
    """
    from supervisor.engine import logs

    maxlen = logs.MAX_LINE_BYTES
    careful = logs.ChildOutput.feed

    def no_long_line(buf: bytes, end: int) -> bool:
        if end <= maxlen:
            return True
        step = maxlen // 2  # a line over maxlen covers a whole aligned window of maxlen/2 without a newline
        return all(buf.find(b"\n", i, min(i + step, end)) >= 0 for i in range(0, end - step, step))

    def feed(self, stream: str, data: bytes) -> None:
        if self._readers or self._redactor:
            return careful(self, stream, data)
        _, splitter = self._pipe(stream)
        whole = splitter._partial + data if splitter._partial else data
        cut = whole.rfind(b"\n") + 1
        if cut == 0 or splitter._shown or b"\r" in whole or len(whole) - cut >= maxlen \
                or not no_long_line(whole, cut):
            return careful(self, stream, data)
        self.bytes_seen += len(data)
        self.last_output_at = time.monotonic()
        self.file.write(data, stream)
        splitter._partial = whole[cut:]
        body = whole[: cut - 1]
        head = logs.clock() + self._prefix
        self._console.put(head, body.replace(b"\n", b"\n" + head), b"\n")
        keep = self.ring.maxlen or 0
        if keep:
            self.ring.extend(body.rsplit(b"\n", keep)[-keep:])

    logs.ChildOutput.feed = feed


def dump() -> None:
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump(EVENTS, f)


for item in filter(None, os.environ.get("PROBES", "").split(",")):
    install(item)
if os.environ.get("PROBE_CONSOLE") == "1":
    install_console_probe()
if os.environ.get("PROBE_PATCH") == "fastfeed":
    install_fast_feed()
atexit.register(dump)  # registered first, so it runs last of the atexit handlers
status = supervisor.app.cli.main(sys.argv[1:])
EVENTS.append(("main_returned", time.monotonic()))  # what is left: the threads' joins, atexit, finalization
sys.exit(status)
