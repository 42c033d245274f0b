"""The prover's phase hooks: the kinds it registers for a phase's ``prepare``, ``parse`` and ``settle`` keys.

``prepare = "cuzk-config"`` writes cuzk.toml for this machine before each attempt (made once per plan,
bound to its [cuzk]); ``parse = "cuzk-bench"`` and ``"cuzk-single"`` read cuzk-bench's output, which
exits 0 even when proofs failed (supervisor/prover/bench.py); ``parse = "paramfetch"`` reads aria2c's readout
for the download's progress (fetchlines.py). The core picks a phase's hooks from
these by name (supervisor/plugin.py ``hooks_for``).

``settle = "cuzk-pce"``, the warm-up's: the first proof after a cold start makes cuzk-daemon extract its
pre-compiled circuit (PCE) on a thread of its own, started with that proof and never waited for (curio
extern/cuzk, cuzk-core engine.rs: "background PCE extraction starting for PoRep 32G"; it first waits for budget
for its ~14 GiB transient, often until the proof is done). It writes ``<param_cache>/pce-porep-32g.tmp``, renames
it ``.bin`` (cuzk-pce disk.rs ``save_to_disk``), then says "background PCE extraction complete" (or "... failed").
Its shutdown does not wait for that thread: a daemon stopped before the line loses the PCE, and the next one (the
bench's) extracts it again during its first proof, ~14 GiB more at its peak, on a machine sized without it. So
the warm-up keeps its daemon until the line comes, within its settle_timeout_s; one that never starts an
extraction (the PCE loaded from disk, ``CUZK_DISABLE_PCE=1``, a build without PCE) is stopped at once. Those lines
are info lines of ``cuzk_core::engine``: ``cuzk-config`` keeps them in whatever filter the daemon logs under
(cuzkconf.py, its log filter), or a quieter level would read as no extraction at all.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..config import Plan
from ..lifecycle import verdict as v
from ..lifecycle.hooks import HookContext, OutputHook, Prepare, Refusal, SettleHook
from ..text.ansi import strip_ansi
from . import cuzkconf
from .bench import BenchParser, BenchResult, SingleProofParser
from .configkeys import cuzk_settings
from .fetchlines import FetchParser
from .reasons import BENCH_FAILED

CUZK_CONFIG = "cuzk-config"
# cuzk.toml's [gpus] devices are NVML's indices (the GPU samples'), which number the GPUs in PCI bus order as
# nvidia-smi does (and cuzk-daemon itself, asking ``nvidia-smi --query-gpu=index`` where no devices are named).
# Each GPU worker then sets CUDA_VISIBLE_DEVICES to its index (cuzk-core engine.rs), which CUDA reads in its own
# order, fastest first unless CUDA_DEVICE_ORDER says otherwise: on a machine of mixed GPUs, or with one left out,
# a worker would run on another GPU than the one named (a lost one, perhaps). PCI_BUS_ID makes CUDA count as NVML.
CUDA_DEVICE_ORDER = "PCI_BUS_ID"
# What ``prepare = "cuzk-config"`` sets in its phase's children's environment, each from the [cuzk] key it is
# computed from (or what fixes its value): the plugin registers them (Plugin.prepare_env), and the config refuses a
# phase's env that would set one in its place (CUZK_BENCH_COUNT = "0" went past bench_count's bound; a CUZK_ADDR
# other than [cuzk] listen sent the bench elsewhere than the daemon the ready probe waited for).
CUZK_CONFIG_ENV = {"CUZK_CONFIG": "[cuzk] config_path", "CUZK_ADDR": "[cuzk] listen",
                   "CURIO_CUZK_ADDRESS": "[cuzk] listen", "CUZK_STATUS_LISTEN": "[cuzk] status_listen",
                   "CUZK_BENCH_CONCURRENCY": "[cuzk] bench_concurrency", "CUZK_BENCH_COUNT": "[cuzk] bench_count",
                   "CUZK_BENCH_C1": "[cuzk] bench_c1",
                   "CUDA_DEVICE_ORDER": f"cuzk.toml's GPU numbering ({CUDA_DEVICE_ORDER}, NVML's order)",
                   # Only where the inherited one hides the engine's PCE lines (cuzkconf.py, its log filter): set
                   # there, it would hide them again, since the config's env comes last.
                   "RUST_LOG": "[cuzk.overrides] logging.level (cuzk-daemon's log filter, its PCE lines kept)"}
# The parser of cuzk-bench's batch output: what reads the bench's rate (bench-done carries it).
BENCH_PARSER = "cuzk-bench"


def cuzk_config(settings: cuzkconf.CuzkSettings) -> Prepare:
    """``prepare = "cuzk-config"`` for the plan's [cuzk]: before each attempt, cuzk.toml sized for what the phase
    may have now; the cuzk processes are told where it is."""

    def write_cuzk_config(ctx: HookContext) -> dict[str, str] | Refusal:
        # The same memory figure the preflight holds the phase to; the GPU thread's latest sample, never NVML itself.
        try:
            # (the RUST_LOG its children inherit: the config's env may not set one, CUZK_CONFIG_ENV)
            generated = cuzkconf.generate(settings, ctx.memory_available or 0, list(ctx.gpus),
                                          os.environ.get(cuzkconf.RUST_LOG))
            cuzkconf.write(generated, settings.config_path, ctx.state_dir / "cuzk.generated.toml")
        except (cuzkconf.DoesNotFit, ValueError) as exc:
            return Refusal(v.INSUFFICIENT_MEMORY, str(exc))
        except OSError as exc:
            return Refusal(v.SPAWN_FAILED, f"cannot write {settings.config_path}: {exc.strerror or exc}")
        ctx.log(f"phase {ctx.phase}: wrote {settings.config_path}: {generated.summary()}")
        if ctx.gpus_left_out:  # (asked again before it was left out: a GPU gone, or one that failed twice in a row)
            left_out = ", ".join(f"GPU {index} ({why})" for index, why in ctx.gpus_left_out)
            # Without a GPU read no [gpus] table is written, and cuzk-daemon's own default decides.
            then = "cuzk runs without them" if ctx.gpus else "it names no GPU, cuzk-daemon picks its own"
            ctx.log(f"phase {ctx.phase}: cuzk.toml leaves out {left_out}: {then}")
        if generated.log_said:
            ctx.log(f"phase {ctx.phase}: {generated.log_said}")
        for line in filter(None, generated.text.splitlines()):
            ctx.log(f"  cuzk.toml | {line}")
        address = cuzkconf.cuzk_address(settings.listen)
        kept_log = {cuzkconf.RUST_LOG: generated.rust_log} if generated.rust_log is not None else {}
        return {**kept_log, "CUZK_CONFIG": settings.config_path, "CUZK_ADDR": address.for_bench(),
                "CURIO_CUZK_ADDRESS": address.for_curio(),
                "CUZK_STATUS_LISTEN": cuzkconf.status_address(settings.status_listen),
                "CUZK_BENCH_CONCURRENCY": str(generated.bench_concurrency),
                "CUZK_BENCH_COUNT": str(settings.bench_count), "CUZK_BENCH_C1": settings.bench_c1,
                "CUDA_DEVICE_ORDER": CUDA_DEVICE_ORDER}

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


# The [cuzk] keys that say where things are reached or written, not what runs: a daemon on another port, or
# cuzk.toml written to another path, proves as it did.
WHERE_NOT_WHAT = ("config_path", "listen", "status_listen")


def cuzk_config_inputs(plan: Plan) -> dict[str, Any]:
    """What ``prepare = "cuzk-config"`` is made from (Plugin.prepare_inputs): [cuzk], which cuzk.toml, the bench's
    count, C1 input and -j come from, less WHERE_NOT_WHAT. Part of what the warm-up and the bench run, for resume:
    their commands only name $CUZK_BENCH_COUNT and cuzk.toml's path, and a bench resumed on another count or memory
    model reported a rate the config now in force never measured. (The parameter cache stays in: the warm-up's
    daemon writes the PCE there, for the bench's to load.)"""
    settings = dataclasses.asdict(cuzk_settings(plan.sections, CUZK_CONFIG))
    return {key: value for key, value in settings.items() if key not in WHERE_NOT_WHAT}


# ---------------------------------------------------------------- the warm-up's settle: its PCE

PCE_SETTLE = "cuzk-pce"
STARTED = "background PCE extraction starting"
ENDED = ("background PCE extraction complete", "background PCE extraction failed")


class PceWatch:
    """The extractions the daemon started and has not said the end of, read from its log lines."""

    def __init__(self) -> None:
        self.under_way: list[str] = []  # what each is for ("PoRep 32G"), in the order they started

    def feed(self, lines: list[bytes]) -> None:
        for raw in lines:
            line = strip_ansi(raw).decode("utf-8", errors="replace")
            if STARTED in line:
                self.under_way.append(_circuit(line, STARTED) or "its circuit")
            elif self.under_way and (end := next((end for end in ENDED if end in line), None)):
                # The one it names ("... complete for SnapDeals"; a failure's fields follow the name: "... failed
                # for SnapDeals error=..."), else the oldest (PoRep's says no name).
                rest = _circuit(line, end)
                named = next((name for name in self.under_way if rest == name or rest.startswith(f"{name} ")), None)
                self.under_way.remove(named if named is not None else self.under_way[0])

    def pending(self) -> str | None:
        if not self.under_way:
            return None
        return f"its background PCE extraction for {', '.join(self.under_way)} and the PCE file's save"


def _circuit(line: str, said: str) -> str:
    """What the line names after ``said``: "for PoRep 32G (non-fatal) error=…" → "PoRep 32G (non-fatal) error=…"."""
    rest = line.split(said, 1)[1].strip()
    return rest.removeprefix("for ").strip() if rest.startswith("for ") else ""


PCE_HOOK = SettleHook("cuzk-daemon's PCE", PceWatch,
                      "the next daemon (the bench's) extracts the PCE again on its first proof, ~14 GiB more at its "
                      "peak")
