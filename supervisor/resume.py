"""Resume: a phase done in an earlier run need not run again while its evidence still holds.

When a phase is done its facts are kept (``facts_of``: when, on which machine, its output
files, what its output parser read) and persisted in status.json with the rest of the status.
The next start hands each phase the facts of the last run (``restore_facts``); the phase then
asks ``check`` whether they still hold:

- ``resume = "outputs"`` (the parameter fetch): every output file is still there, same size;
- ``resume = "machine"`` (the bench): done recently (resume_max_age_s), on the same GPUs and
  memory, and not ``--rebench``.

Anything malformed in the file means "start clean", never a crash. The output files are listed
off the loop (``output_files`` walks a tree that may be big, on a mount that may hang), at most
SURVEY_BOUND_S: a list that does not come means "run it again" at the start, and no output
table kept at the end (so the next start runs it again too). The machine fingerprint reads the
GPU thread's latest sample, never NVML itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import status as status_mod
from .offloop import run_bounded

if TYPE_CHECKING:
    from .hooks import OutputHook
    from .lifecycle import Lifecycle
    from .phase import Phase
    from .runtime import Runtime

# A done_at up to this far in the future is taken as a clock that was stepped back, not as garbage.
CLOCK_SLACK_S = 300.0
# Files under progress_path that are not outputs: locks and downloads in progress.
NOT_OUTPUTS = (".lock", ".tmp", ".part")
# The longest resume waits for the list of a phase's output files (walked off the loop).
SURVEY_BOUND_S = 30.0


def restore_facts(lifecycle: Lifecycle, state_dir: Path, log: Callable[[str], None]) -> None:
    """Hand each phase what the last run learnt (resume); a corrupt state file means a clean start."""
    previous, why = status_mod.load_persisted(state_dir)
    if previous is None:
        if why and not why.startswith("no "):
            log(f"state: {why}; starting clean")
        return
    facts = facts_in(previous)
    if facts is None:
        log(f"state: {state_dir / status_mod.STATE_NAME} does not have the expected shape; starting clean")
        return
    for phase in lifecycle.phases:
        phase.previous = facts.get(phase.name, {})


def facts_in(snap: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Phase name → the facts a later start resumes from; None if the file has another shape.

    Only well-formed facts pass: ``done_at`` a finite time not in the future, ``outputs`` a
    name → size table, ``bench`` and ``machine`` tables. Anything else means "start clean",
    never a crash (a NaN ``done_at`` would pass every age check).
    """
    phases = snap.get("phases")
    if not isinstance(phases, list):
        return None
    out: dict[str, dict[str, Any]] = {}
    for phase in phases:
        if not isinstance(phase, dict) or not isinstance(phase.get("name"), str):
            return None
        facts = phase.get("facts") or {}
        if not isinstance(facts, dict):
            return None
        done_at = facts.get("done_at")
        outputs = facts.get("outputs")
        if done_at is not None and not _a_past_time(done_at):
            return None
        if outputs is not None and not (isinstance(outputs, dict) and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in outputs.items())):
            return None
        if any(facts.get(key) is not None and not isinstance(facts[key], dict) for key in ("bench", "machine")):
            return None
        out[phase["name"]] = facts
    return out


