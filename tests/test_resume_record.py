"""resume.json: resume's own record in state_dir, apart from the status view's status.json.

In-process: the record's checks (like config: one line saying where it is wrong), when it is written, a write
that fails said once. End to end, real supervisors on one state_dir: the record written when a phase is done and
read at the next start (status.json deleted between the runs, or holding garbage: resume does not read it); a
damaged resume.json (wrong shape, NaN, a FIFO, huge) means a clean start with one line; an upgrade from an older
supervisor whose status.json held the facts keeps its resume (the parameters are not fetched again), and a
resume.json removed runs the phases again (the status.json beside it is not taken for an older supervisor's).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import Runner, sh, spoil, toml_str

from supervisor.lifecycle.resume import (
    NO_RERUN,
    RECORD_MAX_READ_BYTES,
    Rerun,
    ResumeRecord,
    load_record,
    output_files,
    read_record,
    record_problem,
)
from supervisor.lifecycle.states import PhaseState
from supervisor.state.files import STATUS_VERSION

NAN = float("nan")
PARAM_BYTES = 2  # what the stand-in fetch writes: "x\n"


def good_facts(**more: Any) -> dict[str, Any]:
    return {"done_at": time.time() - 60, "machine": {"gpus": [], "memory": 1 << 30}, **more}


# ---------------------------------------------------------------- in-process: the record's shape


BAD_RECORDS: dict[str, tuple[Any, str]] = {
    "a-list": ([1, 2], "a JSON array, not an object"),
    "no-version": ({"phases": {}}, "version: null where 1 belongs"),
    "version-2": ({"version": 2, "phases": {}}, "version: 2 where 1 belongs"),
    "version-true": ({"version": True, "phases": {}}, "version: true where 1 belongs"),
    "unknown-key": ({"version": 1, "phases": {}, "extra": 1}, "unknown key 'extra'"),
    "phases-a-list": ({"version": 1, "phases": []}, "phases: not a table"),
    "facts-a-number": ({"version": 1, "phases": {"bench": 5}}, "phases.bench: not a table"),
    "nan-done-at": ({"version": 1, "phases": {"bench": {"done_at": NAN}}}, "phases.bench: done_at: nan"),
    "future-done-at": ({"version": 1, "phases": {"bench": {"done_at": time.time() + 86400}}}, "phases.bench: done_at"),
    "done-at-a-string": ({"version": 1, "phases": {"bench": {"done_at": "yesterday"}}},
                         "phases.bench: done_at: 'yesterday'"),
    "done-at-true": ({"version": 1, "phases": {"bench": {"done_at": True}}}, "phases.bench: done_at: True"),
    "outputs-of-strings": ({"version": 1, "phases": {"fetch": {"outputs": {"a.params": "2"}}}},
                           "phases.fetch: outputs: not a table of file name → size"),
    "outputs-a-list": ({"version": 1, "phases": {"fetch": {"outputs": ["a.params"]}}}, "phases.fetch: outputs"),
    "machine-a-list": ({"version": 1, "phases": {"bench": {"machine": []}}}, "phases.bench: machine: not a table"),
    "bench-a-number": ({"version": 1, "phases": {"bench": {"bench": 3}}}, "phases.bench: bench: not a table"),
}


def test_output_files_lists_each_directory_once_and_judges_its_files(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A phase's outputs: every regular file under progress_path, by its path under it and its size, but a lock,
    a part, a control file and the file it is beside. Each directory is listed once, not once a file: it was
    listed again for every file in it, and 7,000 files took past the 30 s bound, so the phase never resumed."""
    (tmp_path / "sub").mkdir()
    for i in range(300):
        (tmp_path / "sub" / f"f{i}.vk").write_bytes(b"v" * i)
    (tmp_path / "a.params").write_bytes(b"p" * 10)
    (tmp_path / "b.params").write_bytes(b"p" * 20)
    (tmp_path / "b.params.aria2").write_bytes(b"c")
    (tmp_path / "fetch.lock").write_bytes(b"")
    (tmp_path / "link.params").symlink_to(tmp_path / "a.params")
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        listed.append(os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = output_files(str(tmp_path))
    assert found is not None
    assert {k: v for k, v in found.items() if not k.startswith("sub/")} == {"a.params": 10, "link.params": 10}
    assert found["sub/f299.vk"] == 299 and len(found) == 302
    assert sorted(listed) == sorted([str(tmp_path), str(tmp_path / "sub")]), listed


@pytest.mark.parametrize("kind", list(BAD_RECORDS))
def test_a_record_of_the_wrong_shape_says_where(kind: str) -> None:
    data, where = BAD_RECORDS[kind]
    problem = record_problem(data)
    assert problem is not None and problem.startswith(where), (kind, problem)


def test_a_well_formed_record_passes() -> None:
    record = {"version": 1, "phases": {"fetch": good_facts(outputs={"a.params": 2}), "first": {},
                                       "bench": good_facts(bench={"rate": 1.5}), "never": {"done_at": None}}}
    assert record_problem(record) is None


def test_read_record_refuses_what_cannot_be_read_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "resume.json"
    with pytest.raises(FileNotFoundError):
        read_record(path)
    cases = {"garbage": b"\x00\xff not json", "deep": b"[" * 100_000 + b"]" * 100_000,
             "nan": json.dumps({"version": 1, "phases": {"b": {"done_at": NAN}}}).encode()}
    for kind, data in cases.items():
        path.write_bytes(data)
        with pytest.raises(ValueError) as raised:
            read_record(path)
        assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value), (kind, raised.value)
    path.unlink()
    os.mkfifo(path)  # reading it would wait for a writer forever
    with pytest.raises(ValueError, match="not a regular file"):
        read_record(path)
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(RECORD_MAX_READ_BYTES + 1)  # sparse: takes no disk
    with pytest.raises(ValueError, match="more than the"):
        read_record(path)


