"""GPU evidence through the GPU thread: "no GPU" said once with NVML's own error, samples, activity.

On a machine without the NVML library the real ``pynvml`` raises
``NVMLError_LibraryNotFound``; ``Gpus`` must say "no GPU" with that error, never
fail. The with-GPU path is exercised with the stand-in ``pynvml``
(supervisor/prover/standins/fakenvml), driven by its control file.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
from helpers import Runner, first_line, one_verdict, real_nvml_error, toml_list, wait_for
from standin_nvml import NvmlControl
from standin_nvml import gpu as nvml_gpu

from supervisor.evidence import gpuwatch
from supervisor.evidence.gpu import GpuSample, activity_changed, describe_nvml_error
from supervisor.evidence.gpuwatch import Gpus
from supervisor.text.units import MIB as MiB


@pytest.fixture
def gpus() -> Iterator[Gpus]:
    watch = Gpus()
    yield watch
    watch.close()


def opened(gpus: Gpus) -> Gpus:
    """The GPU thread started and done opening NVML (bounded: a test never hangs on it)."""
    gpus.start()
    assert gpus.opened.wait(10), "the GPU thread did not open NVML within 10s"
    return gpus


def test_no_gpu_here_says_why_with_nvmls_real_error(gpus: Gpus) -> None:
    error = real_nvml_error()
    if error is None:
        pytest.skip("NVML initialises on this machine (a GPU driver is present): the no-GPU path cannot be seen")
    print(f"real pynvml.nvmlInit() raised {type(error).__name__}: {error}")
    assert gpus.why == "not probed yet"
    assert opened(gpus).samples() == ()
    assert gpus.available is False
    assert gpus.why.startswith("no GPU"), gpus.why
    assert type(error).__name__ in gpus.why, gpus.why
    if "NVMLError_LibraryNotFound" not in type(error).__name__:
        pytest.skip(f"NVML fails here with {type(error).__name__}, not NVMLError_LibraryNotFound (checked above)")
    assert "NVMLError_LibraryNotFound" in gpus.why
    gpus.want()  # wanted anyway: still no GPU, no new probe, no error
    assert gpus.samples() == () and gpus.unresponsive() is None
    assert gpus._thread is not None
    gpus._thread.join(10)
    assert not gpus._thread.is_alive(), "without NVML the GPU thread has nothing more to do: it ends"


def test_describe_nvml_error_names_the_class_once() -> None:
    class NVMLError_Fake(Exception):  # named like pynvml's per-code classes
        pass

    assert describe_nvml_error(NVMLError_Fake("Driver Not Loaded")) == "NVMLError_Fake: Driver Not Loaded"
    assert describe_nvml_error(NVMLError_Fake()) == "NVMLError_Fake"
    assert describe_nvml_error(NVMLError_Fake("NVMLError_Fake: x")) == "NVMLError_Fake: x"


def test_pynvml_missing_is_no_gpu(monkeypatch: pytest.MonkeyPatch, gpus: Gpus) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml → ImportError
    assert opened(gpus).samples() == ()
    assert gpus.why.startswith("no GPU: pynvml not installed"), gpus.why


def test_samples_through_nvml(control: NvmlControl, gpus: Gpus) -> None:
    control.set(gpus=[nvml_gpu("NVIDIA H100", 80 * 1024 * MiB, 100 * MiB),
                      nvml_gpu("NVIDIA L4", 24 * 1024 * MiB, 2048 * MiB, 37), nvml_gpu("lost")], lost=[2])
    samples = opened(gpus).samples()
    assert gpus.available is True
    assert gpus.why == "3 GPU(s) via NVML"
    assert samples == (
        GpuSample(0, "NVIDIA H100", 0, 100 * MiB, 80 * 1024 * MiB),
        GpuSample(1, "NVIDIA L4", 37, 2048 * MiB, 24 * 1024 * MiB),
    )
    threads = {thread for _, thread in control.calls()}
    assert threads == {"gpu"}, f"every NVML call on the GPU thread, none elsewhere: {control.calls()}"


def test_a_gpu_whose_utilisation_nvml_does_not_measure_is_sampled_by_its_memory(control: NvmlControl,
                                                                                gpus: Gpus) -> None:
    # A MIG-enabled GPU answers NotSupported for its utilisation: it was left out of every sample, and so of
    # cuzk.toml's devices and the machine's fingerprint, without a word.
    control.set(gpus=[nvml_gpu("NVIDIA H200", 141 * 1024 * MiB, 100 * MiB, 12),
                      {**nvml_gpu("NVIDIA H200", 141 * 1024 * MiB, 300 * MiB), "mig": True}])
    assert opened(gpus).samples() == (GpuSample(0, "NVIDIA H200", 12, 100 * MiB, 141 * 1024 * MiB),
                                      GpuSample(1, "NVIDIA H200", None, 300 * MiB, 141 * 1024 * MiB))


def test_a_gpu_that_answers_badly_once_is_asked_again_before_the_round_is_published(control: NvmlControl,
                                                                                   gpus: Gpus) -> None:
    # The first round is all cuzk.toml, resume's fingerprint and status have where nothing samples again: a one-off
    # error of one GPU in it left that GPU out of them for the whole run.
    control.set(gpus=[nvml_gpu(), nvml_gpu()], flaky=[{"gpu": 1, "call": "nvmlDeviceGetMemoryInfo",
                                                         "error": "Timeout"}])
    reading = opened(gpus).latest()
    assert reading is not None and [s.index for s in reading.samples] == [0, 1], reading
    assert reading.left_out == () and gpus.sampling.misses == 0
    assert [call for call, _ in control.calls()].count("nvmlDeviceGetMemoryInfo") == 3  # GPU 1 asked twice


def test_a_gpu_that_fails_again_is_left_out_of_the_reading_with_why(control: NvmlControl, gpus: Gpus) -> None:
    control.set(gpus=[nvml_gpu(), nvml_gpu(), nvml_gpu()], lost=[2],
                flaky=[{"gpu": 1, "call": "nvmlDeviceGetMemoryInfo", "error": "Timeout", "times": 2}])
    reading = opened(gpus).latest()
    assert reading is not None and [s.index for s in reading.samples] == [0], reading
    assert reading.left_out == ((1, "unreadable: NVMLError_Timeout: Timeout"),
                                (2, "no handle: NVMLError_GpuIsLost: GPU is lost")), reading.left_out
    assert gpus.sampling.misses == 1  # (a GPU with no handle is no miss: it is never sampled)


def test_samples_come_on_a_cadence_only_while_wanted(control: NvmlControl, gpus: Gpus) -> None:
    first = opened(gpus).latest()
    assert first is not None and first.seq == 1
    control.set(gpus=[nvml_gpu(util=55)])
    release = gpus.want(0.1)
    newer = wait_for(lambda: (r := gpus.latest()) is not None and r.seq >= 3 and r)
    assert newer.samples[0].utilization == 55 and newer.at > first.at
    release()
    threading.Event().wait(0.3)  # a sample under way when it was released lands
    settled, calls = gpus.latest(), len(control.calls())
    threading.Event().wait(0.6)  # six cadences: none may be sampled now
    assert gpus.latest() == settled and len(control.calls()) == calls, "sampled while nobody wants samples"


def test_the_most_frequent_want_sets_the_cadence(control: NvmlControl, gpus: Gpus) -> None:
    # A stall watch of a short stall_s wants samples every 0.1 s while another wants them every 5 s: the samples
    # come as often as the most demanding wants them (its silence would be judged on stale readings otherwise).
    first = opened(gpus).latest()
    assert first is not None
    releases = [gpus.want(5.0), gpus.want(0.1)]
    threading.Event().wait(0.8)
    latest = gpus.latest()
    for release in releases:
        release()
    assert latest is not None and latest.seq - first.seq >= 3, (first.seq, latest.seq)


def test_the_status_views_lease_brings_samples_for_its_while(control: NvmlControl, gpus: Gpus) -> None:
    # ``status`` wants fresh GPU figures for STATUS_WANT_S without a want of its own to release.
    first = opened(gpus).latest()
    assert first is not None
    gpus.want_for(10.0)
    newer = wait_for(lambda: (r := gpus.latest()) is not None and r.seq >= first.seq + 2 and r, 5.0)
    assert newer.at > first.at


def test_nvml_with_no_devices(control: NvmlControl, gpus: Gpus) -> None:
    control.set(gpus=[])
    assert opened(gpus).samples() == ()
    assert gpus.available is False
    assert gpus.why == "no GPU: NVML sees 0 devices"


def test_nvml_init_unknown_error_is_no_gpu(control: NvmlControl, gpus: Gpus) -> None:
    """"Failed to initialize NVML: Unknown Error" (a host daemon-reload): "no GPU", with NVML's own class."""
    control.set(init_error="Unknown")
    assert opened(gpus).samples() == ()
    assert gpus.why == "no GPU: NVML unavailable (NVMLError_Unknown: Unknown Error)", gpus.why


