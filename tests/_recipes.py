"""Shared by the training tests: a recipe tree with ``section__key=value`` changes."""

from __future__ import annotations

import copy
from typing import Any


def changed(tree: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``tree`` with each ``a__b__c=value`` set at ``tree[a][b][c]``."""
    out = copy.deepcopy(tree)
    for dotted, value in changes.items():
        node = out
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out