# ---------------------------------------------------------------- in-process: when it is written


def done(name: str, facts: dict[str, Any], state: PhaseState = PhaseState.DONE) -> SimpleNamespace:
    """What the record reads of a phase that changed state (its DonePhase protocol)."""
    return SimpleNamespace(name=name, state=state, facts=facts)


def test_the_record_is_written_when_a_phase_is_done_and_only_then(tmp_path: Path) -> None:
    path = tmp_path / "resume.json"
    kept = {"fetch": good_facts(outputs={"a.params": 2})}
    record = ResumeRecord(path, kept)
    record.phase_changed(done("fetch", dict(kept["fetch"])))  # resumed: the facts kept already
    assert not path.exists(), "a resumed phase's facts are not written again"
    record.phase_changed(done("bench", {}, PhaseState.RUNNING))
    record.phase_changed(done("bench", good_facts(), PhaseState.FAILED))
    assert not path.exists(), "only a phase that is done is written down"
    bench = good_facts(bench={"rate": 1.5})
    record.phase_changed(done("bench", bench))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_record(path) == {**kept, "bench": bench}
    # What this run learnt does not change what it was offered: the last run's facts.
    assert record.previous("bench") == {} and record.previous("fetch") == kept["fetch"]
    assert not list(tmp_path.glob(".*.tmp")), "no temporary copy left behind"


def test_a_phase_that_starts_to_run_again_loses_what_it_left_when_last_done(tmp_path: Path) -> None:
    path = tmp_path / "resume.json"
    kept = {"fetch": good_facts(outputs={"a.params": 2}), "bench": good_facts(bench={"rate": 1.5})}
    record = ResumeRecord(path, kept)
    record.phase_changed(done("bench", {}, PhaseState.STARTING))  # run again (--rebench, its evidence gone)
    assert read_record(path) == {"fetch": kept["fetch"]}, "a re-run that fails would be resumed as done"
    record.phase_changed(done("bench", good_facts(), PhaseState.FAILED))
    assert read_record(path) == {"fetch": kept["fetch"]}
    assert record.previous("bench") == kept["bench"]  # what this start was offered is unchanged
    record.phase_changed(done("fetch", {}, PhaseState.STARTING))
    record.phase_changed(done("fetch", {}, PhaseState.STARTING))  # (a second attempt: nothing left to drop)
    assert read_record(path) == {}

def test_phases_asked_to_run_again_lose_what_they_left_at_the_start(tmp_path: Path) -> None:
    # --rebench, killed during the warm-up (before the bench reached STARTING): the old pass stayed in resume.json,
    # and the next plain start resumed the bench as done.
    path = tmp_path / "resume.json"
    kept = {"fetch": good_facts(outputs={"a.params": 2}), "bench": good_facts(bench={"rate": 1.5})}
    path.write_text(json.dumps({"version": 1, "phases": kept}))
    record = load_record(tmp_path, ["fetch", "bench"], lambda line: None)
    record.run_again(["bench"])
    assert read_record(path) == {"fetch": kept["fetch"]}
    assert record.previous("bench") == kept["bench"]  # (offered still: resumable runs it again all the same)
    mtime = path.stat().st_mtime_ns
    record.run_again([])  # nothing asked: nothing written
    assert path.stat().st_mtime_ns == mtime


