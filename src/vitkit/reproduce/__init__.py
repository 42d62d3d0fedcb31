"""``vitkit reproduce``: the paper's findings, measured on the machine at hand by one call.

:func:`reproduce` plans the runs of the chosen experiments (:mod:`.core.spec`), trains and scores
those not yet finished (:mod:`.core.runner`), and writes ``report.md``, ``report.json`` and the
figures (:mod:`.core.report`) for every experiment whose runs are all finished. The core never
imports an experiment; the experiments (:mod:`.experiments`) register themselves with it, and
:mod:`.app` puts the two together.
"""

from __future__ import annotations

import importlib
from typing import Any

from .names import BUDGETS, EXPERIMENTS

__all__ = ["ASSUMED_GPU_FLOPS", "BUDGETS", "EXPERIMENTS", "plan", "reproduce"]


def __getattr__(name: str) -> Any:
    # The application imports torch; loaded on first use, so that `vitkit --help` (which lists
    # EXPERIMENTS and BUDGETS) starts without it.
    if name.startswith("__") or name == "app":
        raise AttributeError(name)
    app = importlib.import_module(f"{__name__}.app")
    try:
        return getattr(app, name)
    except AttributeError:
        raise AttributeError(f"module 'vitkit.reproduce' has no attribute {name!r}") from None
