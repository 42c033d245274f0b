"""The gpu_unavailable refusal names the knob that turns the requirement off: the built-in profile reads
``require_gpus`` from ``$PROVER_REQUIRE_GPUS``, so that is what it tells; a config of one's own is told its key.
The core learns it from the config (``Plan.env_keys``), not from knowing the profile."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.config import load_plan, parse_plan
from supervisor.evidence.gpu import GpuInventory
from supervisor.lifecycle import fitness
from supervisor.prover.plugin import PLUGIN

ABSENT = GpuInventory(False, "no GPU: NVML unavailable (NVMLError_LibraryNotFound: NVML Shared Library Not Found)")
OWN = '[supervisor]\nrequire_gpus = {value}\n[[phases]]\nname = "p"\ncommand = ["true"]\n'


def gpu_refusal(plan: Any) -> str:
    found = [f for f in fitness.assess(plan, fitness.Evidence(None, gpus=ABSENT), PLUGIN.fitness)
             if f.reason == "gpu_unavailable"]
    assert len(found) == 1, found
    return found[0].detail


def test_the_profile_is_told_its_environment_knob() -> None:
    plan = load_plan(None, PLUGIN, {"SUPERVISOR_STATE_DIR": "/s", "SUPERVISOR_LOG_DIR": "/l"})
    assert plan.env_keys["supervisor.require_gpus"] == "PROVER_REQUIRE_GPUS"
    detail = gpu_refusal(plan)
    assert detail.endswith("this lifecycle needs GPUs (set PROVER_REQUIRE_GPUS=false to run without GPUs)"), detail
    assert "[supervisor] require_gpus" not in detail


def test_the_knob_is_named_when_the_environment_set_it_too() -> None:
    plan = load_plan(None, PLUGIN, {"SUPERVISOR_STATE_DIR": "/s", "SUPERVISOR_LOG_DIR": "/l",
                                    "PROVER_REQUIRE_GPUS": "true"})
    assert "set PROVER_REQUIRE_GPUS=false" in gpu_refusal(plan)


@pytest.mark.parametrize(("value", "hint"), [
    ("true", "(set [supervisor] require_gpus = false where no GPU is needed)"),
    ('"${MY_GPUS:-true}"', "(set MY_GPUS=false to run without GPUs)"),
    ('"${MY_GPUS:-tr}ue"', "(set [supervisor] require_gpus = false where no GPU is needed)"),
], ids=["written-in-the-file", "from-a-variable-of-ones-own", "a-variable-in-part-is-no-knob"])
def test_a_config_of_ones_own_is_told_its_key_or_its_variable(value: str, hint: str) -> None:
    plan = parse_plan(OWN.format(value=value), "own.toml", {}, PLUGIN)
    assert plan.supervisor.require_gpus is True
    assert gpu_refusal(plan).endswith(hint), gpu_refusal(plan)