def test_a_write_that_fails_is_said_once_and_said_again_once_it_works(tmp_path: Path) -> None:
    lines: list[str] = []
    state_dir = tmp_path / "gone"
    record = ResumeRecord(state_dir / "resume.json", {}, lines.append)
    record.phase_changed(done("a", good_facts()))
    record.phase_changed(done("b", good_facts()))
    assert len(lines) == 1 and lines[0].startswith(f"resume: cannot write {state_dir / 'resume.json'}: "), lines
    state_dir.mkdir()
    record.phase_changed(done("c", good_facts()))
    assert lines[1:] == [f"resume: {state_dir / 'resume.json'} written again"], lines
    assert sorted(read_record(state_dir / "resume.json")) == ["a", "b", "c"], "what could not be written is kept"


def test_load_record_keeps_the_phases_of_the_plan_and_reads_silently(tmp_path: Path) -> None:
    facts = {"fetch": good_facts(outputs={"a.params": 2}), "removed": good_facts()}
    (tmp_path / "resume.json").write_text(json.dumps({"version": 1, "phases": facts}))
    lines: list[str] = []
    record = load_record(tmp_path, ["fetch", "bench"], lines.append)
    assert lines == []
    assert record.previous("fetch") == facts["fetch"] and record.previous("removed") == {}


def test_load_record_upgrades_from_an_old_status_json_once(tmp_path: Path) -> None:
    fetch = good_facts(outputs={"a.params": 2})
    (tmp_path / "status.json").write_text(json.dumps({"version": 1, "phases": [
        {"name": "fetch", "state": "done", "since": 1.0, "why": "", "attempt": 1, "facts": fetch},
        {"name": "svc", "state": "stopped", "since": 1.0, "why": "", "attempt": 0, "facts": {}}]}))
    lines: list[str] = []
    record = load_record(tmp_path, ["fetch", "svc"], lines.append)
    assert record.previous("fetch") == fetch
    assert len(lines) == 1 and "read from" in lines[0] and "status.json" in lines[0] and "once" in lines[0], lines
    assert read_record(tmp_path / "resume.json") == {"fetch": fetch}, "written to resume.json at once"
    (tmp_path / "status.json").unlink()
    again: list[str] = []
    assert load_record(tmp_path, ["fetch", "svc"], again.append).previous("fetch") == fetch
    assert again == []


@pytest.mark.parametrize("layout", ["numbered", "kept-what-it-ran"])
def test_load_record_reads_no_facts_from_a_status_json_written_beside_a_resume_json(tmp_path: Path,
                                                                                   layout: str) -> None:
    """A status.json a supervisor that keeps resume.json wrote shows the facts as the status view: with
    resume.json gone (removed to have the phases run again) they are not read back as an upgrade's. Such a
    supervisor numbers status.json's layout past the old one's, or (written before that number) kept in the
    facts what each phase ran, which no supervisor before resume.json kept."""
    fetch = good_facts(outputs={"a.params": 2})
    version = 1
    if layout == "numbered":
        version = STATUS_VERSION
    else:
        fetch["ran"] = {"digest": "0" * 32}
    (tmp_path / "status.json").write_text(json.dumps({"version": version, "phases": [
        {"name": "fetch", "state": "done", "since": 1.0, "why": "", "attempt": 1, "facts": fetch}]}))
    lines: list[str] = []
    record = load_record(tmp_path, ["fetch"], lines.append)
    assert record.previous("fetch") == {}
    assert len(lines) == 1 and "no resume.json" in lines[0] and "run again" in lines[0], lines
    assert not (tmp_path / "resume.json").exists(), "nothing to write: no phase was done yet"


# ---------------------------------------------------------------- end to end


