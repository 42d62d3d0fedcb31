"""Every public function and class of the package documents its arguments and what it returns
(Google style, as the API reference is generated from the docstrings), and the reference shows it.

Public means reachable through an ``__all__``: the package's, its subpackages', and any module's
that declares one. Each object is checked once, where it is defined, whatever the name it is
reached by; a public class brings its public methods and properties (its own and those of the
vitkit classes it derives from). A class documents what its constructor takes: a dataclass its
fields under ``Attributes:``, any other class the arguments of its ``__init__`` under ``Args:``.

The reference page (``docs/reference/api.md``) shows every name in the ``__all__`` of ``vitkit``
and of each of its packages and top-level modules that has one.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path

import pytest

import vitkit

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "api.md"

# Sections of a Google-style docstring as the reference reads them; other spellings of the same
# sections (and reST or NumPy fields) would render in another style.
SECTION = re.compile(r"^(\w[\w ]*):\s*$")
OTHER_STYLES = re.compile(
    r"^\s*(Arguments|Parameters|Params|Return|Yield|Raise|Keyword Args|Keyword Arguments):\s*$"
    r"|^\s*:(param|type|returns?|rtype|raises?)\b"
    r"|^\s*-{3,}\s*$",
    re.MULTILINE,
)


def _modules():
    """vitkit and every module under it, but the command line."""
    yield vitkit
    for info in pkgutil.walk_packages(vitkit.__path__, "vitkit."):
        if info.name.startswith("vitkit.cli") or info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def _own(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").partition(".")[0] == "vitkit"


def _exported() -> dict[str, object]:
    """Every function and class named by an ``__all__``, by where it is defined."""
    found: dict[str, object] = {}
    for module in _modules():
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and _own(obj):
                found.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return found


def _members(cls: type):
    """The public methods and properties of ``cls``, each at the vitkit class that defines it."""
    for klass in cls.__mro__:
        if not _own(klass):
            continue
        for attr, member in vars(klass).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                yield f"{klass.__module__}.{klass.__qualname__}.{attr}", member


def public_objects() -> dict[str, object]:
    """What the test checks: the exported functions and classes, and their classes' members."""
    objects = _exported()
    for cls in [obj for obj in objects.values() if inspect.isclass(obj)]:
        objects.update(_members(cls))
    return objects


def _sections(doc: str) -> dict[str, list[str]]:
    """The lines of each section of a Google-style docstring, by section name."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in doc.splitlines():
        match = SECTION.match(line)
        if match and not line.startswith(" "):
            current = sections.setdefault(match.group(1), [])
        elif current is not None:
            if line and not line.startswith(" "):
                current = None
            else:
                current.append(line)
    return sections


def _entries(lines: list[str]) -> set[str]:
    """The names an ``Args:`` or ``Attributes:`` section documents."""
    body = textwrap.dedent("\n".join(lines)).splitlines()
    return {m.group(1).lstrip("*") for line in body if (m := re.match(r"^(\*{0,2}\w+)(?: \([^)]*\))?:", line))}


def _raises(fn) -> bool:
    """Whether the body of ``fn`` raises an exception of its own (not a re-raise, not in a nested
    function)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    stack = list(tree.body[0].body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _constructor(cls: type) -> tuple[str, list[str]]:
    """The section a class documents its constructor in, and the names that section must list: a
    dataclass's fields under ``Attributes:``, the arguments of an ``__init__`` vitkit writes under
    ``Args:`` (none for a constructor inherited from elsewhere)."""
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple
        return "Attributes", list(cls._fields)
    init = next((vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k)), None)
    if not inspect.isfunction(init):
        return "Args", []
    names = list(inspect.signature(init).parameters)[1:]
    if dataclasses.is_dataclass(cls) and init.__code__.co_filename.startswith("<"):
        return "Attributes", names
    return "Args", names if _own(init) else []


