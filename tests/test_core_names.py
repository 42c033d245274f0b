"""The core's code names no prover thing: what the prover is (the Filecoin prover plugin, supervisor/prover/) reaches
the core only through what the plugin registers (supervisor/plugin.py), by the core's generic names.

Every name (a variable, attribute, function, class, argument, import, keyword) and every string in the core's code
is read from its syntax tree; none may contain a word of the prover's world. Comments and docstrings may give
examples, so they are not read. The core is ``supervisor/`` less ``supervisor/prover/`` and the composition root
``supervisor/app/cli.py``, which hands the plugin in. This module imports nothing of ``supervisor.prover``.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

SUPERVISOR = Path(__file__).resolve().parent.parent / "supervisor"
NOT_CORE = (SUPERVISOR / "prover", SUPERVISOR / "app" / "cli.py")
# The prover's world: its programs (cuzk, curio, paramfetch, cuzk-bench), its proofs and their parameters, its
# fleet protocol's benchmark and rate.
PROVER_WORDS = re.compile(r"bench|cuzk|curio|proof|paramfetch|min_rate|param_cache|fil_proofs", re.IGNORECASE)


def core_files() -> list[Path]:
    return [path for path in sorted(SUPERVISOR.rglob("*.py"))
            if not any(path == other or other in path.parents for other in NOT_CORE)]


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (a module's, a class's or a function's first statement)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def names_and_strings(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every name and every string but a docstring in ``source`` (comments are not in the tree)."""
    tree = ast.parse(source)
    skipped = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            text = node.name
        elif isinstance(node, ast.arg):
            text = node.arg
        elif isinstance(node, ast.alias):
            text = node.asname or node.name
        elif isinstance(node, ast.keyword) and node.arg is not None:
            text = node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            text = node.value
        else:
            continue
        yield getattr(node, "lineno", 0), text


def prover_names(source: str) -> list[tuple[int, str]]:
    return [(line, text) for line, text in names_and_strings(source) if PROVER_WORDS.search(text)]


def test_the_counter_finds_names_and_strings_but_not_comments_or_docstrings() -> None:
    source = textwrap.dedent('''\
        """A docstring may say cuzk-bench."""
        import supervisor.prover.bench as benching
        from x import min_rate
        EXIT_BENCH_REJECTED = 69  # a comment may say curio
        def check(param_cache: str) -> None:
            """Nor is a function's docstring read: FIL_PROOFS_PARAMETER_CACHE."""
            call(rate=x.proofs, how=f"use --rebench {y}")
            say("nothing of it here")
        class Paramfetcher:
            pass
        ''')
    found = sorted(prover_names(source))
    assert found == [(2, "benching"), (3, "min_rate"), (4, "EXIT_BENCH_REJECTED"), (5, "param_cache"),
                     (7, "proofs"), (7, "use --rebench "), (9, "Paramfetcher")], found


def test_the_core_names_no_prover_thing() -> None:
    files = core_files()
    assert SUPERVISOR / "plugin.py" in files and SUPERVISOR / "app" / "run.py" in files, "the core is read"
    assert not [f for f in files if "prover" in f.parts], "the plugin is not"
    found = [f"{path.relative_to(SUPERVISOR.parent)}:{line}: {text[:80]!r}"
             for path in files for line, text in prover_names(path.read_text())]
    assert not found, (f"the core names {len(found)} prover thing(s); let the plugin register them "
                       "(supervisor/plugin.py) and consult them by a generic name:\n" + "\n".join(found))
