"""Resume: a phase done in an earlier run need not run again while its evidence still holds.

When a phase is done its facts are gathered (``facts_of``: when, on which machine, what it ran (its
command, and what its prepare is made from: a plugin's settings), its output files, what its output parser
read) and kept in resume's own record, ``state_dir/resume.json`` (``ResumeRecord``, a listener of the phases:
written atomically each time one is done). The
next start reads it back (``load_record``) and each phase asks the record (``check``) whether
the facts of the last run still hold:

- ``resume = "outputs"`` (the parameter fetch): every output file is still there, same size;
- ``resume = "machine"`` (the bench): done recently (resume_max_age_s), on the same GPUs and
  memory.

A phase of a resume kind the command line asked to run again (``Rerun``: a plugin's switch of ``run``, the
prover's ``--rebench`` for ``"machine"``) runs whatever its evidence says.

What is read back is checked like config (``record_problem``): ``done_at`` a finite time that
has come, ``outputs`` a file name → size table, every other fact a table. Anything else, a file
that is not a regular one, or one too big, means "start clean", said in one line, never a crash.
An upgrade keeps its resume: where there is no resume.json yet, the facts an older supervisor
kept in status.json are read from there, once (said), and written to resume.json. Only an older
supervisor's: a status.json written beside a resume.json (its layout numbered past the old one's,
state_files.STATUS_VERSION, or, written before that number, its facts saying what each phase ran,
which no supervisor before resume.json kept) shows the facts as the status view, and a resume.json
missing beside it was removed to have the phases run again: they do (said).

The output files are listed off the loop (``output_files`` walks a tree that may be big, on a
mount that may hang), at most SURVEY_BOUND_S: a list that does not come means "run it again" at
the start, and no output table kept at the end (so the next start runs it again too). The
machine fingerprint reads the GPU thread's latest sample, never NVML itself.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from ..engine.offloop import run_bounded
from ..evidence.progress import file_incomplete, is_incomplete
from ..state import files as state_files
from ..state.files import Rewrites, StateFileError, load_json, not_an_object
from ..text import Log
from ..text.show import fmt_bytes, shown
from .states import Deaf, PhaseState

if TYPE_CHECKING:
    from ..config import PhaseSpec
    from ..engine.loop import ErrorHandler, EventLoop
    from ..evidence.gpuwatch import Gpus
    from .hooks import OutputHook, PhaseHooks

Facts = dict[str, Any]

RECORD_VERSION = 1
# A done_at up to this far in the future is taken as a clock that was stepped back, not as garbage.
CLOCK_SLACK_S = 300.0
# A resume.json (or an old status.json read for its facts) bigger than this is not one we wrote.
RECORD_MAX_READ_BYTES = 16 * 1024 * 1024
# status.json's layout where its facts may be the ones an older supervisor kept for resume (before resume.json);
# the layout written beside a resume.json is numbered past it (state_files.STATUS_VERSION).
OLD_STATUS_VERSION = 1
# Files under progress_path that are not outputs: locks and downloads in progress.
NOT_OUTPUTS = (".lock", ".tmp", ".part")
# The longest resume waits for the list of a phase's output files (walked off the loop).
SURVEY_BOUND_S = 30.0


@dataclass(frozen=True)
class Rerun:
    """What the command line asked of resume: the resume kinds (``"machine"``, ``"outputs"``) whose phases run
    again even where their evidence still holds, and, per kind, the switch of ``run`` that asks it (the hint
    in the log when a phase is skipped). A plugin declares the switches (plugin.py ``RunSwitch``)."""

    kinds: frozenset[str] = frozenset()
    switches: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # resume kind → its switch


NO_RERUN = Rerun()


class ResumeNeeds(Protocol):
    """What resume reads of the run: the loop (for the off-loop listing), the log, the GPUs' latest sample,
    the machine's memory and what the command line asked to run again (read-only)."""

    @property
    def loop(self) -> EventLoop: ...

    @property
    def log(self) -> Log: ...

    @property
    def gpus(self) -> Gpus | None: ...

    @property
    def rerun(self) -> Rerun: ...

    def available_memory(self, cap: int | None = None) -> int | None: ...


class ResumingPhase(Protocol):
    """What resume reads of a phase it is asked about."""

    spec: PhaseSpec
    parsed: Any  # what its output parser read

    @property
    def resume_needs(self) -> ResumeNeeds: ...

    @property
    def name(self) -> str: ...

    def fault_handler(self, what: str) -> ErrorHandler: ...