def test_a_hung_call_is_named_once_and_again_when_it_returns(control: NvmlControl) -> None:
    """Every call hangs: the loop side says which call, once, and how long it took once it returned."""
    before = {t for t in threading.enumerate() if t.name == "gpu"}  # (other tests' threads, ending after their call)
    gpus = Gpus(call_timeout_s=0.3)
    try:
        gpus.start()
        assert gpus.opened.wait(10)
        control.set(hang_s=120, hang_calls=["nvmlDeviceGetUtilizationRates"])
        gpus.want(0.1)
        hung = wait_for(lambda: gpus.unresponsive())
        assert hung.call == "nvmlDeviceGetUtilizationRates (GPU 0)", hung
        lines = gpus.check()
        assert len(lines) == 1 and lines[0].startswith(
            "gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned for "), lines
        assert gpus.check() == [], "said once"
        control.set(hang_s=0)  # the driver recovers: the stand-in's sleep ends early
        back = wait_for(lambda: gpus.check())
        assert len(back) == 1 and back[0].startswith(
            "gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) returned after "), back
        assert gpus.unresponsive() is None and gpus.slow_calls == 1
        assert [t for t in threading.enumerate() if t.name == "gpu" and t not in before] == [gpus._thread], \
            "one GPU thread, never two"
    finally:
        control.set(hang_s=0)
        gpus.close()


