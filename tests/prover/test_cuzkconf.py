"""cuzk.toml generation (supervisor.prover.cuzkconf): every memory-sized value derived from the memory available.

Figures from shared/domain/workloads.md: the unified memory manager needs about 70 GiB baseline + 13.6 GiB per
partition in flight; partition-workers builds peak at about 69 + 20 × pw GiB. The budget is what is
available minus the safety margin. The seeds' instance ran ``partition_workers = 10`` on 125 GB
(≈ 269 GiB wanted) and was OOM-killed: such a value is refused, with both numbers.
"""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from supervisor.prover import cuzkconf
from supervisor.prover.cuzkconf import GIB, CuzkSettings, DoesNotFit, generate
from supervisor.prover.standins.cuzk_settings import cuzk_size  # (cuzk-daemon's own reading of a size)
from supervisor.text.units import parse_size

H100 = 80 * GIB


def gpus(*indices: int) -> list[cuzkconf.GpuSample]:
    return [cuzkconf.GpuSample(i, "NVIDIA H100 80GB HBM3", 0, 0, H100) for i in indices]


def settings(**kw: Any) -> CuzkSettings:
    return CuzkSettings(config_path="/tmp/unused-cuzk.toml", **kw)


def unified_expected(available_gib: int, margin_gib: int = 5) -> int:
    return math.floor((available_gib - margin_gib - 70) / 13.6)


def proofs_expected(available_gib: int, margin_gib: int = 5) -> int:
    """synthesis_concurrency: whole PoRep proofs (10 partitions, ~136 GiB) at once (cuzk-core config.rs), >= 1."""
    return max(1, math.floor((available_gib - margin_gib - 70) / 136))


@pytest.mark.parametrize("model", ["unified", "partition-workers"])
def test_the_generated_tables_are_those_an_override_may_not_replace(model: str) -> None:
    """configkeys.py refuses an override of a generated table that is no table (it would replace it whole): the
    list it reads is what generate() writes, with GPUs and without."""
    assert set(generate(settings(memory_model=model), 512 * GIB, gpus(0)).config) == set(cuzkconf.GENERATED_TABLES)
    assert set(generate(settings(memory_model=model), 512 * GIB, []).config) == set(cuzkconf.GENERATED_TABLES) - {
        "gpus"}


# ---------------------------------------------------------------- unified memory manager


@pytest.mark.parametrize(("available_gib", "partitions", "proofs"), [(125, 3, 1), (128, 3, 1), (256, 13, 1),
                                                                  (512, 32, 3)])
@pytest.mark.parametrize("indices", [(0,), (0, 1)])
def test_unified_budget_and_concurrency(available_gib: int, partitions: int, proofs: int,
                                        indices: tuple[int, ...]) -> None:
    assert partitions == unified_expected(available_gib)  # the table above is the shared/domain/workloads.md formula
    assert proofs == proofs_expected(available_gib)
    gen = generate(settings(), available_gib * GIB, gpus(*indices))
    budget_gib = available_gib - 5
    assert gen.budget == budget_gib * GIB
    assert gen.partitions == partitions
    cfg = gen.config
    assert cfg["memory"] == {"total_budget": f"{budget_gib}GiB", "safety_margin": "5GiB"}
    assert cfg["pipeline"]["enabled"] is True
    # Whole proofs at once, not partitions: 13 on 256 GiB asked for 13 × 136 GiB of syntheses.
    assert cfg["pipeline"]["synthesis_concurrency"] == proofs
    assert cfg["gpus"]["devices"] == list(indices)
    # One file for both generations: a partition-workers build reading it gets what the same budget holds.
    assert cfg["synthesis"] == {"partition_workers": math.floor((budget_gib - 69) / 20)}
    assert cfg["daemon"] == {"listen": "127.0.0.1:9820", "status_listen": "127.0.0.1:9821"}
    assert cfg["srs"] == {"param_cache": "/var/tmp/filecoin-proof-parameters"}
    # Peak at that concurrency fits the budget; one more partition would not.
    assert 70 * GIB + partitions * cuzkconf.PER_PARTITION <= gen.budget
    assert 70 * GIB + (partitions + 1) * cuzkconf.PER_PARTITION > gen.budget
    assert tomllib.loads(gen.text) == cfg