def counted(sup: Runner, name: str) -> int:
    path = sup.tmp / f"{name}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def two_phase_config(sup: Runner) -> Path:
    """A fetch resumed by its outputs and a bench resumed by this machine, each counting its runs."""
    params = sup.tmp / "params"
    return sup.write(f"""
        [[phases]]
        name = "fetch"
        resume = "outputs"
        stall_s = 60
        progress_path = {toml_str(str(params))}
        command = {sh(f"mkdir -p {params}; echo x > {params}/a.params; echo fetched >> {sup.tmp}/fetch.count")}

        [[phases]]
        name = "bench"
        resume = "machine"
        command = {sh(f"echo bench ran >> {sup.tmp}/bench.count")}
        """)


def run_ok(sup: Runner, config: Path) -> str:
    result = sup.run(config, timeout=60)
    assert result.returncode == 0, result.output
    assert "Traceback" not in result.output, result.output
    return result.output


def resumed_both(out: str) -> bool:
    return ("phase fetch: pending → done (resumed: its 1 output file(s)" in out
            and "phase bench: pending → done (resumed: done" in out)


def test_resume_json_is_written_when_a_phase_is_done_and_read_at_the_next_start(sup: Runner) -> None:
    config = two_phase_config(sup)
    run_ok(sup, config)
    path = sup.state_dir / "resume.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    facts = read_record(path)
    assert sorted(facts) == ["bench", "fetch"], facts
    assert facts["fetch"]["outputs"] == {"a.params": PARAM_BYTES}
    assert math.isfinite(facts["bench"]["done_at"]) and isinstance(facts["bench"]["machine"], dict)
    # status.json is the status view's file only: without it, resume still works.
    (sup.state_dir / "status.json").unlink()
    out = run_ok(sup, config)
    assert resumed_both(out), out
    assert counted(sup, "fetch") == 1 and counted(sup, "bench") == 1, out
    assert "starting clean" not in out and "status.json" not in out, out
    # The status view still shows each phase's facts (the resumed ones, from the record).
    shown = {p["name"]: p["facts"] for p in json.loads((sup.state_dir / "status.json").read_text())["phases"]}
    assert shown == facts, shown


def test_status_json_is_not_what_resume_reads(sup: Runner) -> None:
    """A status.json whose facts say nothing valid (a NaN done_at) does not matter once resume.json exists."""
    config = two_phase_config(sup)
    run_ok(sup, config)
    (sup.state_dir / "status.json").write_text(json.dumps(
        {"version": 1, "phases": [{"name": "bench", "state": "done", "since": 1.0, "why": "", "attempt": 1,
                                   "facts": {"done_at": NAN, "machine": {}}}]}))
    out = run_ok(sup, config)
    assert resumed_both(out), out
    assert counted(sup, "fetch") == 1 and counted(sup, "bench") == 1, out
    assert "starting clean" not in out, out


DAMAGED: dict[str, bytes] = {
    "garbage-bytes": b"\x00\xff\xfe garbage \x89PNG\r\n\x1a\n" * 20,
    "wrong-shape": b'{"version": 1, "phases": [{"name": "bench"}]}',
    "nan-done-at": json.dumps({"version": 1, "phases": {"bench": {"done_at": NAN, "machine": {}}}}).encode(),
    "outputs-not-sizes": b'{"version": 1, "phases": {"fetch": {"done_at": 1.0, "outputs": {"a.params": "2"}}}}',
}


def damage(path: Path, kind: str) -> None:
    spoil(path, kind, DAMAGED)


@pytest.mark.parametrize("kind", [*DAMAGED, "fifo", "huge"])
def test_a_damaged_resume_json_means_a_clean_start_with_one_line(sup: Runner, kind: str) -> None:
    config = two_phase_config(sup)
    run_ok(sup, config)  # status.json now holds good facts too: a damaged record must not fall back on them
    damage(sup.state_dir / "resume.json", kind)
    out = run_ok(sup, config)
    said = [line for line in out.splitlines() if "starting clean" in line]
    assert len(said) == 1 and "resume.json" in said[0] and "resume: " in said[0], out
    assert "resumed" not in out, out
    assert counted(sup, "fetch") == 2 and counted(sup, "bench") == 2, "both ran again: nothing resumed"
    assert sorted(read_record(sup.state_dir / "resume.json")) == ["bench", "fetch"], "written afresh"