class DonePhase(Protocol):
    """What the record reads of a phase that changed state."""

    facts: Facts

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> PhaseState: ...


# ---------------------------------------------------------------- the record


class ResumeRecord(Deaf):
    """The facts each phase left when it was last done: the last run's, offered to this one
    (``previous``), and the latest, written to resume.json each time a phase is done (``phase_changed``).
    A write that fails (a full disk) is said once, tried again when the next phase is done, and said
    again once it works. With no ``path`` nothing is written (a lifecycle that keeps no state)."""

    def __init__(self, path: Path | None = None, previous: dict[str, Facts] | None = None,
                 log: Log = lambda message: None) -> None:
        self.path = path
        self._previous = {name: dict(facts) for name, facts in (previous or {}).items()}
        self._latest = {name: dict(facts) for name, facts in self._previous.items()}
        self._log = log
        self._writes = Rewrites(path, "resume", "it is tried again when the next phase is done (until then a "
                                "restart runs done phases again)", log) if path is not None else None

    def previous(self, name: str) -> Facts:
        """What the last run learnt of phase ``name`` (a copy; empty if nothing)."""
        return dict(self._previous.get(name, {}))

    def phase_changed(self, phase: DonePhase) -> None:
        """The lifecycle's first observer: a phase done now, with facts other than those kept, is written down;
        a phase that starts to run again loses what it left when last done (a re-run that then fails, or is
        killed, must not be resumed as done by the next start)."""
        if phase.state is PhaseState.STARTING and phase.name in self._latest:
            del self._latest[phase.name]
            self.save()
            return
        if phase.state is not PhaseState.DONE or not phase.facts or self._latest.get(phase.name) == phase.facts:
            return  # (a resumed phase's facts are the ones kept already)
        self._latest[phase.name] = dict(phase.facts)
        self.save()

    def run_again(self, names: Iterable[str]) -> None:
        """The phases the command line asks to run again (a plugin's switch of ``run``: ``--rebench``) lose what
        they left, on disk at once: a start killed before it got to them (in the warm-up) left the old pass for
        the next plain start to resume. (What they left is still offered as ``previous``: ``resumable`` runs them
        again all the same.)"""
        dropped = [name for name in names if self._latest.pop(name, None) is not None]
        if dropped:
            self.save()

    def save(self) -> None:
        if self._writes is None:  # no path: a lifecycle that keeps no state
            return
        self._writes.save(lambda: {"version": RECORD_VERSION, "phases": self._latest})

    def check(self, phase: ResumingPhase, hooks: PhaseHooks,
              then: Callable[[tuple[str, Any] | None], None]) -> None:
        """Whether ``phase`` need not run again: ``then`` gets what ``resumable`` says, at once, or, where its
        output files must be listed first, once they are (off the loop), or None once SURVEY_BOUND_S passed."""
        prev, spec, output, prepared_from = self.previous(phase.name), phase.spec, hooks.output, hooks.prepared_from
        if spec.resume != "outputs" or not prev.get("done_at") or not prev.get("outputs") or not spec.progress_path:
            then(self.resumable(phase, output, prepared_from=prepared_from))
            return
        path = spec.progress_path

        def overdue() -> None:
            phase.resume_needs.log(f"phase {phase.name}: its output files in {path} were not listed within "
                                   f"{SURVEY_BOUND_S:g}s (a hung mount?): running it again")
            then(None)

        run_bounded(phase.resume_needs.loop, "resume", lambda: output_files(path), SURVEY_BOUND_S,
                    lambda files: then(self.resumable(phase, output, files, prepared_from)), overdue,
                    on_error=phase.fault_handler("resume's look at its output files"))

    def resumable(self, phase: ResumingPhase, output: OutputHook | None, outputs_now: dict[str, int] | None = None,
                  prepared_from: Any = None) -> tuple[str, Any] | None:
        """Why ``phase`` need not run again (done before, evidence still valid) and what its output parser
        read then (None where it keeps nothing), or None: it runs. ``outputs_now``: its output files as
        listed now (``resume = "outputs"``); ``prepared_from``: what its prepare is made from (PhaseHooks)."""
        prev = self.previous(phase.name)
        why = _still_valid(phase, prev, outputs_now, prepared_from)
        if why is None or output is None or output.fact is None or output.restore is None \
                or not prev.get(output.fact):
            return None if why is None else (why, None)
        try:
            return why, output.restore(prev[output.fact])
        except TypeError:
            phase.resume_needs.log(f"phase {phase.name}: the saved {output.what} result is unreadable: "
                                   "running it again")
            return None


