"""supervisor.lifecycle.fitness's pure findings, in-process: the disk needs of one filesystem add up, and the GPUs
NVML counts must be the ones $GPU_COUNT says, no fewer and no more."""

from __future__ import annotations

from supervisor.evidence.gpu import GpuDevice, GpuInventory
from supervisor.lifecycle import fitness
from supervisor.lifecycle import verdict as v

MIB = 1 << 20


def test_needs_on_one_filesystem_add_up_and_on_two_do_not() -> None:
    cache = fitness.DiskNeed("parameter cache", "/data/params", 60 * MIB, 0, 100 * MIB, 1)
    state = fitness.DiskNeed("state_dir", "/data/state", 50 * MIB, 0, 100 * MIB, 1)
    [finding] = fitness.disk_findings((cache, state))
    assert finding.reason == v.INSUFFICIENT_DISK and "110.0MiB together on one filesystem" in finding.detail
    elsewhere = fitness.DiskNeed("state_dir", "/state", 50 * MIB, 0, 100 * MIB, 2)
    assert fitness.disk_findings((cache, elsewhere)) == []


def test_more_gpus_than_gpu_count_says_is_unfit_as_fewer_are() -> None:
    def seen(count: int) -> GpuInventory:
        return GpuInventory(True, "NVML ok", tuple(GpuDevice(i, "H100", 80 << 30, 0) for i in range(count)))

    assert fitness.gpu_findings(seen(2), 2) == []
    for count in (1, 3):
        [finding] = fitness.gpu_findings(seen(count), 2)
        assert finding.reason == v.GPU_UNAVAILABLE and f"NVML sees {count} GPU(s) but GPU_COUNT=2" in finding.detail