def test_gpu_devices_are_the_sampled_indices_not_a_count() -> None:
    gen = generate(settings(), 256 * GIB, gpus(1, 3))
    assert gen.config["gpus"]["devices"] == [1, 3]
    assert gen.config["gpus"]["gpu_workers_per_device"] == 2
    assert "2 GPU(s)" in gen.summary()


def test_safety_margin_is_taken_off_the_budget() -> None:
    gen = generate(settings(safety_margin=10 * GIB), 128 * GIB, gpus(0))
    assert gen.budget == 118 * GIB
    assert gen.config["memory"] == {"total_budget": "118GiB", "safety_margin": "10GiB"}
    assert gen.partitions == unified_expected(128, 10) == 3


@pytest.mark.parametrize("model", ["unified", "partition-workers"])
def test_too_little_memory_does_not_fit_and_names_both_numbers(model: str) -> None:
    with pytest.raises(DoesNotFit) as info:
        generate(settings(memory_model=model), 64 * GIB, gpus(0))
    text = str(info.value)
    assert "59.0GiB" in text, text  # the budget: 64 GiB - 5 GiB margin
    needed = "83.6GiB" if model == "unified" else "89.0GiB"  # 70 + 13.6, or 69 + 20 × 1
    assert needed in text, text


def test_unified_just_enough_for_one_partition() -> None:
    need = 70 * GIB + cuzkconf.PER_PARTITION
    gen = generate(settings(), need + 5 * GIB, [])
    assert gen.partitions == 1
    with pytest.raises(DoesNotFit):
        generate(settings(), need + 5 * GIB - 1, [])


def test_baseline_and_per_partition_are_settable() -> None:
    """The profile lowers them so the stand-ins run on a small machine: 1 GiB + 512 MiB per partition."""
    gen = generate(settings(baseline=GIB, per_partition=512 << 20), 24 * GIB, [])
    assert gen.budget == 19 * GIB
    assert gen.partitions == (19 - 1) * 2 == 36


def test_written_safety_margin_is_the_configured_one() -> None:
    """Rounding to whole GiB must not lose the margin: 512 MiB is not "0GiB"."""
    gen = generate(settings(safety_margin=512 << 20), 256 * GIB, [])
    assert parse_size(gen.config["memory"]["safety_margin"]) == 512 << 20, gen.config["memory"]


def test_written_total_budget_holds_the_concurrency_it_was_sized_for() -> None:
    """Available 88.8 GiB: budget 83.8 GiB, sized for one partition (70 + 13.6 = 83.6 GiB); writing the
    budget rounded down to "83GiB" tells the daemon less than that peak."""
    gen = generate(settings(), int(88.8 * GIB), [])
    assert gen.partitions == 1
    written = parse_size(gen.config["memory"]["total_budget"])
    assert written <= gen.budget
    assert written >= 70 * GIB + gen.partitions * cuzkconf.PER_PARTITION, gen.config["memory"]


# ---------------------------------------------------------------- partition-workers builds


@pytest.mark.parametrize(("available_gib", "pw"), [(125, 2), (128, 2), (256, 9)])
@pytest.mark.parametrize("indices", [(0,), (0, 1)])
def test_partition_workers_from_memory(available_gib: int, pw: int, indices: tuple[int, ...]) -> None:
    assert pw == math.floor((available_gib - 5 - 69) / 20)
    gen = generate(settings(memory_model="partition-workers"), available_gib * GIB, gpus(*indices))
    assert gen.budget == (available_gib - 5) * GIB
    assert gen.partitions == pw
    assert gen.config["synthesis"] == {"partition_workers": pw}
    assert gen.config["gpus"]["devices"] == list(indices)
    # One file for both generations: a unified daemon reading it gets the same budget and what it holds.
    budget_gib = available_gib - 5
    assert gen.config["memory"] == {"total_budget": f"{budget_gib}GiB", "safety_margin": "5GiB"}
    assert gen.config["pipeline"] == {"enabled": True, "synthesis_concurrency": proofs_expected(available_gib)}
    assert tomllib.loads(gen.text) == gen.config
    assert "partition_workers" in gen.summary()


def test_the_seeds_partition_workers_10_on_125_gib_is_refused() -> None:
    s = settings(memory_model="partition-workers", overrides={"synthesis": {"partition_workers": 10}})
    with pytest.raises(DoesNotFit) as info:
        generate(s, 125 * GIB, gpus(0))
    text = str(info.value)
    assert "269.0GiB" in text, text  # 69 + 20 × 10
    assert "120.0GiB" in text, text  # the budget
    assert "partition_workers = 10" in text


