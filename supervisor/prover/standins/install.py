"""Put the stand-ins on PATH under the real programs' names, for a whole-profile run here.

``prover-supervisor standins --bin-dir DIR`` writes ``curio``, ``cuzk-daemon``,
``cuzk-bench`` and ``paramfetch`` into DIR (small sh wrappers that exec the
stand-in modules with this Python), plus a ``c1.json`` for the bench. They are
never installed into the package's own bin directory: in a production image
that would shadow the real binaries.

DIR must be named (``--bin-dir ""``, an unset ``$VAR``, is refused, as ``--state-dir ""`` is: never the
current directory instead). Each file is written beside its name and renamed over it: a link there is
replaced, never written through (a link ``DIR/curio -> /usr/local/bin/curio`` stays the real curio). A file
there that is not a stand-in of ours (``--bin-dir /usr/local/bin`` and the real curio in it) is never
replaced: the command refuses, naming it, before it writes anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...config import ConfigError, check_path
from ...state.files import write_atomically

# A stand-in C1 output (cuzk-bench requires --c1 for a PoRep; the stand-in daemon never reads it).
C1_JSON = '{"SectorNum": 1, "Phase1Out": "stand-in", "SectorSize": 34359738368}\n'
PROGRAMS = {"curio": "curio", "cuzk-daemon": "cuzk_daemon", "cuzk-bench": "cuzk_bench", "paramfetch": "paramfetch"}
# The second line of every wrapper: how a later run knows a file there for one of its own.
MARK = "(prover-supervisor standins)"


def write_bin_dir(bin_dir: str) -> list[Path]:
    """The stand-ins and c1.json written into ``bin_dir`` (made if need be); ConfigError for an empty or impossible
    name, OSError where it cannot be written."""
    target = Path(check_path(bin_dir, "--bin-dir"))  # (named as the command line has it)
    files = {target / name: (f'#!/bin/sh\n# stand-in for {name} {MARK}\n'
                             f'exec "{sys.executable}" -m supervisor.prover.standins.{module} "$@"\n', 0o755)
             for name, module in PROGRAMS.items()}
    files[target / "c1.json"] = (C1_JSON, 0o644)
    for path in files:
        _refuse_what_is_not_ours(path, bin_dir)
    target.mkdir(parents=True, exist_ok=True)
    for path, (text, mode) in files.items():
        _replace(path, text, mode)
    return list(files)


def _refuse_what_is_not_ours(path: Path, bin_dir: str) -> None:
    """ConfigError where ``path`` is a file (not a link) that no earlier ``standins`` wrote: a real program."""
    if path.is_symlink() or not path.exists():
        return
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        head = b""
    lines = head.split(b"\n")
    if path.is_file() and (head == C1_JSON.encode() or (len(lines) > 1 and MARK.encode() in lines[1])):
        return
    raise ConfigError(f"--bin-dir: {path} is there and is no stand-in of ours (a real program?): nothing written; "
                      f"name a directory of the stand-ins' own, not {bin_dir}")


def _replace(path: Path, text: str, mode: int) -> None:
    # Renamed over the name (a link there is replaced, not followed); its mode set once it is ours alone.
    write_atomically(path, text.encode())
    path.chmod(mode)