def test_a_second_hang_of_the_same_call_is_said_with_its_count(control: NvmlControl) -> None:
    """The same call hangs twice within the minute: the second was only counted, and the log read one hang."""
    gpus = Gpus(call_timeout_s=0.3)
    try:
        gpus.start()
        assert gpus.opened.wait(10)
        gpus.want(0.1)
        lines: list[str] = []

        def said(times: int) -> bool:
            lines.extend(gpus.check())
            return len([line for line in lines if "has not returned" in line]) >= times

        for times in (1, 2):
            control.set(hang_s=120, hang_calls=["nvmlDeviceGetUtilizationRates"])
            wait_for(lambda: gpus.unresponsive())
            wait_for(lambda: said(times), timeout=5)  # noqa: B023  (waited for within the turn)
            control.set(hang_s=0)
            wait_for(lambda: gpus.unresponsive() is None)
        hung = [line for line in lines if "has not returned" in line]
        assert len(hung) == 2, lines
        assert hung[0].startswith("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) has not returned for "), hung
        assert hung[1].startswith("gpu_unresponsive: nvmlDeviceGetUtilizationRates (GPU 0) hung again (2nd time in "
                                  ) and " s): it has not returned for " in hung[1], hung
        assert gpus.slow_calls == 2
    finally:
        control.set(hang_s=0)
        gpus.close()


