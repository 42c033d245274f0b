"""Put the stand-ins on PATH under the real programs' names, for a whole-profile run here.

``prover-supervisor standins --bin-dir DIR`` writes ``curio``, ``cuzk-daemon``,
``cuzk-bench`` and ``paramfetch`` into DIR (small sh wrappers that exec the
stand-in modules with this Python), plus a ``c1.json`` for the bench. They are
never installed into the package's own bin directory: in a production image
that would shadow the real binaries.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROGRAMS = {"curio": "curio", "cuzk-daemon": "cuzk_daemon", "cuzk-bench": "cuzk_bench", "paramfetch": "paramfetch"}


def write_bin_dir(bin_dir: str | Path) -> list[Path]:
    target = Path(bin_dir)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, module in PROGRAMS.items():
        path = target / name
        path.write_text(f'#!/bin/sh\n# stand-in for {name} (prover-supervisor standins)\n'
                        f'exec "{sys.executable}" -m supervisor.prover.standins.{module} "$@"\n')
        path.chmod(0o755)
        written.append(path)
    c1 = target / "c1.json"
    c1.write_text('{"SectorNum": 1, "Phase1Out": "stand-in", "SectorSize": 34359738368}\n')
    written.append(c1)
    return written