@pytest.mark.parametrize("record", ["this-one", "kept-before-what-it-ran"])
def test_a_removed_resume_json_runs_the_done_phases_again(sup: Runner, record: str) -> None:
    """An operator removes resume.json to have the phases done run again. status.json still shows their facts (the
    status view's), which are not read back as an older supervisor's: both phases run again. Also where the
    record resumed from was kept before a phase's facts said what it ran (its facts shown without it)."""
    config = two_phase_config(sup)
    run_ok(sup, config)
    if record == "kept-before-what-it-ran":
        path = sup.state_dir / "resume.json"
        kept = read_record(path)
        path.write_text(json.dumps({"version": 1, "phases": {
            name: {k: v for k, v in facts.items() if k != "ran"} for name, facts in kept.items()}}))
        assert resumed_both(run_ok(sup, config))
    (sup.state_dir / "resume.json").unlink()
    out = run_ok(sup, config)
    assert "resumed" not in out and "read from" not in out, out
    assert counted(sup, "fetch") == 2 and counted(sup, "bench") == 2, f"both run again:\n{out}"
    said = [line for line in out.splitlines() if "resume: " in line]
    assert len(said) == 1 and "no resume.json" in said[0], out
    assert sorted(read_record(sup.state_dir / "resume.json")) == ["bench", "fetch"], "written afresh"


def test_an_upgrade_from_an_old_status_json_keeps_its_resume(sup: Runner) -> None:
    """A container restarted onto a new image: its state_dir holds the status.json an older supervisor wrote (the
    facts inside) and no resume.json. The parameters are not fetched again, now or after status.json is gone."""
    config = two_phase_config(sup)
    (sup.tmp / "params").mkdir()
    (sup.tmp / "params" / "a.params").write_text("x\n")
    sup.state_dir.mkdir()
    (sup.state_dir / "status.json").write_text(json.dumps({"version": 1, "pid": 1, "phases": [
        {"name": "fetch", "kind": "oneshot", "state": "done", "since": 1.0, "why": "completed", "attempt": 1,
         "up": False, "hold": None, "bench": None,
         "facts": {"done_at": time.time() - 600, "machine": {"gpus": [], "memory": 1}, "outputs": {"a.params": 2}}},
        {"name": "bench", "kind": "oneshot", "state": "stopped", "since": 1.0, "why": "", "attempt": 0,
         "up": False, "hold": None, "bench": None, "facts": {}}]}))
    out = run_ok(sup, config)
    said = [line for line in out.splitlines() if "resume: " in line]
    assert len(said) == 1 and "status.json" in said[0] and "once" in said[0], out
    assert "phase fetch: pending → done (resumed: its 1 output file(s)" in out, out
    assert counted(sup, "fetch") == 0, "the parameters were fetched again"
    assert counted(sup, "bench") == 1  # it had not passed before: it runs
    (sup.state_dir / "status.json").unlink()
    out = run_ok(sup, config)
    assert resumed_both(out), out
    assert counted(sup, "fetch") == 0 and counted(sup, "bench") == 1, out
    assert not [line for line in out.splitlines() if "resume: " in line], "the upgrade is read once"


def test_a_phase_whose_resume_kind_the_command_line_asks_to_rerun_runs_again_though_its_evidence_holds() -> None:
    # ``run`` with a plugin's switch (the prover's --rerun-bench): the phases of that resume kind run again even
    # where they were done on this same machine moments ago; the others are resumed as ever.
    def phase(rerun: Rerun) -> SimpleNamespace:
        needs = SimpleNamespace(loop=None, log=[].append, gpus=None, rerun=rerun,
                                available_memory=lambda cap=None: 64 << 30)
        spec = SimpleNamespace(resume="machine", resume_max_age_s=3600.0, progress_path=None)
        return SimpleNamespace(name="bench", spec=spec, resume_needs=needs, parsed=None)

    record = ResumeRecord(None, {"bench": {"done_at": time.time() - 60, "machine": {"gpus": [], "memory": 64 << 30}}})
    resumed = record.resumable(phase(NO_RERUN), None)  # type: ignore[arg-type]
    assert resumed is not None and "on this same machine" in resumed[0], resumed
    assert record.resumable(phase(Rerun(frozenset({"machine"}))), None) is None  # type: ignore[arg-type]
    assert record.resumable(phase(Rerun(frozenset({"outputs"}))), None) is not None  # type: ignore[arg-type]