def _a_past_time(value: Any) -> bool:
    """A finite epoch time that has already come (with a little slack for a clock that was stepped)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return 0 <= value <= time.time() + CLOCK_SLACK_S


def check(phase: Phase, output: OutputHook | None, then: Callable[[tuple[str, Any] | None], None]) -> None:
    """Whether ``phase`` need not run again: ``then`` gets what ``resumable`` says, at once, or, where its
    output files must be listed first, once they are (off the loop), or None once SURVEY_BOUND_S passed."""
    prev, spec = phase.previous, phase.spec
    if spec.resume != "outputs" or not prev.get("done_at") or not prev.get("outputs") or not spec.progress_path:
        then(resumable(phase, output))
        return
    path = spec.progress_path

    def overdue() -> None:
        phase.rt.log(f"phase {phase.name}: its output files in {path} were not listed within "
                     f"{SURVEY_BOUND_S:g}s (a hung mount?): running it again")
        then(None)

    run_bounded(phase.rt.loop, "resume", lambda: output_files(path), SURVEY_BOUND_S,
                lambda files: then(resumable(phase, output, files)), overdue,
                on_error=phase.fault_handler("resume's look at its output files"))


def resumable(phase: Phase, output: OutputHook | None,
              outputs_now: dict[str, int] | None = None) -> tuple[str, Any] | None:
    """Why ``phase`` need not run again (done before, evidence still valid) and what its output parser
    read then (None where it keeps nothing), or None: it runs. ``outputs_now``: its output files as
    listed now (``resume = "outputs"``)."""
    why = _still_valid(phase, outputs_now)
    if why is None or output is None or output.fact is None or output.restore is None \
            or not phase.previous.get(output.fact):
        return None if why is None else (why, None)
    try:
        return why, output.restore(phase.previous[output.fact])
    except TypeError:
        phase.rt.log(f"phase {phase.name}: the saved {output.what} result is unreadable: running it again")
        return None


def _still_valid(phase: Phase, outputs_now: dict[str, int] | None) -> str | None:
    prev, spec, rt = phase.previous, phase.spec, phase.rt
    if spec.resume == "no" or not prev.get("done_at"):
        return None
    if spec.resume == "outputs":
        before = prev.get("outputs")
        now = outputs_now
        if before and now is not None and all(now.get(name) == size for name, size in before.items()):
            return f"its {len(before)} output file(s) in {spec.progress_path} are all still there"
        return None
    if rt.rebench:
        return None
    age = time.time() - float(prev["done_at"])
    if age > spec.resume_max_age_s:
        rt.log(f"phase {phase.name}: done {age:.0f}s ago, older than resume_max_age_s: running it again")
        return None
    if prev.get("machine") != machine_fingerprint(rt):
        rt.log(f"phase {phase.name}: done before on a different machine (GPUs or memory): running it again")
        return None
    return f"done {age:.0f}s ago on this same machine (use --rebench to run it anyway)"


def facts_of(phase: Phase, output: OutputHook | None, then: Callable[[dict[str, Any]], None]) -> None:
    """What a later start needs to resume ``phase``, done now, to ``then``: when, on which machine, what
    its output parser read (where the parser keeps it as a fact: the bench's rate) and its output files,
    listed off the loop (without them, if they are not listed within SURVEY_BOUND_S)."""
    facts: dict[str, Any] = {"done_at": time.time(), "machine": machine_fingerprint(phase.rt)}
    if output is not None and output.fact is not None and phase.parsed is not None:
        facts[output.fact] = vars(phase.parsed)
    path = phase.spec.progress_path
    if not path:
        then(facts)
        return

    def listed(files: dict[str, int] | None) -> None:
        if files is not None:
            facts["outputs"] = files
        then(facts)

    def overdue() -> None:
        phase.rt.log(f"phase {phase.name}: its output files in {path} were not listed within {SURVEY_BOUND_S:g}s "
                     "(a hung mount?): the next start runs it again")
        then(facts)

    run_bounded(phase.rt.loop, "resume", lambda: output_files(path), SURVEY_BOUND_S, listed, overdue,
                on_error=phase.fault_handler("resume's list of its output files"))


def output_files(path: str) -> dict[str, int] | None:
    """Relative path → size of every file under ``path`` (lock and partial files left out). Blocks:
    called off the loop only."""
    root = Path(path)
    if not root.is_dir():
        return None
    files = {}
    for entry in root.rglob("*"):
        if entry.is_file() and entry.suffix not in NOT_OUTPUTS:
            try:
                files[str(entry.relative_to(root))] = entry.stat().st_size
            except OSError:
                continue
    return files


def machine_fingerprint(rt: Runtime) -> dict[str, Any]:
    """What makes a benchmark result valid here: the same GPUs and the same memory limit (the GPUs as the
    GPU thread last sampled them: names and sizes do not change)."""
    gpus = rt.gpus.samples() if rt.gpus is not None else ()
    return {"gpus": [[g.name, g.memory_total] for g in gpus], "memory": rt.available_memory()}
