"""Every public function and class of the package documents its arguments and what it returns
(Google style, as the API reference is generated from the docstrings)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import vitkit


def _public_objects():
    for info in pkgutil.walk_packages(vitkit.__path__, "vitkit."):
        if ".cli" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if obj is None or getattr(obj, "__module__", None) != module.__name__:
                continue  # re-exported: checked where it is defined
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if inspect.isfunction(member) and not attr.startswith("_"):
                        yield f"{module.__name__}.{name}.{attr}", member


def _missing(obj) -> str | None:
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        return None if doc else "no docstring"
    if not inspect.isfunction(obj):
        return None
    sig = inspect.signature(obj)
    if any(p not in ("self", "cls") for p in sig.parameters) and "Args:" not in doc:
        return "no Args:"
    if sig.return_annotation not in (None, "None", inspect.Signature.empty) and not (
        "Returns:" in doc or "Yields:" in doc
    ):
        return "no Returns:"
    return None


def test_the_public_api_documents_its_arguments_and_results():
    problems = [f"{name}: {why}" for name, obj in _public_objects() if (why := _missing(obj))]
    assert not problems, "\n".join(problems)