def _docstring(obj) -> str:
    """The docstring ``obj`` was written with: none inherited from a base class, none that
    ``dataclass`` or ``NamedTuple`` makes up from the fields (the reference shows neither)."""
    doc = inspect.cleandoc((vars(obj).get("__doc__") if inspect.isclass(obj) else obj.__doc__) or "")
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(") and "\n" not in doc:
        return ""
    return doc


def missing(obj) -> list[str]:
    """What the docstring of ``obj`` lacks (empty if nothing)."""
    doc = _docstring(obj)
    if isinstance(obj, property):
        return [] if doc else ["no docstring"]
    if not doc:
        return ["no docstring"]
    problems = []
    if OTHER_STYLES.search(doc):
        problems.append("a section not in Google style")
    sections = _sections(doc)
    if inspect.isclass(obj):
        section, names = _constructor(obj)
        if names and section not in sections:
            problems.append(f"no {section}:")
        elif lacking := [n for n in names if n not in _entries(sections.get(section, []))]:
            problems.append(f"{section} lack {', '.join(lacking)}")
        return problems
    sig = inspect.signature(obj)
    params = [name for name in sig.parameters if name not in ("self", "cls")]
    if params:
        if "Args" not in sections:
            problems.append("no Args:")
        elif lacking := [p for p in params if p not in _entries(sections["Args"])]:
            problems.append(f"Args lack {', '.join(lacking)}")
    if sig.return_annotation not in (None, "None", inspect.Signature.empty) and not (
        "Returns" in sections or "Yields" in sections
    ):
        problems.append("no Returns:")
    if _raises(obj) and "Raises" not in sections:
        problems.append("no Raises:")
    return problems


def test_the_public_api_documents_its_arguments_and_results():
    problems = []
    for name, obj in sorted(public_objects().items()):
        if why := missing(obj):
            problems.append(f"{name}: {'; '.join(why)}")
    assert not problems, "\n".join(problems)


def _reference_modules() -> list[str]:
    """``vitkit`` and those of its packages and top-level modules that have an ``__all__``."""
    names = ["vitkit"]
    for info in pkgutil.iter_modules(vitkit.__path__, "vitkit."):
        if info.name not in ("vitkit.cli", "vitkit.__main__") and hasattr(
            importlib.import_module(info.name), "__all__"
        ):
            names.append(info.name)
    return names


def _directives(page: str) -> dict[str, list[str]]:
    """The objects a page renders (``::: path``), each with its option lines."""
    found: dict[str, list[str]] = {}
    current = None
    for line in page.splitlines():
        if line.startswith("::: "):
            current = found.setdefault(line[4:].strip(), [])
        elif current is not None and line.startswith(" "):
            current.append(line.strip())
        elif line.strip():
            current = None
    return found


def test_the_reference_shows_every_public_name():
    griffe = pytest.importorskip("griffe")
    package = griffe.load("vitkit", search_paths=[str(Path(vitkit.__file__).parents[1])])
    directives = _directives(API_PAGE.read_text())
    problems = []
    for name in _reference_modules():
        options = directives.get(name)
        if options is None:
            problems.append(f"{name}: docs/reference/api.md has no '::: {name}'")
            continue
        if any(line.startswith(("members:", "filters:")) for line in options):
            problems.append(f"{name}: '::: {name}' leaves out some of its members")
        module = package if name == "vitkit" else package[name.removeprefix("vitkit.")]
        for member in (runtime := importlib.import_module(name)).__all__:
            shown = module[member]
            obj = getattr(runtime, member)
            if shown.is_module and not inspect.ismodule(obj):
                # a function named as a submodule of its package: the page reads the name as the
                # submodule, so the function needs a directive of its own, by its full path
                full = f"{obj.__module__}.{obj.__qualname__}"
                if full not in directives:
                    problems.append(f"{name}.{member}: the page shows the submodule; add '::: {full}'")
                shown = package[full.removeprefix("vitkit.")]
            if not shown.docstring:  # mkdocstrings shows no object without one
                problems.append(f"{name}.{member}: no docstring the reference can show")
    assert not problems, "\n".join(problems)