def test_partition_workers_override_that_fits_wins() -> None:
    s = settings(memory_model="partition-workers", overrides={"synthesis": {"partition_workers": 1}})
    gen = generate(s, 256 * GIB, gpus(0))
    assert gen.config["synthesis"]["partition_workers"] == 1
    assert gen.partitions == 1


def test_partition_workers_budget_below_one_worker_is_refused() -> None:
    """90 GiB: budget 85 GiB, floor((85 - 69) / 20) = 0 workers: refused, never pw = 0 or a fixed 10."""
    with pytest.raises(DoesNotFit) as info:
        generate(settings(memory_model="partition-workers"), 90 * GIB, [])
    assert "85.0GiB" in str(info.value) and "89.0GiB" in str(info.value)


# ---------------------------------------------------------------- user overrides


def test_user_synthesis_concurrency_that_fits_wins() -> None:
    s = settings(overrides={"pipeline": {"synthesis_concurrency": 2}})
    gen = generate(s, 512 * GIB, gpus(0, 1))  # 70 + 2 × 136 GiB fit 507 GiB (config.rs: 2 above 400 GiB)
    assert gen.config["pipeline"]["synthesis_concurrency"] == 2
    assert gen.config["pipeline"]["enabled"] is True  # the rest of the table is kept
    assert gen.partitions == unified_expected(512)  # partitions in flight: what the budget holds
    assert gen.bench_concurrency == 5


def test_user_synthesis_concurrency_that_cannot_fit_is_refused() -> None:
    s = settings(overrides={"pipeline": {"synthesis_concurrency": 2}})
    with pytest.raises(DoesNotFit) as info:
        generate(s, 256 * GIB, gpus(0))
    text = str(info.value)
    assert "342.0GiB" in text, text  # 70 + 2 proofs × 10 partitions × 13.6
    assert "251.0GiB" in text, text
    assert "synthesis_concurrency = 2" in text and "2 whole proof(s) of 10 partitions at once" in text


def test_a_user_synthesis_concurrency_of_1_is_always_taken() -> None:
    # 1, cuzk's default and what the generator writes when less than one whole proof fits beyond the baseline,
    # was refused when set by hand on 128 GiB ("wants about 206 GiB").
    gen = generate(settings(overrides={"pipeline": {"synthesis_concurrency": 1}}), 128 * GIB, gpus(0))
    assert gen.config["pipeline"]["synthesis_concurrency"] == 1


def test_extra_user_keys_are_kept() -> None:
    s = settings(overrides={"scheduler": {"max_batch_size": 4, "max_batch_wait_ms": 250},
                            "logging": {"level": "debug", "format": "json"},
                            "gpus": {"gpu_threads": 8}})
    gen = generate(s, 256 * GIB, gpus(0, 1))
    cfg = gen.config
    assert cfg["scheduler"] == {"max_batch_size": 4, "max_batch_wait_ms": 250}
    assert cfg["logging"] == {"level": "debug", "format": "json"}
    # Merged into the generated table, not replacing it.
    assert cfg["gpus"] == {"devices": [0, 1], "gpu_workers_per_device": 2, "gpu_threads": 8}
    assert cfg["memory"]["total_budget"] == "251GiB"
    assert tomllib.loads(gen.text) == cfg


def test_overrides_are_not_mutated() -> None:
    overrides = {"scheduler": {"max_batch_size": 4}}
    gen = generate(settings(overrides=overrides), 256 * GIB, [])
    gen.config["scheduler"]["max_batch_size"] = 99
    assert overrides == {"scheduler": {"max_batch_size": 4}}


def test_user_total_budget_that_fits_sizes_the_concurrency() -> None:
    s = settings(overrides={"memory": {"total_budget": "100GiB"}})
    gen = generate(s, 128 * GIB, gpus(0))
    assert gen.config["memory"]["total_budget"] == "100GiB"
    assert gen.partitions == math.floor((100 - 70) / 13.6) == 2
    # What the log line says ("wrote cuzk.toml: budget ...") is the budget written, not the automatic 123 GiB.
    assert gen.budget == 100 * GIB and gen.summary().startswith("budget 100.0GiB, 2 partitions in flight"), \
        gen.summary()
    assert gen.config["pipeline"]["synthesis_concurrency"] == 1  # one whole proof at a time


