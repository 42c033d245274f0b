"""Put the stand-ins on PATH under the real programs' names, for a whole-profile run here.

``prover-supervisor standins --bin-dir DIR`` writes ``curio``, ``cuzk-daemon``,
``cuzk-bench`` and ``paramfetch`` into DIR (small sh wrappers that exec the
stand-in modules with this Python), plus a ``c1.json`` for the bench. They are
never installed into the package's own bin directory: in a production image
that would shadow the real binaries.

DIR must be named (``--bin-dir ""``, an unset ``$VAR``, is refused, as ``--state-dir ""`` is: never the
current directory instead). Each file is written beside its name and renamed over it: what is there is
replaced, never written through (a link ``DIR/curio -> /usr/local/bin/curio`` stays the real curio).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...config import check_path
from ...state.files import write_atomically

# A stand-in C1 output (cuzk-bench requires --c1 for a PoRep; the stand-in daemon never reads it).
C1_JSON = '{"SectorNum": 1, "Phase1Out": "stand-in", "SectorSize": 34359738368}\n'
PROGRAMS = {"curio": "curio", "cuzk-daemon": "cuzk_daemon", "cuzk-bench": "cuzk_bench", "paramfetch": "paramfetch"}


def write_bin_dir(bin_dir: str) -> list[Path]:
    """The stand-ins and c1.json written into ``bin_dir`` (made if need be); ConfigError for an empty or impossible
    name, OSError where it cannot be written."""
    target = Path(check_path(bin_dir, "--bin-dir"))  # (named as the command line has it)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, module in PROGRAMS.items():
        path = target / name
        _replace(path, f'#!/bin/sh\n# stand-in for {name} (prover-supervisor standins)\n'
                       f'exec "{sys.executable}" -m supervisor.prover.standins.{module} "$@"\n', 0o755)
        written.append(path)
    c1 = target / "c1.json"
    _replace(c1, C1_JSON, 0o644)
    written.append(c1)
    return written


def _replace(path: Path, text: str, mode: int) -> None:
    # Renamed over the name (a link there is replaced, not followed); its mode set once it is ours alone.
    write_atomically(path, text.encode())
    path.chmod(mode)