def load_record(state_dir: Path, names: Iterable[str], log: Log) -> ResumeRecord:
    """The record of ``state_dir`` with the last run's facts of the phases ``names``; a damaged one means a
    clean start (one line). Where there is none yet, the facts an older supervisor kept in status.json."""
    path = state_files.path(state_dir, state_files.RESUME)
    upgraded = False
    try:
        facts = read_record(path)
    except FileNotFoundError:
        facts = _facts_in_old_status(state_files.path(state_dir, state_files.STATUS_FILE), log)
        upgraded = bool(facts)
    except ValueError as exc:
        log(f"resume: {exc}; starting clean")
        facts = {}
    wanted = set(names)
    record = ResumeRecord(path, {name: f for name, f in facts.items() if name in wanted}, log)
    if upgraded:
        log(f"resume: {path} does not exist yet: the facts of {len(facts)} phase(s) were read from "
            f"{state_files.path(state_dir, state_files.STATUS_FILE)} (an older supervisor kept them there), once")
        record.save()
    return record


def read_record(path: Path) -> dict[str, Facts]:
    """Phase name → facts, from resume.json. Raises FileNotFoundError where there is none, or ValueError
    saying in one line why what is there cannot be used."""
    return load_json(path, RECORD_MAX_READ_BYTES, "what resume keeps", _phases)


def _phases(data: dict[str, Any]) -> dict[str, Facts]:
    """The record's phases; raises ValueError saying where it is not a resume record."""
    problem = record_problem(data)
    if problem is not None:
        raise ValueError(problem)
    return data["phases"]


def record_problem(data: Any) -> str | None:
    """Where ``data`` is not a resume record (the first place), or None."""
    if not isinstance(data, dict):
        return not_an_object(data)
    unknown = sorted(set(data) - {"version", "phases"})
    if unknown:
        return f"unknown key {unknown[0]!r}"
    if data.get("version") != RECORD_VERSION or isinstance(data.get("version"), bool):
        return f"version: {json.dumps(data.get('version'))} where {RECORD_VERSION} belongs"
    phases = data.get("phases")
    if not isinstance(phases, dict):
        return "phases: not a table of phase name → facts"
    for name, facts in phases.items():
        problem = facts_problem(facts)
        if problem is not None:
            return f"phases.{name}: {problem}"
    return None


def facts_problem(facts: Any) -> str | None:
    """Where one phase's facts are not well-formed, or None: ``done_at`` a finite time not in the future
    (a NaN would pass every age check), ``outputs`` a name → size table, every other fact a table."""
    if not isinstance(facts, dict):
        return "not a table"
    for key, value in facts.items():
        if value is None:
            continue
        if key == "done_at":
            if not _a_past_time(value):
                return f"done_at: {value!r} is not a finite time that has come"
        elif key == "outputs":
            if not isinstance(value, dict) or not all(
                    isinstance(size, int) and not isinstance(size, bool) for size in value.values()):
                return "outputs: not a table of file name → size"
        elif not isinstance(value, dict):
            return f"{key}: not a table"
    return None


def _facts_in_old_status(path: Path, log: Log) -> dict[str, Facts]:
    """The facts an older supervisor kept in its status.json (each phase's ``facts``); a damaged one means
    a clean start (one line), none at all says nothing. A status.json written beside a resume.json gives none:
    the resume.json missing was removed (one line where the phases it shows done run again)."""
    try:
        facts, older = load_json(path, RECORD_MAX_READ_BYTES, "an older supervisor's status snapshot",
                                 _old_status_facts)
    except FileNotFoundError:
        return {}
    except StateFileError as exc:
        if exc.readable:
            log(f"resume: {path} does not have the expected shape ({exc.cause}); starting clean")
        else:
            log(f"resume: {exc}; ignoring it; starting clean")
        return {}
    if facts and not older:
        log(f"resume: no {state_files.RESUME} beside {path}, which a supervisor that keeps one wrote (it was "
            f"removed, or never written): the {len(facts)} phase(s) it shows done run again (its facts are the "
            "status view's)")
        return {}
    return facts


