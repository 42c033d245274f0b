"""The prover's phase hooks, chosen once from a phase's ``prepare`` and ``parse`` keys.

``prepare = "cuzk-config"`` writes cuzk.toml for this machine before each attempt;
``parse = "cuzk-bench"`` and ``"cuzk-single"`` read cuzk-bench's output, which exits 0
even when proofs failed (supervisor/prover/bench.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import verdict as v
from ..config import PhaseSpec
from ..hooks import OutputHook, PhaseHooks, Refusal
from . import cuzkconf
from .bench import BenchParser, BenchResult, SingleProofParser

if TYPE_CHECKING:
    from ..phase import Phase


def write_cuzk_config(phase: Phase) -> dict[str, str] | Refusal:
    """cuzk.toml sized for what this phase may have now; the cuzk processes are told where it is."""
    rt, settings = phase.rt, phase.rt.cuzk
    if settings is None:
        return {}
    available = phase.available_memory()  # the same figure the preflight holds the phase to
    gpus = list(rt.gpus.samples()) if rt.gpus is not None else []  # the GPU thread's latest: never NVML itself
    try:
        generated = cuzkconf.generate(settings, available or 0, gpus)
        cuzkconf.write(generated, settings.config_path, rt.state_dir / "cuzk.generated.toml")
    except (cuzkconf.DoesNotFit, ValueError) as exc:
        return Refusal(v.INSUFFICIENT_MEMORY, str(exc))
    except OSError as exc:
        return Refusal(v.SPAWN_FAILED, f"cannot write {settings.config_path}: {exc.strerror or exc}")
    rt.log(f"phase {phase.name}: wrote {settings.config_path}: {generated.summary()}")
    for line in filter(None, generated.text.splitlines()):
        rt.log(f"  cuzk.toml | {line}")
    return {"CUZK_CONFIG": settings.config_path, "CUZK_ADDR": settings.listen,
            "CUZK_STATUS_LISTEN": settings.status_listen,
            "CUZK_BENCH_CONCURRENCY": str(generated.bench_concurrency)}


PREPARES = {"cuzk-config": write_cuzk_config}
PARSERS = {
    # The bench's result is kept as a fact: a resumed bench phase still reports its rate.
    "cuzk-bench": OutputHook("bench", "the cuzk-bench output parser", BenchParser, v.BENCH_FAILED,
                             fact="bench", restore=lambda saved: BenchResult(**saved)),
    "cuzk-single": OutputHook("warm-up proof", "the cuzk-bench single output parser", SingleProofParser,
                              v.BENCH_FAILED),
}


def hooks_for(spec: PhaseSpec) -> PhaseHooks:
    """The hooks ``spec`` asks for (config.py has refused any other ``prepare`` or ``parse`` value)."""
    return PhaseHooks(prepare=PREPARES[spec.prepare] if spec.prepare else None,
                      output=PARSERS[spec.parse] if spec.parse else None)
