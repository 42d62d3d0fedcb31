"""``vitkit reproduce``: the paper's findings, measured on the machine at hand by one call.

:func:`reproduce` plans the runs of the chosen experiments (:mod:`.core.spec`), trains and scores
those not yet finished (:mod:`.core.runner`), and writes ``report.md``, ``report.json`` and the
figures (:mod:`.core.report`) for every experiment whose runs are all finished. The core never
imports an experiment; the experiments (:mod:`.experiments`) register themselves with it, and
:mod:`.app` puts the two together.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .names import BUDGETS, EXPERIMENTS

# The application imports torch: its names load it on first use, so that `vitkit --help` (which
# lists EXPERIMENTS and BUDGETS) starts without it.
_LAZY = {
    "ASSUMED_GPU_FLOPS": "vitkit.reproduce.app",
    "plan": "vitkit.reproduce.app",
    "reproduce": "vitkit.reproduce.app",
}

if TYPE_CHECKING:
    from .app import ASSUMED_GPU_FLOPS, plan, reproduce  # noqa: F401

__all__ = ["BUDGETS", "EXPERIMENTS", "plan", "reproduce"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitkit.reproduce' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
