"""The one GPU thread: it alone calls NVML; the loop reads what it published and never waits.

An NVML call can block: about 45 s under Xid 119 (GSP timeouts), forever after a driver crash
(shared/domain/production.md). Made on the loop, one such call would stop the reaping of
children, the signals and the status socket with it. So one thread ("gpu") opens NVML once,
takes a first sample of every GPU, then samples them every GPU_SAMPLE_S while something wants
samples (a stall watch, for as long as it watches; the status view, for STATUS_WANT_S after each
request), and answers the fitness check's inventory. Readers on the loop take the latest
published reading (``latest``, ``samples``): never a call, never a wait.

Every NVML call is timed. One that has not returned after NVML_CALL_TIMEOUT_S makes NVML
unresponsive (``unresponsive``): the loop's tick says so once, naming the call and how long
(``check``: ``gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned for
5.0s``), and again when it returns; the same call hung again is said again, with its count (``hung again
(2nd time in 40 s)``, HUNG_SAID a minute, then counted); ``status --json`` shows it; the stall watch takes GPU evidence
as unknown meanwhile (no activity credited); the fitness check refuses with ``gpu_unresponsive``.
No second thread is ever started to get around a hung one: they would pile up on a hung driver.
Where NVML is absent the thread says "no GPU" (``why``) and ends.

Whatever NVML answers is contained: a GPU whose answer is no reading (gpu.py checks each value) is
asked again GPU_RETRY_S later in the same round (a one-off error must not leave it out of the reading cuzk.toml
and resume read); one that fails again is left out of that sample (the reading says why: ``left_out``) and
counted as a miss on ``sampling`` (watchstate.py: blind past GPU_BLIND_S is said once, and again when it
reads); the Xid side is gpuevents.py's. Should the thread still fail (a bug
of ours), it says so and starts again after THREAD_RESTART_S (doubling to THREAD_RESTART_MAX_S).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..engine.offloop import worker_thread
from ..text.show import summary
from .gpu import (
    GpuFault,
    GpuInventory,
    GpuReading,
    GpuSample,
    HungCall,
    Nvml,
    describe_nvml_error,
    inventory_of,
    open_nvml,
    sample_all,
)
from .gpuevents import XidWatch
from .watchstate import (
    BLIND,
    READING,
    STARTING,
    THREAD_RESTART_MAX_S,
    THREAD_RESTART_S,
    Repeats,
    WatchState,
    run_restarting,
)

# How often every GPU is sampled while something wants samples; a want may ask for more often
# (a stall watch with a small stall_s), never more often than GPU_SAMPLE_MIN_S.
GPU_SAMPLE_S = 1.0
GPU_SAMPLE_MIN_S = 0.1
# An NVML call that has not returned after this long makes NVML "unresponsive" (a healthy call takes
# milliseconds; under Xid 119 one takes about 45 s).
NVML_CALL_TIMEOUT_S = 5.0
# The hangs of one NVML call said, each with its count ("hung again (2nd time in 40 s)"), in a REPEATS_PERIOD_S;
# past them counted, the count said as the period ends. A hang is never only counted where it may be the one that
# fails a phase, yet a driver that hangs on every call (one hang a NVML_CALL_TIMEOUT_S) is a few lines a minute.
HUNG_SAID = 3
# A status request keeps the samples coming this long, so that the next one (a watch) sees fresh ones.
STATUS_WANT_S = 60.0
# How often an off-loop caller waiting for the thread looks whether the call it waits behind has hung.
WAIT_POLL_S = 0.05
# While GPU health is watched, the thread waits for NVML's Xid events this long at a time between its
# other work (a sample, an inventory asked for waits at most this long behind it).
EVENT_WAIT_S = 0.5
# A GPU watch (sampling, Xid events) with no reading for this long says so (once).
GPU_BLIND_S = 30.0


@dataclass
class _Request:
    """The fitness check's inventory, asked of the thread by another thread."""

    done: threading.Event = field(default_factory=threading.Event)
    result: GpuInventory | None = None


