"""The prover's phase hooks: the kinds it registers for a phase's ``prepare`` and ``parse`` keys.

``prepare = "cuzk-config"`` writes cuzk.toml for this machine before each attempt (made once per plan,
bound to its [cuzk]); ``parse = "cuzk-bench"`` and ``"cuzk-single"`` read cuzk-bench's output, which
exits 0 even when proofs failed (supervisor/prover/bench.py); ``parse = "paramfetch"`` reads aria2c's readout
for the download's progress (fetchlines.py). The core picks a phase's hooks from
these by name (supervisor/plugin.py ``hooks_for``).
"""

from __future__ import annotations

from ..config import Plan
from ..lifecycle import verdict as v
from ..lifecycle.hooks import HookContext, OutputHook, Prepare, Refusal
from . import cuzkconf
from .bench import BenchParser, BenchResult, SingleProofParser
from .configkeys import cuzk_settings
from .fetchlines import FetchParser
from .reasons import BENCH_FAILED

CUZK_CONFIG = "cuzk-config"
# The parser of cuzk-bench's batch output: what reads the bench's rate (bench-done carries it).
BENCH_PARSER = "cuzk-bench"


def cuzk_config(settings: cuzkconf.CuzkSettings) -> Prepare:
    """``prepare = "cuzk-config"`` for the plan's [cuzk]: before each attempt, cuzk.toml sized for what the phase
    may have now; the cuzk processes are told where it is."""

    def write_cuzk_config(ctx: HookContext) -> dict[str, str] | Refusal:
        # The same memory figure the preflight holds the phase to; the GPU thread's latest sample, never NVML itself.
        try:
            generated = cuzkconf.generate(settings, ctx.memory_available or 0, list(ctx.gpus))
            cuzkconf.write(generated, settings.config_path, ctx.state_dir / "cuzk.generated.toml")
        except (cuzkconf.DoesNotFit, ValueError) as exc:
            return Refusal(v.INSUFFICIENT_MEMORY, str(exc))
        except OSError as exc:
            return Refusal(v.SPAWN_FAILED, f"cannot write {settings.config_path}: {exc.strerror or exc}")
        ctx.log(f"phase {ctx.phase}: wrote {settings.config_path}: {generated.summary()}")
        for line in filter(None, generated.text.splitlines()):
            ctx.log(f"  cuzk.toml | {line}")
        address = cuzkconf.cuzk_address(settings.listen)
        return {"CUZK_CONFIG": settings.config_path, "CUZK_ADDR": address.for_bench(),
                "CURIO_CUZK_ADDRESS": address.for_curio(),
                "CUZK_STATUS_LISTEN": cuzkconf.status_address(settings.status_listen),
                "CUZK_BENCH_CONCURRENCY": str(generated.bench_concurrency)}

    return write_cuzk_config


PARSERS = {
    # The bench's result is kept as a fact: a resumed bench phase still reports its rate.
    BENCH_PARSER: OutputHook("bench", "the cuzk-bench output parser", BenchParser, BENCH_FAILED,
                             fact="bench", restore=lambda saved: BenchResult(**saved)),
    "cuzk-single": OutputHook("warm-up proof", "the cuzk-bench single output parser", SingleProofParser,
                              BENCH_FAILED),
    # aria2c's readout and paramfetch's lines: the download's progress (its exit status judges it).
    "paramfetch": OutputHook("parameter fetch", "the paramfetch output parser", FetchParser, v.EXIT_CODE),
}


def make_cuzk_config(plan: Plan) -> Prepare:
    """The plugin's PrepareMaker for ``prepare = "cuzk-config"``: bound to the plan's [cuzk] (ConfigError if none)."""
    return cuzk_config(cuzk_settings(plan.sections, CUZK_CONFIG))
