"""The house's shape (issue 24), kept by a test rather than by memory: few rooms, each of a size a reader takes in.

At most 10 modules directly in ``supervisor/``, at most 15 in any folder (the prover's stand-ins aside: each is
one program a test runs), and no module over 700 lines. A package's ``__init__.py`` is its door, not a room:
it is not counted. The layers themselves are import-linter's (pyproject.toml, run by .ci/run).
"""

from __future__ import annotations

from pathlib import Path

SUPERVISOR = Path(__file__).resolve().parent.parent / "supervisor"
STANDINS = SUPERVISOR / "prover" / "standins"
TOP_MAX, FOLDER_MAX, LINES_MAX = 10, 15, 700


def rooms(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")


def folders() -> list[Path]:
    return sorted(d for d in SUPERVISOR.rglob("*") if d.is_dir() and d.name != "__pycache__"
                  and d != STANDINS and STANDINS not in d.parents)


def test_the_folders_hold_few_modules() -> None:
    assert len(rooms(SUPERVISOR)) <= TOP_MAX, rooms(SUPERVISOR)
    crowded = {str(d.relative_to(SUPERVISOR)): len(rooms(d)) for d in folders() if len(rooms(d)) > FOLDER_MAX}
    assert not crowded, f"folders over {FOLDER_MAX} modules: {crowded}"


def test_no_module_is_over_700_lines() -> None:
    sizes = {str(p.relative_to(SUPERVISOR)): len(p.read_text().splitlines()) for p in SUPERVISOR.rglob("*.py")}
    assert len(sizes) > 50  # (the walk found the package)
    too_long = {name: n for name, n in sizes.items() if n > LINES_MAX}
    assert not too_long, f"modules over {LINES_MAX} lines (split along a concept, not a line count): {too_long}"