def test_a_phase_done_by_another_command_or_environment_runs_again() -> None:
    """The fetch of 32 GiB parameters left its files; the config changed to 64 GiB and the phase resumed on them
    (curio then lacked its parameters). What a phase runs is a fact it keeps; one kept before it was is taken as
    the same (a record of an earlier version resumes as it did)."""
    from supervisor.config import parse_plan
    from supervisor.lifecycle.resume import what_it_runs

    def phase(size: str, env: str = "") -> tuple[SimpleNamespace, list[str]]:
        plan = parse_plan(f'[[phases]]\nname = "bench"\ncommand = ["fetch-params", "{size}"]\nresume = "machine"\n'
                          f'{env}', "t.toml", {})
        said: list[str] = []
        needs = SimpleNamespace(loop=None, log=said.append, gpus=None, rerun=NO_RERUN,
                                available_memory=lambda cap=None: 64 << 30)
        return SimpleNamespace(name="bench", spec=plan.phases[0], resume_needs=needs, parsed=None), said

    before, _ = phase("32GiB")
    done = {"done_at": time.time() - 60, "machine": {"gpus": [], "memory": 64 << 30},
            "ran": {"digest": what_it_runs(before.spec)}}
    record = ResumeRecord(None, {"bench": done})
    assert record.resumable(before, None) is not None  # type: ignore[arg-type]
    for changed, said in (phase("64GiB"), phase("32GiB", 'env = { SECTOR = "64" }\n')):
        assert record.resumable(changed, None) is None  # type: ignore[arg-type]
        assert said == ["phase bench: done before with another command or environment (its config changed): "
                        "running it again"], said
    older = ResumeRecord(None, {"bench": {k: v for k, v in done.items() if k != "ran"}})
    assert older.resumable(phase("64GiB")[0], None) is not None  # type: ignore[arg-type]


def test_a_phase_whose_prepare_was_made_from_other_settings_runs_again() -> None:
    """What a phase's prepare makes its children's environment and files from (a plugin's settings table) is part of
    what it runs: the bench's command names only $CUZK_BENCH_COUNT, and a bench passed on 12 proofs was resumed on a
    config of 3 (its rate then reported for a run it never made). A record kept before it said this (no
    ``prepared``) is taken as the same, as one kept before ``ran`` was."""
    from supervisor.config import parse_plan
    from supervisor.lifecycle.hooks import PhaseHooks
    from supervisor.lifecycle.resume import facts_of

    plan = parse_plan('[[phases]]\nname = "bench"\ncommand = ["bench"]\nresume = "machine"\n', "t.toml", {})
    said: list[str] = []
    needs = SimpleNamespace(loop=None, log=said.append, gpus=None, rerun=NO_RERUN,
                            available_memory=lambda cap=None: 64 << 30)
    spec = dataclasses.replace(plan.phases[0], prepare="tune")  # (a plugin's kind; the config read none here)
    bench = SimpleNamespace(name="bench", spec=spec, resume_needs=needs, parsed=None)
    kept: list[dict[str, Any]] = []
    facts_of(bench, PhaseHooks(prepared_from={"count": 12, "c1": "/data/c1.json"}), kept.append)  # type: ignore[arg-type]
    [done] = kept
    record = ResumeRecord(None, {"bench": done})
    assert record.resumable(bench, None, prepared_from={"c1": "/data/c1.json", "count": 12}) is not None  # type: ignore[arg-type]
    assert said == []
    assert record.resumable(bench, None, prepared_from={"count": 3, "c1": "/data/c1.json"}) is None  # type: ignore[arg-type]
    assert said == ["phase bench: done before with other settings for its prepare (tune) (its config changed): "
                    "running it again"], said
    older = ResumeRecord(None, {"bench": {**done, "ran": {"digest": done["ran"]["digest"]}}})
    assert older.resumable(bench, None, prepared_from={"count": 3}) is not None  # type: ignore[arg-type]


def test_what_became_of_the_output_files_is_said_in_a_few_words() -> None:
    from supervisor.lifecycle.resume import outputs_changed

    before = {"a": 10, "b": 20, "c": 30, "d": 40, "e": 50, "bad\nname": 1, "f": 60}
    now = {"a": 10, "b": 21, "c": 30}
    assert outputs_changed(before, now, "/p") == ("4 missing (d, e, 'bad\\nname', 1 more) and 1 of another size "
                                                  "(b 20B, now 21B) of its 7 output file(s) in /p")
    assert outputs_changed({"a": 1}, None, "/p") == ("its output files in /p cannot be listed now (gone, or not a file "
                                                     "or directory)")
