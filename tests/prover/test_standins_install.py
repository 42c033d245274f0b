"""``prover-supervisor standins --bin-dir DIR`` (prover/standins/install.py): the stand-ins written under the real
programs' names, into the directory named and nowhere else, replacing what is there rather than writing through it.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PY, REPO, clean_env

from supervisor.config import ConfigError
from supervisor.exits import EXIT_CONFIG_ERROR
from supervisor.prover.standins.install import MARK, PROGRAMS, write_bin_dir

WRITTEN = (*PROGRAMS, "c1.json")


def test_an_empty_bin_dir_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    """`standins --bin-dir "$UNSET"` exited 0 and wrote the stand-ins into the current directory."""
    done = subprocess.run([PY, "-m", "supervisor", "standins", "--bin-dir", ""], capture_output=True, text=True,
                          cwd=tmp_path, env=clean_env({"PYTHONPATH": str(REPO)}), timeout=60)
    assert done.returncode == EXIT_CONFIG_ERROR, done
    assert done.stderr == "prover-supervisor: --bin-dir: must be a non-empty string, got ''\n", done.stderr
    assert done.stdout == "" and not list(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=r"^--bin-dir: must be a non-empty string, got ''$"):
        write_bin_dir("")


def test_a_link_in_bin_dir_is_replaced_not_written_through(tmp_path: Path) -> None:
    """`sb/curio -> /usr/local/bin/curio`: the real curio was overwritten with the stand-in's wrapper."""
    real = tmp_path / "realcurio"
    real.write_text("the real curio\n")
    real.chmod(0o755)
    bin_dir = tmp_path / "sb"
    bin_dir.mkdir()
    (bin_dir / "curio").symlink_to(real)
    (bin_dir / "c1.json").symlink_to(tmp_path / "dangling")
    written = write_bin_dir(str(bin_dir))
    assert real.read_text() == "the real curio\n" and not (tmp_path / "dangling").exists()
    assert [p.name for p in written] == list(WRITTEN)
    for name in WRITTEN:
        path = bin_dir / name
        assert not path.is_symlink() and path.is_file(), name
        assert stat.S_IMODE(path.stat().st_mode) == (0o644 if name == "c1.json" else 0o755), name
    assert "supervisor.prover.standins.curio" in (bin_dir / "curio").read_text()
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted(WRITTEN)  # no temporary file left behind


def test_the_stand_ins_are_written_again_over_themselves(tmp_path: Path) -> None:
    bin_dir = tmp_path / "new" / "bin"
    write_bin_dir(str(bin_dir))
    # One an older Python wrote: a stand-in of ours all the same (its mark on its second line).
    (bin_dir / "paramfetch").write_text(f"#!/bin/sh\n# stand-in for paramfetch {MARK}\nexec /old/python -m x\n")
    write_bin_dir(str(bin_dir))
    assert f'exec "{sys.executable}" -m supervisor.prover.standins.paramfetch' in (bin_dir / "paramfetch").read_text()


@pytest.mark.parametrize("name", [*PROGRAMS, "c1.json"])
def test_a_real_program_in_bin_dir_is_refused_and_nothing_is_written(tmp_path: Path, name: str) -> None:
    """`standins --bin-dir /usr/local/bin` replaced the real curio (and a real c1.json) with the stand-ins'."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = bin_dir / name
    real.write_text("#!/bin/sh\n# the real one\n")
    done = subprocess.run([PY, "-m", "supervisor", "standins", "--bin-dir", str(bin_dir)], capture_output=True,
                          text=True, cwd=tmp_path, env=clean_env({"PYTHONPATH": str(REPO)}), timeout=60)
    assert (done.returncode, done.stdout) == (EXIT_CONFIG_ERROR, ""), done
    assert done.stderr == (f"prover-supervisor: --bin-dir: {real} is there and is no stand-in of ours (a real "
                           f"program?): nothing written; name a directory of the stand-ins' own, not {bin_dir}\n")
    assert real.read_text() == "#!/bin/sh\n# the real one\n" and [p.name for p in bin_dir.iterdir()] == [name]


def test_the_paths_written_are_printed_one_a_line_with_a_control_character_escaped(tmp_path: Path) -> None:
    bin_dir = tmp_path / "odd \x1b[31m bin"
    done = subprocess.run([PY, "-m", "supervisor", "standins", "--bin-dir", str(bin_dir)], capture_output=True,
                          text=True, cwd=tmp_path, env=clean_env({"PYTHONPATH": str(REPO)}), timeout=60)
    assert done.returncode == 0 and "\x1b" not in done.stdout, done
    lines = done.stdout.splitlines()
    assert len(lines) == len(list(bin_dir.iterdir())) and all(
        line.startswith(f"{tmp_path}/odd \\x1b[31m bin/") for line in lines), lines
