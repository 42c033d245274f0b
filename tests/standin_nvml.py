"""The stand-in pynvml (supervisor/prover/standins/fakenvml) for the tests: its control file, a fresh copy
of the module in-process, and the environment that makes a supervisor under test import it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

# Named by path, not imported: a core GPU test uses the stand-in without importing the prover.
FAKENVML_DIR = Path(__file__).resolve().parent.parent / "supervisor" / "prover" / "standins" / "fakenvml"

FAKE_PYNVML = FAKENVML_DIR / "pynvml.py"
MiB = 1 << 20
H200 = 143771 * MiB  # memory.total of an H200 as NVML reports it
IDLE_USED = 521 * MiB


class NvmlControl:
    """The JSON control file the stand-in reads on every call; ``set`` rewrites it (atomically)."""

    def __init__(self, path: Path, **control: Any) -> None:
        self.path = path
        self.control: dict[str, Any] = {}
        self.set(**control)

    def set(self, **control: Any) -> None:
        self.control = {**self.control, **control}
        self.control = {k: v for k, v in self.control.items() if v is not None}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.control))
        os.replace(tmp, self.path)

    def calls(self) -> list[tuple[str, str]]:
        """(function, thread name) of every call logged (the control's ``log`` key names the file)."""
        log = Path(self.control["log"])
        if not log.exists():
            return []
        return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]  # type: ignore[misc]


def gpu(name: str = "NVIDIA H200", total: int = H200, used: int = IDLE_USED, util: int = 0,
        processes: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"name": name, "memory_total": total, "memory_used": used, "utilization": util,
            "processes": list(processes)}


def fake_pynvml(monkeypatch: pytest.MonkeyPatch, control: NvmlControl) -> types.ModuleType:
    """A fresh stand-in module as ``pynvml`` for this test (the real one back afterwards), driven by ``control``."""
    monkeypatch.setenv("STANDIN_NVML_CONTROL", str(control.path))
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_PYNVML)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    spec.loader.exec_module(module)
    return module


def fake_nvml_env(control: NvmlControl, **extra: str) -> dict[str, str]:
    """What a supervisor under test needs in its environment to import the stand-in as ``pynvml``."""
    repo = str(FAKENVML_DIR.parents[3])
    pythonpath = os.pathsep.join([str(FAKENVML_DIR), repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": pythonpath, "STANDIN_NVML_CONTROL": str(control.path), **extra}
