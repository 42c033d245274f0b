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
# The prover's world: its programs (cuzk, curio, paramfetch, cuzk-bench), its proofs and their parameter cache, its
# fleet protocol's benchmark and rate. The manager's API is the core's (docs/architecture.md): its /param-done and
# /running are core report kinds, not prover words.
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
        for text in _texts(node, skipped):
            yield getattr(node, "lineno", 0), text


def _texts(node: ast.AST, skipped: set[int]) -> list[str]:
    """What ``node`` names or spells: a name it binds or reads, a module it imports, a string or bytes it holds."""
    match node:
        case ast.Name(id=name) | ast.Attribute(attr=name) | ast.arg(arg=name):
            return [name]
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name) | ast.ClassDef(name=name):
            return [name]
        case ast.alias(name=name, asname=asname):  # (the module or name imported, and what it is bound to)
            return [name, *([asname] if asname else [])]
        case ast.ImportFrom(module=module):
            return [module] if module else []
        case ast.keyword(arg=name) | ast.ExceptHandler(name=name) | ast.MatchAs(name=name) | ast.MatchStar(name=name):
            return [name] if name else []
        case ast.MatchMapping(rest=rest):
            return [rest] if rest else []
        case ast.MatchClass(kwd_attrs=attrs) | ast.Global(names=attrs) | ast.Nonlocal(names=attrs):
            return list(attrs)
        case ast.Constant(value=str() as text) if id(node) not in skipped:
            return [text]
        case ast.Constant(value=bytes() as data):
            return [data.decode("latin-1")]
    return []


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
        from .cuzkconf import settings as s
        try:
            pass
        except OSError as proof_error:
            tag = b"curio"
        match what:
            case Rate(min_rate=1) | {"k": 1, **benches} | [*curios] | str() as cuzk_name:
                global bench_count
        ''')
    found = sorted(prover_names(source))
    assert found == [(2, "benching"), (2, "supervisor.prover.bench"), (3, "min_rate"), (4, "EXIT_BENCH_REJECTED"),
                     (5, "param_cache"), (7, "proofs"), (7, "use --rebench "), (9, "Paramfetcher"), (11, "cuzkconf"),
                     (14, "proof_error"), (15, "curio"), (17, "benches"), (17, "curios"), (17, "cuzk_name"),
                     (17, "min_rate"), (18, "bench_count")], found


def test_the_core_names_no_prover_thing() -> None:
    files = core_files()
    assert SUPERVISOR / "plugin.py" in files and SUPERVISOR / "app" / "run.py" in files, "the core is read"
    assert not [f for f in files if "prover" in f.parts], "the plugin is not"
    found = [f"{path.relative_to(SUPERVISOR.parent)}:{line}: {text[:80]!r}"
             for path in files for line, text in prover_names(path.read_text())]
    assert not found, (f"the core names {len(found)} prover thing(s); let the plugin register them "
                       "(supervisor/plugin.py) and consult them by a generic name:\n" + "\n".join(found))