def _old_status_facts(snap: dict[str, Any]) -> tuple[dict[str, Facts], bool]:
    """Phase name → facts from a status.json (phases that kept none left out), and whether an older supervisor
    wrote it: its layout the old one, and no phase's facts saying what it ran (kept since resume.json was);
    raises ValueError saying where it has another shape."""
    phases = snap.get("phases")
    if not isinstance(phases, list):
        raise ValueError("no list of phases")
    facts: dict[str, Facts] = {}
    for phase in phases:
        if not isinstance(phase, dict) or not isinstance(phase.get("name"), str):
            raise ValueError("a phase without a name")
        kept = phase.get("facts")
        problem = facts_problem(kept) if kept is not None else None
        if problem is not None:
            raise ValueError(f"phases.{phase['name']}.facts: {problem}")
        if kept:
            facts[phase["name"]] = kept
    version = snap.get("version")
    older = version == OLD_STATUS_VERSION and not isinstance(version, bool) \
        and not any("ran" in kept for kept in facts.values())
    return facts, older


def _a_past_time(value: Any) -> bool:
    """A finite epoch time that has already come (with a little slack for a clock that was stepped)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return 0 <= value <= time.time() + CLOCK_SLACK_S


def _still_valid(phase: ResumingPhase, prev: Facts, outputs_now: dict[str, int] | None,
                 prepared_from: Any) -> str | None:
    spec, rt = phase.spec, phase.resume_needs
    if spec.resume == "no" or not prev.get("done_at") or spec.resume in rt.rerun.kinds:
        return None
    if not _ran_the_same(phase, prev, prepared_from):
        return None
    if spec.resume == "outputs":
        before = prev.get("outputs")
        now = outputs_now
        if before and now is not None and all(now.get(name) == size for name, size in before.items()):
            return f"its {len(before)} output file(s) in {spec.progress_path} are all still there"
        if before:  # (a fetch run again is tens of GiB: said why, as a machine's change is)
            rt.log(f"phase {phase.name}: {outputs_changed(before, now, spec.progress_path)}: running it again")
        return None
    age = time.time() - float(prev["done_at"])
    if age > spec.resume_max_age_s:
        rt.log(f"phase {phase.name}: done {age:.0f}s ago, older than resume_max_age_s: running it again")
        return None
    if prev.get("machine") != machine_fingerprint(rt):
        rt.log(f"phase {phase.name}: done before on a different machine (GPUs or memory): running it again")
        return None
    switch = rt.rerun.switches.get(spec.resume)
    # When, on the clock, and how long before this start: the phase keeps this why for as long as it is done, and
    # a "done 18s ago" read days later in status would say what is no longer true.
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(prev["done_at"])))
    return (f"done {age:.0f}s before this start ({when}) on this same machine"
            + (f" (use {switch} to run it anyway)" if switch else ""))


# The most output files a line names one by one; the rest are counted.
OUTPUTS_NAMED = 3


def outputs_changed(before: dict[str, int], now: dict[str, int] | None, path: str | None) -> str:
    """What became of the output files a phase left (``before``, name → size) as listed now (None: not listable)."""
    if now is None:
        return f"its output files in {path} cannot be listed now (gone, or not a file or directory)"
    missing = [name for name in before if name not in now]
    resized = [f"{shown(name, 80, bare=True)} {fmt_bytes(size)}, now {fmt_bytes(now[name])}"
               for name, size in before.items() if name in now and now[name] != size]
    said = [f"{len(missing)} missing ({_named([shown(name, 80, bare=True) for name in missing])})"] if missing else []
    said += [f"{len(resized)} of another size ({_named(resized)})"] if resized else []
    return f"{' and '.join(said)} of its {len(before)} output file(s) in {path}"


def _named(items: list[str]) -> str:
    more = len(items) - OUTPUTS_NAMED
    return ", ".join(items[:OUTPUTS_NAMED]) + (f", {more} more" if more > 0 else "")


def _ran_the_same(phase: ResumingPhase, prev: Facts, prepared_from: Any) -> bool:
    """The phase was done by what it would run now (its ``ran`` fact; one kept before there was one, or before it
    said what its prepare was made from: taken as the same). Another command or environment is another phase: a
    fetch of 32 GiB parameters left its files there, and a config changed to 64 GiB resumed on them, curio then
    lacking its own. So are other settings its prepare makes the children's environment and files from (a plugin's
    table: the bench's count and input): the digest of the command alone resumed a bench run with others."""
    ran = prev.get("ran")
    if not isinstance(ran, dict):
        return True
    if ran.get("digest") != what_it_runs(phase.spec):
        phase.resume_needs.log(f"phase {phase.name}: done before with another command or environment (its config "
                               "changed): running it again")
        return False
    if PREPARED in ran and ran[PREPARED] != prepared_digest(prepared_from):
        phase.resume_needs.log(f"phase {phase.name}: done before with other settings for its prepare "
                               f"({phase.spec.prepare or 'none now'}) (its config changed): running it again")
        return False
    return True