class Gpus:
    """NVML through the one GPU thread, started by ``start`` (or the first ``want``)."""

    def __init__(self, *, call_timeout_s: float | None = None, blind_s: float | None = None) -> None:
        # (this module's bounds, read now: a test of the whole supervisor shortens them)
        self._call_timeout_s = NVML_CALL_TIMEOUT_S if call_timeout_s is None else call_timeout_s
        blind_s = GPU_BLIND_S if blind_s is None else blind_s
        self._cond = threading.Condition()  # guards every field below the thread and the loop share
        self._thread: threading.Thread | None = None
        self._closed = False
        self._nvml: Nvml | None = None
        self.available = False  # NVML opened with at least one reachable GPU
        self.why = "not probed yet"
        self.opened = threading.Event()  # NVML opened, or found absent: ``why`` says which
        self._reading: GpuReading | None = None
        self._failed_at: float | None = None  # (monotonic) the thread's last failure: no reading before it is now's
        self._wants: dict[int, float] = {}  # want id → the cadence it asked for
        self._want_ids = itertools.count(1)
        self._lease_until = 0.0
        self._requests: list[_Request] = []
        self._calls = itertools.count(1)
        self._in_call: tuple[int, HungCall] | None = None
        self._slow: list[tuple[int, str, float, float]] = []  # (call number, call, seconds, began) past the timeout
        # The supervisor's last thaw (monotonic; run.py: tick.py's FreezeWatch): a call it stopped with the
        # supervisor (SIGSTOP, docker pause) counts from there, never the pause taken for NVML's hang.
        self.thawed_at: Callable[[], float | None] = lambda: None
        self._said: int | None = None  # the hung call the loop has said (loop side only)
        self.slow_calls = 0  # NVML calls that took longer than the timeout, in this run (loop side)
        self._repeats = Repeats()  # (loop side) the same slow call said once, then counted; a hang HUNG_SAID times
        self._health = False  # GPU health is watched: Xid events waited for, lost GPUs told (watch_health)
        self.sampling = WatchState("GPU sampling", blind_s)
        self._xid = XidWatch(blind_s, self._pause)
        self.xid_events = self._xid.state

    # ------------------------------------------------------------ the loop's side: never a wait

    def start(self) -> None:
        """Start the thread (once): it opens NVML and publishes a first sample."""
        with self._cond:
            if self._thread is not None or self._closed:
                return
            try:
                self._thread = worker_thread("gpu", self._run_restarting)
            except RuntimeError as exc:  # no thread to be had (pids.max): no GPU evidence, never a traceback
                self._closed = True
                self.why = f"no GPU evidence: the GPU thread could not start ({exc})"
                self.opened.set()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def want(self, every_s: float = GPU_SAMPLE_S) -> Callable[[], None]:
        """Samples at least every ``every_s`` from now until the returned function is called."""
        self.start()
        want_id = next(self._want_ids)
        with self._cond:
            self._wants[want_id] = every_s
            self._cond.notify_all()

        def release() -> None:
            with self._cond:
                self._wants.pop(want_id, None)

        return release

    def want_for(self, seconds: float = STATUS_WANT_S) -> None:
        """Samples every GPU_SAMPLE_S for the next ``seconds`` (the status view)."""
        self.start()
        with self._cond:
            self._lease_until = max(self._lease_until, time.monotonic() + seconds)
            self._cond.notify_all()

    def watch_health(self) -> None:
        """From now on the thread also waits for Xid events and tells a GPU that is lost (``take_all_faults``)."""
        self.start()
        with self._cond:
            self._health = True
            self._cond.notify_all()

    @property
    def events_why(self) -> str:
        return self._xid.why

    def states(self) -> tuple[WatchState, ...]:
        """The GPU watches' states (status; the tick says when one goes blind)."""
        return self.sampling, self.xid_events

    def take_all_faults(self, wait_for_recovery: bool = True) -> tuple[list[GpuFault],
                                                                         dict[tuple[int | None, int | None], int]]:
        """The faults found since the last call, and how many more of each (GPU, Xid) were only counted
        (the loop's GPU health, lifecycle/gpuhealth.py, decides what they mean); ``wait_for_recovery`` False: the
        one whose recovery action is being read too, without it (a start about to be refused must not wait)."""
        return self._xid.take(wait_for_recovery)

    def latest(self) -> GpuReading | None:
        """The latest reading, none from before the thread last failed (its figures are no longer now's)."""
        with self._cond:
            reading, failed = self._reading, self._failed_at
        return None if reading is not None and failed is not None and reading.at <= failed else reading

    def samples(self) -> tuple[GpuSample, ...]:
        """The latest published sample of every GPU (empty: none yet, or no GPU)."""
        reading = self.latest()
        return reading.samples if reading is not None else ()

    def unresponsive(self, now: float | None = None) -> HungCall | None:
        """The NVML call that has been running for longer than NVML_CALL_TIMEOUT_S, if one is (counted from the
        supervisor's last thaw at the earliest)."""
        with self._cond:
            current = self._in_call
        if current is None:
            return None
        now = time.monotonic() if now is None else now
        hung = self._since_thaw(current[1])
        return hung if now - hung.since >= self._call_timeout_s else None

    def _since_thaw(self, call: HungCall) -> HungCall:
        """``call`` as counted from the supervisor's last thaw, where that came after it began: the time the
        supervisor was stopped is no time NVML took (a docker pause read as a hung driver failed the phase)."""
        thawed = self.thawed_at()
        if thawed is None or thawed <= call.since:
            return call
        return replace(call, since=thawed, since_wall=call.since_wall + (thawed - call.since))

    def describe(self, now: float | None = None) -> str:
        """What the GPU evidence is, for the log: NVML's own answer, or that it has not given one."""
        hung = self.unresponsive(now)
        if hung is None:
            return self.why
        known = self.why if self._nvml is not None else "unknown"
        return f"{known}; NVML unresponsive ({hung.describe(time.monotonic() if now is None else now)})"

    def check(self, now: float | None = None) -> list[str]:
        """What the loop says about NVML now (the tick calls it): a call that has not returned (once),
        and each slow call once it returned. Each slow call is counted (``slow_calls``)."""
        now = time.monotonic() if now is None else now
        with self._cond:
            slow, self._slow = self._slow, []
            current = self._in_call
        thawed = self.thawed_at()
        if current is not None:
            current = (current[0], self._since_thaw(current[1]))
        lines = []
        for number, call, took, began in slow:  # a driver slow on every call: each call's line once, then a count
            if thawed is not None and began < thawed:  # (it spanned a freeze of the supervisor: its time is not NVML's)
                if number == self._said:
                    self._said = None
                continue
            lines += self._repeats.note(f"returned {call}", f"gpu_unresponsive: {call} returned after {took:.1f}s",
                                        f"gpu_unresponsive: {call} returned late")
            if number == self._said:
                self._said = None
            else:
                self.slow_calls += 1  # slow, though it returned before a tick could say so
        if current is not None and now - current[1].since >= self._call_timeout_s:
            for state in self.states():  # a hung call is no reading: it counts toward blind, and says why
                if state.current in (READING, STARTING, BLIND):
                    state.miss(current[1].describe(now), now)
            if current[0] != self._said:
                self._said = current[0]
                self.slow_calls += 1
                hung, took = current[1], now - current[1].since
                lines += self._repeats.note(
                    f"hung {hung.call}", f"gpu_unresponsive: {hung.describe(now)}",
                    f"gpu_unresponsive: {hung.call} hung again", said=HUNG_SAID,
                    again=lambda times: f"gpu_unresponsive: {hung.call} hung again ({times}): it has not returned "
                                        f"for {took:.1f}s")
        return [*lines, *self._repeats.due()]

    def close(self) -> None:
        """The thread ends after the call it is in (never waited for: that call may never return)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------ another thread's side (fitness)

    def inventory(self, bound_s: float) -> GpuInventory:
        """Every GPU, read by the GPU thread, for a caller off the loop: it waits at most ``bound_s``,
        and no longer than until the call the thread is in has hung (then: ``unresponsive``)."""
        self.start()
        deadline = time.monotonic() + bound_s
        hung = self._wait(self.opened, deadline)
        if hung is not None:
            return GpuInventory(True, self.why, unresponsive=hung)
        if self._nvml is None:
            return GpuInventory(False, self.why)
        request = _Request()
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()
        hung = self._wait(request.done, deadline)
        if hung is not None or request.result is None:
            return GpuInventory(True, self.why, unresponsive=hung)
        return request.result

    def wait_opened(self, bound_s: float) -> HungCall | None:
        """For a caller off the loop: until NVML is opened (or found absent); the hung call if it hangs."""
        self.start()
        return self._wait(self.opened, time.monotonic() + bound_s)

    def _wait(self, event: threading.Event, deadline: float) -> HungCall | None:
        started = time.monotonic()
        while not event.wait(WAIT_POLL_S):
            hung = self.unresponsive()
            if hung is not None:
                return hung
            if time.monotonic() >= deadline:  # busy with slow calls, none of them hung on its own
                return HungCall("NVML (every call slow)", started, time.time() - (time.monotonic() - started))
        return None

    # ------------------------------------------------------------ the thread

    def _run_restarting(self) -> None:
        """The thread, contained (watchstate.run_restarting): a bug of ours is said and the thread starts again
        after THREAD_RESTART_S (this module's, read now: a test shortens it), doubling to THREAD_RESTART_MAX_S."""
        run_restarting(self._run, self.sampling, "the GPU thread", self._cond, lambda: self._closed,
                      self._forget_nvml, restart_s=THREAD_RESTART_S, restart_max_s=THREAD_RESTART_MAX_S)

    def _forget_nvml(self, exc: Exception) -> None:
        """(under the lock) After a failure: no GPU evidence until the thread has opened NVML again."""
        self.why = f"no GPU evidence for now: the GPU thread failed ({summary(exc)})"
        self.available = False
        self._failed_at = time.monotonic()
        self.opened.set()

    def _run(self) -> None:
        nvml, why = open_nvml(self._call, self._pause)
        if self._closed:  # closed while the opening hung: no sample, no fault (each NVML call may hang again)
            self.opened.set()
            return
        for index, exc in (nvml.lost if nvml is not None else {}).items():
            self._xid.lost(index, exc)  # (gone before it was ever sampled: a fault all the same)
        with self._cond:
            self._nvml, self.why = nvml, why
            self.available = nvml is not None and nvml.reachable
        if nvml is not None and nvml.reachable:
            self._sample(nvml)  # what resume's fingerprint and cuzk.toml read
        self.opened.set()
        if nvml is None:
            self.sampling.stop(why)
            self.xid_events.stop(why)
            return  # no NVML: "no GPU", said once; nothing more to do
        next_sample = time.monotonic()
        self._xid.tried = False
        while True:
            if self._health and not self._xid.tried:
                self._xid.open(nvml, self._call)
            requests, sample_now, cadence = self._next_work(next_sample, self._xid.events is not None)
            if requests is None:
                return
            if cadence is None:
                self.sampling.idle("no one wants GPU samples now")
            elif not nvml.reachable:  # (NVML sees no GPU, or none answers: no sample can come, none is missed)
                self.sampling.stop(self.why or "no GPU reachable")
            else:
                self.sampling.wake()
            for request in requests:
                request.result = self._safe_inventory(nvml)
                request.done.set()
            if sample_now:
                if nvml.reachable:
                    self._sample(nvml)
                next_sample = time.monotonic() + (cadence or GPU_SAMPLE_S)
            elif not requests and self._xid.events is not None:
                due_in = EVENT_WAIT_S if cadence is None else next_sample - time.monotonic()
                self._xid.wait(nvml, min(EVENT_WAIT_S, due_in), self._call)

    def _sample(self, nvml: Nvml) -> None:
        """Every GPU sampled and published, with why each GPU NVML counts and the sample lacks is left out; one
        whose answer is no reading (asked again first: sample_all) makes this pass a miss."""
        bad: list[tuple[int, str]] = []
        samples = sample_all(nvml, self._call, self._xid.lost, lambda index, why: bad.append((index, why)),
                             self._pause)
        no_handle = [(index, f"no handle: {nvml.handle_errors.get(index, 'unknown error')}")
                     for index, handle in enumerate(nvml.handles) if handle is None]
        self._publish(samples, tuple(sorted([*no_handle, *((index, f"unreadable: {why}") for index, why in bad)])))
        if bad:
            self.sampling.miss("; ".join(f"GPU {index}: {why}" for index, why in bad))
        else:
            self.sampling.read()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` at most (a floor on a loop's period); a request or close ends it early."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._closed and not self._requests:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _next_work(self, next_sample: float, events_open: bool) -> tuple[list[_Request] | None, bool, float | None]:
        """Sleep until a request, a sample due, or close: (requests, sample now?, cadence); None: closed.
        With Xid events to wait for (or to open), it returns at once: the thread waits on NVML instead."""
        with self._cond:
            while True:
                if self._closed:
                    return None, False, None
                now = time.monotonic()
                cadence = self._cadence(now)
                due = cadence is not None and now >= next_sample
                if self._requests or due:
                    requests, self._requests = self._requests, []
                    return requests, due, cadence
                if events_open or (self._health and not self._xid.tried):
                    return [], False, cadence
                if cadence is None:  # (a wait for nothing to read: idle, never blind, however long it lasts)
                    self.sampling.idle("no one wants GPU samples now")
                self._cond.wait(None if cadence is None else next_sample - now)

    def _cadence(self, now: float) -> float | None:
        """How often samples are wanted now; None: nobody wants them."""
        wanted = list(self._wants.values())
        if now < self._lease_until:
            wanted.append(GPU_SAMPLE_S)
        if not wanted:
            return None
        return max(GPU_SAMPLE_MIN_S, min(GPU_SAMPLE_S, *wanted))

    def _safe_inventory(self, nvml: Nvml) -> GpuInventory:
        try:
            return inventory_of(nvml, self.why, self._call)
        except Exception as exc:  # a bug here must not end the only thread that reads the GPUs
            return GpuInventory(True, f"{self.why}; the inventory failed: {describe_nvml_error(exc)}")

    def _publish(self, samples: tuple[GpuSample, ...], left_out: tuple[tuple[int, str], ...]) -> None:
        with self._cond:
            seq = self._reading.seq + 1 if self._reading is not None else 1
            self._reading = GpuReading(seq, time.monotonic(), samples, left_out)

    def _call(self, name: str, gpu: int | None, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call, watched: while it runs the loop can see which call it is and since when."""
        label = name if gpu is None else f"{name} (GPU {gpu})"
        number = next(self._calls)
        started = time.monotonic()
        with self._cond:
            self._in_call = (number, HungCall(label, started, time.time()))
        try:
            return fn(*args)
        finally:
            took = time.monotonic() - started
            with self._cond:
                self._in_call = None
                if took >= self._call_timeout_s:
                    self._slow.append((number, label, took, started))