def test_the_inventory_is_refused_at_once_while_nvml_hangs(control: NvmlControl) -> None:
    gpus = Gpus(call_timeout_s=0.3)
    try:
        control.set(hang_s=120)  # nvmlInit itself hangs
        inventory = gpus.inventory(bound_s=30)
        assert inventory.unresponsive is not None and inventory.unresponsive.call == "nvmlInit", inventory
        assert gpus.describe().startswith("unknown; NVML unresponsive (nvmlInit has not returned for ")
    finally:
        control.set(hang_s=0)
        gpus.close()


def test_a_watch_closed_while_nvml_opens_calls_nothing_once_the_open_returns(
        control: NvmlControl, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch closed while nvmlInit hung went on to sample once the call returned: one more NVML call (which may
    hang in turn) for a watch no one reads; in the suite, a call counted by the next test's stand-in."""
    sampled = threading.Event()
    real = gpuwatch.sample_all

    def noted(*args: object, **kwargs: object) -> object:
        sampled.set()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gpuwatch, "sample_all", noted)
    gpus = Gpus(call_timeout_s=0.3)
    try:
        control.set(hang_s=120)
        assert gpus.inventory(bound_s=30).unresponsive is not None  # (its thread is in nvmlInit)
        gpus.close()
    finally:
        control.set(hang_s=0)
        gpus.close()
    assert gpus._thread is not None
    gpus._thread.join(30)
    assert not gpus._thread.is_alive()
    assert not sampled.is_set(), "a closed watch sampled the GPUs"


def gpu(index: int, util: int = 0, used: int = 0) -> GpuSample:
    return GpuSample(index, f"gpu{index}", util, used, 80 * 1024 * MiB)


def mig(index: int, used: int = 0) -> GpuSample:
    return GpuSample(index, f"gpu{index}", None, used, 80 * 1024 * MiB)


@pytest.mark.parametrize(("before", "after", "changed"), [
    ([], [], False),
    ([gpu(0)], [gpu(0)], False),  # idle, same memory
    ([gpu(0)], [gpu(0, util=1)], True),  # any utilisation is work
    ([gpu(0, util=90)], [gpu(0, util=0)], False),  # it was busy, now idle: no work in this sample
    ([gpu(0, used=MiB)], [gpu(0, used=2 * MiB)], True),  # memory use grew
    ([gpu(0, used=2 * MiB)], [gpu(0, used=MiB)], True),  # memory freed is activity too
    ([gpu(0), gpu(1, used=5)], [gpu(0), gpu(1, used=6)], True),  # the second GPU moved
    ([], [gpu(0, used=5)], False),  # a GPU seen for the first time, idle: nothing to compare
    ([], [gpu(0, util=3)], True),
    ([gpu(0, used=5)], [], False),  # a GPU gone from the sample is no activity
    ([gpu(1, used=5)], [gpu(0, used=6)], False),  # different GPUs are not compared
    ([mig(0, used=5)], [mig(0, used=5)], False),  # utilisation not measured (MIG): memory alone tells
    ([mig(0, used=5)], [mig(0, used=6)], True),
])
def test_activity_changed(before: list[GpuSample], after: list[GpuSample], changed: bool) -> None:
    assert activity_changed(before, after) is changed


def test_a_phase_with_stall_s_says_the_gpu_evidence_at_start(sup: Runner) -> None:
    if real_nvml_error() is None:
        pytest.skip("NVML works here: the line would name the GPUs, not 'no GPU'")
    cfg = sup.write(f"""
        [[phases]]
        name = "quick"
        stall_s = 5
        command = {toml_list(["true"])}
        """)
    result = sup.run(cfg, timeout=30)
    out = result.output
    assert result.returncode == 0, out
    # Said where the thread has opened NVML when the supervisor starts serving, else once it has.
    line = first_line(out, "GPU evidence: no GPU")
    assert "NVMLError" in line, line
    assert out.index(line) < out.index("phase quick: pending → starting")
    assert " reason=exit_code exit_code=0 " in one_verdict(out, "quick")