# The ``ran`` fact's digest of what the phase's prepare was made from (None: no prepare, or one made from nothing).
PREPARED = "prepared"


def what_it_runs(spec: PhaseSpec) -> str:
    """A digest of what the phase runs as configured: its command's and its daemons' programs, environments and
    working directories (the knobs of the supervisor's own, its timeouts and watches, are left out)."""
    return _digest([(c.name, list(c.command), sorted(c.env.items()), c.cwd) for c in (spec.command, *spec.daemons)])


def prepared_digest(prepared_from: Any) -> str | None:
    """A digest of what the phase's prepare makes its children's environment and files from (PhaseHooks
    ``prepared_from``: a plugin's settings); None where there is nothing."""
    return None if prepared_from is None else _digest(prepared_from)


def _digest(data: Any) -> str:
    import hashlib  # (here, not at the top: it maps OpenSSL's libcrypto, 3 MiB of RSS, for phases that resume only)

    # (sorted keys: a table's order is no setting; str for what JSON has no type of, a TOML date in a table)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:32]


# ---------------------------------------------------------------- the facts of a phase done now


def facts_of(phase: ResumingPhase, hooks: PhaseHooks, then: Callable[[Facts], None]) -> None:
    """What a later start needs to resume ``phase``, done now, to ``then``: when, on which machine, what it ran
    (its command, and what its prepare was made from), what its output parser read (where the parser keeps it as
    a fact: the bench's rate) and its output files, listed off the loop (without them, if they are not listed
    within SURVEY_BOUND_S)."""
    output = hooks.output
    facts: Facts = {"done_at": time.time(), "machine": machine_fingerprint(phase.resume_needs),
                    "ran": {"digest": what_it_runs(phase.spec), PREPARED: prepared_digest(hooks.prepared_from)}}
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
        phase.resume_needs.log(f"phase {phase.name}: its output files in {path} were not listed within "
                               f"{SURVEY_BOUND_S:g}s (a hung mount?): the next start runs it again")
        then(facts)

    run_bounded(phase.resume_needs.loop, "resume", lambda: output_files(path), SURVEY_BOUND_S, listed, overdue,
                on_error=phase.fault_handler("resume's list of its output files"))


def output_files(path: str) -> dict[str, int] | None:
    """Relative path → size of every file under ``path`` (lock and partial files left out, and a file with
    its download's control file beside it: aria2c preallocates, so its size says nothing); ``path`` one file:
    its name → its size, judged alike. Blocks: called off the loop only."""
    root = Path(path)
    if root.is_file():
        if root.suffix in NOT_OUTPUTS or file_incomplete(root):
            return {}
        try:
            return {root.name: root.stat().st_size}
        except OSError:
            return None
    if not root.is_dir():
        return None
    files = {}
    for directory, subdirs, names in os.walk(root):  # each directory listed once (its names judge its files)
        subdirs.sort()
        beside = frozenset(names)
        for name in sorted(names):
            entry = Path(directory, name)
            if entry.suffix in NOT_OUTPUTS or is_incomplete(name, beside):
                continue
            try:
                info = entry.stat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                files[str(entry.relative_to(root))] = info.st_size
    return files


def machine_fingerprint(rt: ResumeNeeds) -> dict[str, Any]:
    """What makes a benchmark result valid here: the same GPUs and the same memory limit (the GPUs as the
    GPU thread last sampled them: names and sizes do not change)."""
    gpus = rt.gpus.samples() if rt.gpus is not None else ()
    return {"gpus": [[g.name, g.memory_total] for g in gpus], "memory": rt.available_memory()}