@pytest.mark.parametrize(("given", "meant"), [("200G", 200 * GIB), ("300gib", 300 * GIB),
                                               ("250.5GiB", int(250.5 * GIB)), ("0.4TiB", int(0.4 * (1 << 40))),
                                               ("215000MB", 215 * 10**9 // 2**20 * 2**20)])
def test_a_user_total_budget_is_written_as_cuzk_reads_it(given: str, meant: int) -> None:
    # Written as typed, cuzk-daemon read "200G", "300gib", "250.5GiB" and "0.4TiB" as 50 GiB (its parse_size takes a
    # whole number of GiB, MiB, GB or MB only): too little for the SRS, every proof waited for budget after the
    # whole download, while the supervisor had sized the rest (and said so) on 200 GiB.
    gen = generate(settings(overrides={"memory": {"total_budget": given}}), 512 * GIB, gpus(0))
    written = tomllib.loads(gen.text)["memory"]["total_budget"]
    assert cuzk_size(written) == meant // 2**20 * 2**20 == gen.budget, (written, gen.summary())


def test_a_user_total_budget_of_auto_is_written_as_the_budget_worked_out_here() -> None:
    # cuzk's "auto" is MemTotal less its margin, blind to the container's limit: on a 1 TiB host a 128 GiB
    # container's daemon would size itself for ~1 TiB and be OOM-killed.
    gen = generate(settings(overrides={"memory": {"total_budget": "auto"}}), 128 * GIB, gpus(0))
    written = tomllib.loads(gen.text)["memory"]["total_budget"]
    assert written == "123GiB" and cuzk_size(written) == gen.budget == 123 * GIB, (written, gen.summary())


def test_user_total_budget_sizes_the_partition_workers_written_beside_it() -> None:
    """One file suits both generations, each sized on the same budget: a partition-workers build ignores
    total_budget, so its worker count must hold within the budget the user set, not the automatic one (on 256 GiB:
    251 GiB, 9 workers of 69 + 20 × pw GiB; within 110 GiB, 2)."""
    s = settings(overrides={"memory": {"total_budget": "110GiB"}})
    gen = generate(s, 256 * GIB, gpus(0))
    assert gen.config["memory"]["total_budget"] == "110GiB"
    assert gen.config["synthesis"]["partition_workers"] == math.floor((110 - 69) / 20) == 2
    assert generate(settings(), 256 * GIB, gpus(0)).config["synthesis"]["partition_workers"] == 9


def test_user_total_budget_above_what_is_available_is_refused() -> None:
    s = settings(overrides={"memory": {"total_budget": "200GiB"}})
    with pytest.raises(DoesNotFit) as info:
        generate(s, 128 * GIB, gpus(0))
    assert "200GiB" in str(info.value) and "128.0GiB" in str(info.value)


def test_user_total_budget_below_the_baseline_is_refused() -> None:
    """A budget that cannot hold the SRS + PCE + one partition fails in the daemon ("insufficient memory
    budget for SRS"): a user value that cannot fit must be refused here, with both numbers."""
    s = settings(overrides={"memory": {"total_budget": "60GiB"}})
    with pytest.raises(DoesNotFit) as info:
        generate(s, 256 * GIB, gpus(0))
    assert "60" in str(info.value) and "83.6GiB" in str(info.value)


# ---------------------------------------------------------------- bench concurrency


@pytest.mark.parametrize(("available_gib", "requested", "expected"), [
    (125, 5, 3),   # 3 partitions fit: -j 5 scaled down
    (256, 5, 5),   # 13 fit: the requested 5
    (256, 2, 2),
    (90, 5, 1),    # budget 85 GiB: one partition, never -j 0
])
def test_bench_concurrency_is_what_fits(available_gib: int, requested: int, expected: int) -> None:
    gen = generate(settings(bench_concurrency=requested), available_gib * GIB, gpus(0))
    assert gen.bench_concurrency == expected
    assert f"bench -j {expected}" in gen.summary()


def test_bench_concurrency_in_partition_workers_builds() -> None:
    gen = generate(settings(memory_model="partition-workers", bench_concurrency=5), 125 * GIB, gpus(0))
    assert gen.bench_concurrency == 2
    gen = generate(settings(memory_model="partition-workers", bench_concurrency=5), 110 * GIB, gpus(0))
    assert gen.partitions == 1 and gen.bench_concurrency == 1


# ---------------------------------------------------------------- no GPU, TOML text


def test_no_gpus_means_no_gpus_table() -> None:
    for model in ("unified", "partition-workers"):
        gen = generate(settings(memory_model=model), 256 * GIB, [])
        assert "gpus" not in gen.config
        assert "[gpus]" not in gen.text
        assert "0 GPU(s)" in gen.summary()


def test_generated_text_is_valid_toml_with_every_section() -> None:
    s = settings(listen="unix:///run/curio/cuzk.sock", status_listen="127.0.0.1:19821",
                 param_cache="/data/params with space/\"quoted\"",
                 overrides={"scheduler": {"max_batch_size": 2}})
    gen = generate(s, 256 * GIB, gpus(0, 1))
    parsed = tomllib.loads(gen.text)
    assert parsed == gen.config
    assert parsed["daemon"]["listen"] == "unix:///run/curio/cuzk.sock"
    assert parsed["srs"]["param_cache"] == "/data/params with space/\"quoted\""
    assert set(parsed) == {"daemon", "srs", "logging", "gpus", "memory", "pipeline", "synthesis", "scheduler"}


# ---------------------------------------------------------------- write()


def test_write_is_atomic_and_keeps_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "etc" / "cuzk.toml"  # parent directories are created
    copy = tmp_path / "state" / "cuzk.generated.toml"
    target.parent.mkdir()
    target.write_text("[daemon]\nlisten = \"old\"\n")
    old_inode = target.stat().st_ino
    gen = generate(settings(), 256 * GIB, gpus(0))

    renames: list[tuple[str, str, str]] = []
    real_replace = Path.replace

    def spy(self: Path, dst: Any) -> Any:
        # At the moment of the rename the temporary file is complete and the target still the old one.
        renames.append((self.name, Path(dst).name, self.read_text()))
        if Path(dst) == target:
            assert target.read_text() == "[daemon]\nlisten = \"old\"\n"
        return real_replace(self, dst)

    monkeypatch.setattr(Path, "replace", spy)
    with open(target) as reader:  # a daemon that opened the old file keeps reading a whole old file
        cuzkconf.write(gen, target, copy)
        assert reader.read() == "[daemon]\nlisten = \"old\"\n"
    assert [(src, dst) for src, dst, _ in renames] == [("cuzk.toml.tmp", "cuzk.toml"),
                                                        ("cuzk.generated.toml.tmp", "cuzk.generated.toml")]
    assert all(text == gen.text for _, _, text in renames)
    assert target.read_text() == gen.text
    assert copy.read_text() == gen.text
    assert target.stat().st_ino != old_inode, "rewritten in place, not replaced"
    assert not list(tmp_path.rglob("*.tmp"))
    assert tomllib.loads(target.read_text()) == gen.config


def test_write_without_a_copy(tmp_path: Path) -> None:
    gen = generate(settings(), 128 * GIB, [])
    cuzkconf.write(gen, tmp_path / "cuzk.toml")
    assert (tmp_path / "cuzk.toml").read_text() == gen.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuzk.toml"]


def test_a_fifo_in_the_target_place_is_replaced_not_read(tmp_path: Path) -> None:
    """The look for "holds this text already" read a FIFO there and hung the loop, deaf to SIGTERM."""
    target = tmp_path / "cuzk.toml"
    os.mkfifo(target)
    gen = generate(settings(), 128 * GIB, [])
    cuzkconf.write(gen, target)
    assert target.is_file() and target.read_text() == gen.text


# ---------------------------------------------------------------- both generations, settable figures


def test_partition_workers_figures_are_settable() -> None:
    """The stand-ins run the partition-workers profile on a small machine with lowered figures."""
    s = settings(memory_model="partition-workers", safety_margin=GIB, pw_baseline=GIB, pw_per_worker=512 << 20)
    gen = generate(s, 4 * GIB, gpus(0))
    assert gen.budget == 3 * GIB
    assert gen.partitions == 4 and gen.config["synthesis"] == {"partition_workers": 4}  # (3 - 1) / 0.5
    with pytest.raises(DoesNotFit) as info:
        generate(s, 2 * GIB + (256 << 20), gpus(0))  # budget 1.25 GiB < 1 GiB + 512 MiB
    assert "1.5GiB" in str(info.value) and "1.2GiB" in str(info.value), str(info.value)


def test_unified_model_writes_at_least_one_partition_worker() -> None:
    """A budget too small for one pw worker still writes 1 (the least memory a pw build can use), not 0."""
    gen = generate(settings(baseline=GIB, per_partition=GIB), 10 * GIB, [])
    assert gen.config["synthesis"] == {"partition_workers": 1}
    assert gen.partitions == 4  # (10 - 5 - 1) / 1
    assert gen.config["pipeline"]["synthesis_concurrency"] == 1  # less than one proof of 10 partitions: 1


def test_user_partition_workers_is_kept_in_a_unified_config() -> None:
    gen = generate(settings(overrides={"synthesis": {"partition_workers": 3}}), 256 * GIB, [])
    assert gen.config["synthesis"] == {"partition_workers": 3}
    assert gen.partitions == unified_expected(256)


# ---------------------------------------------------------------- the daemon's log filter: its PCE lines kept

ENGINE = "cuzk_core::engine"


@pytest.mark.parametrize(("rust_log", "level", "given", "written"), [
    (None, None, None, "info"),  # cuzk's own level: nothing changed
    (None, "warn", None, f"warn,{ENGINE}=info"),
    (None, "debug", None, "debug"),  # a more verbose one is never lowered
    (None, "warn,cuzk_core=info", None, "warn,cuzk_core=info"),  # (it shows them already)
    (None, f"info,{ENGINE}=warn", None, f"info,{ENGINE}=warn,{ENGINE}=info"),
    (None, "warn,cuzk_core=debug", None, "warn,cuzk_core=debug"),
    (None, "cuzk_daemon", None, f"cuzk_daemon,{ENGINE}=info"),  # (a target alone: every level of that one only)
    (None, "bogus=loud", None, f"error,{ENGINE}=info"),  # (nothing it can read: the daemon's level was error)
    ("warn", None, f"warn,{ENGINE}=info", "info"),
    ("warn", "error", f"warn,{ENGINE}=info", "error"),  # (RUST_LOG wins over cuzk.toml: left as it was)
    ("", None, f"{ENGINE}=info", "info"),  # (set but empty: the daemon logs nothing, but its engine's lines now)
    ("2", None, f"2,{ENGINE}=info", "info"),  # (a level by its number: 2 is warn)
    ("debug", "warn", None, "warn"),  # (RUST_LOG shows them: cuzk.toml's level is never read)
    ("warn=loud", "warn", None, f"warn,{ENGINE}=info"),  # (a RUST_LOG that does not parse is not used: cuzk.toml's)
])
def test_the_daemons_log_filter_keeps_its_engines_pce_lines(monkeypatch: pytest.MonkeyPatch, rust_log: str | None,
                                                             level: str | None, given: str | None,
                                                             written: str) -> None:
    """The warm-up's settle reads the engine's info lines (target cuzk_core::engine): a filter that hid them had it
    stop the daemon at once, the PCE lost. Where the filter the daemon uses (RUST_LOG when it parses, else cuzk.toml's
    [logging] level) hides them, ``,cuzk_core::engine=info`` is added to it; everywhere else it holds as the user
    set it. The daemon's reading is the stand-in's (cuzk-daemon main.rs and tracing's EnvFilter)."""
    from supervisor.prover.standins import cuzk_settings as daemon

    overrides = {"logging": {"level": level}} if level is not None else None
    gen = generate(settings(overrides=overrides), 256 * GIB, gpus(0), rust_log)
    assert (gen.rust_log, tomllib.loads(gen.text)["logging"]["level"]) == (given, written)
    assert (gen.log_said is None) == (given is None and written == (level or "info"))

    def daemon_log(rust: str | None, toml_level: str) -> Any:
        if rust is None:
            monkeypatch.delenv("RUST_LOG", raising=False)
        else:
            monkeypatch.setenv("RUST_LOG", rust)
        return daemon.log_for(None, {"logging": {"level": toml_level}})

    kept = daemon_log(given if given is not None else rust_log, written)
    theirs = daemon_log(rust_log, level or "info")
    # The engine's info lines shown (and no more of its debug than before); every other line as the user had it.
    assert kept.enabled("info", ENGINE) and kept.enabled("debug", ENGINE) == theirs.enabled("debug", ENGINE)
    for target in ("cuzk_daemon", "cuzk_core::pipeline"):
        for lvl in ("error", "warn", "info", "debug", "trace"):
            assert kept.enabled(lvl, target) == theirs.enabled(lvl, target), (target, lvl)
