"""The package's shape, checked from its source: imports go one way, the command line is a thin
layer nothing else imports, and ``vitkit --help`` starts without torch."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import vitkit

SRC = Path(vitkit.__file__).parent
MAX_FUNCTION_LINES = 80
MAX_REPRODUCE_MODULE_LINES = 500
# Modules every package may import: they import no other vitkit module but each other.
NEUTRAL = {"allocator", "cpu", "errors", "files", "precision", "preprocessing", "runtime"}


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    """The vitkit modules ``module`` imports, at any depth of its code (lazy imports included)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    modules = _modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "vitkit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "vitkit":
                for a in node.names:  # `from . import x` imports the module x when there is one, else a name of target
                    found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target)
    return {t for t in found if t in modules and t != module}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vitkit"


def test_no_library_module_imports_the_cli():
    offenders = [
        f"{m} imports {t}"
        for m, p in _modules().items()
        if _package(m) not in ("cli", "__main__")
        for t in _imports(m, p)
        if _package(t) == "cli"
    ]
    assert not offenders, offenders


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for m, p in _modules().items():
        for t in _imports(m, p):
            a, b = _package(m), _package(t)
            if a != b and "vitkit" not in (a, b):  # the root package only re-exports, lazily
                graph[a].add(b)
    for pkg in NEUTRAL:
        assert graph[pkg] <= NEUTRAL, f"vitkit.{pkg} must import only the other neutral modules: {graph[pkg]}"

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a in list(graph) for b in graph[a] if a in reach(b))
    assert not cycles, cycles


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected set of two or more modules, as one
    cycle through them (``a -> b -> ... -> a``), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while (w := stack.pop()) != v:
                group.add(w)
            if group:
                groups.append(group | {v})

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_cycle_through(graph, g) for g in groups)


def _cycle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """One cycle inside ``group`` (a strongly connected set), from its first module back to it."""
    start = min(group)
    paths, seen = {start: [start]}, {start}
    todo = [start]
    while todo:  # breadth first: the shortest way back to start
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return paths[v] + [start]
            if w not in seen:
                seen.add(w)
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_no_import_cycle_between_modules():
    """No module imports, at any depth of its code (lazy imports included), a module that imports
    it back through any chain. ``from . import x`` counts as importing the module ``x``: a package
    is always initialised before its modules, so that is no edge to the package's ``__init__``."""
    graph = {m: _imports(m, p) for m, p in _modules().items()}
    cycles = [" -> ".join(c) for c in _cycles(graph)]
    assert not cycles, cycles


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def test_no_reproduce_module_is_longer_than_the_limit():
    long = []
    for m, p in _modules().items():
        n = len(p.read_text().splitlines())
        if m.startswith("vitkit.reproduce") and n > MAX_REPRODUCE_MODULE_LINES:
            long.append(f"{m}: {n} lines")
    assert not long, long


def test_the_reproduce_core_imports_no_experiment():
    """``vitkit reproduce`` is an application on the library: its core (specs, results, runs, the
    report) never imports an experiment, and no experiment imports the application that gathers them."""
    offenders = []
    for m, p in _modules().items():
        for t in _imports(m, p):
            if m.startswith("vitkit.reproduce.core") and t.startswith(
                ("vitkit.reproduce.experiments", "vitkit.reproduce.app")
            ):
                offenders.append(f"{m} imports {t}")
            if m.startswith("vitkit.reproduce.experiments") and t == "vitkit.reproduce.app":
                offenders.append(f"{m} imports {t}")
    assert not offenders, offenders


def test_lower_layers_know_nothing_of_the_upper_ones():
    allowed = {
        "models": NEUTRAL,
        "data": NEUTRAL,
        "checkpoint": NEUTRAL | {"models"},
    }
    for m, p in _modules().items():
        pkg = _package(m)
        if pkg in allowed:
            bad = {_package(t) for t in _imports(m, p)} - allowed[pkg] - {pkg}
            assert not bad, f"{m} imports {sorted(bad)}"


def test_no_function_longer_than_the_limit():
    long = []
    for m, p in _modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if ast.get_docstring(node, clean=False) is not None:  # the limit is on code, not on its docs
                    doc = node.body[0]
                    n -= doc.end_lineno - doc.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{m}.{node.name}: {n} lines")
    assert not long, long


def _string_precision_parameters(source: str) -> list[str]:
    """The functions of ``source`` with a parameter named ``precision`` annotated as a plain ``str``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for a in args:
                if (
                    a.arg == "precision"
                    and a.annotation is not None
                    and ast.unparse(a.annotation) in ("str", "str | None")
                ):
                    found.append(node.name)
    return found


def test_precision_travels_as_a_precision_below_the_command_line():
    """Below the CLI a precision is a :class:`vitkit.precision.Precision` (or a name resolved once,
    on entry, by ``as_precision``/``serving_precision``), never a bare ``str`` parameter."""
    bare = [
        f"{m}.{name}"
        for m, p in _modules().items()
        if _package(m) != "cli"
        for name in _string_precision_parameters(p.read_text())
    ]
    assert not bare, bare


def test_the_precision_check_finds_a_string_parameter():
    assert _string_precision_parameters("def f(x, precision: str = 'fp32'):\n    pass\n") == ["f"]
    assert _string_precision_parameters("def f(x, precision: PrecisionLike = 'fp32'):\n    pass\n") == []


def test_help_starts_without_torch():
    code = "import sys; from vitkit.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: vitkit" in out and out.strip().endswith("False"), out


# json.loads recurses once per level of nesting: a file nested thousands deep raises a
# RecursionError, which a handler of ValueError does not catch.
_DEEP_JSON_CAUGHT_BY = {"RecursionError", "Exception", "BaseException"}


def _uncaught_json_loads(tree: ast.AST) -> list[int]:
    """Lines of ``json.loads``/``json.load`` calls not inside a ``try`` that catches RecursionError."""
    bad: list[int] = []

    def caught(handlers: list[ast.ExceptHandler]) -> bool:
        names = set()
        for h in handlers:
            kinds = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
            names.update(k.id if isinstance(k, ast.Name) else getattr(k, "attr", "") for k in kinds if k is not None)
            if h.type is None:
                return True
        return bool(names & _DEEP_JSON_CAUGHT_BY)

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Try):
            inner = guarded or caught(node.handlers)
            for child in node.body:
                visit(child, inner)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            guarded = False  # a function body runs where it is called, not where it is defined
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("loads", "load")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "json"
            and not guarded
        ):
            bad.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return bad


def test_every_json_parse_catches_deep_nesting():
    """Parsing outside input is bounded: every ``json.loads`` is guarded against a RecursionError
    (or goes through ``vitkit.checkpoint.values.loads``, which checks the depth first)."""
    bad = [
        f"{path.relative_to(SRC.parent)}:{line}"
        for path in _modules().values()
        for line in _uncaught_json_loads(ast.parse(path.read_text()))
    ]
    assert not bad, "json.loads without a handler of RecursionError: " + ", ".join(bad)


def test_the_json_check_finds_an_unguarded_parse():
    src = (
        "import json\ntry:\n    json.loads(t)\nexcept ValueError:\n    pass\n"
        "try:\n    json.loads(t)\nexcept (ValueError, RecursionError):\n    pass\n"
    )
    assert _uncaught_json_loads(ast.parse(src)) == [3]
