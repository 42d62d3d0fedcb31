"""The experiments ``vitkit reproduce`` knows, by name: each experiment's module registers its class
here when it is imported (:mod:`vitkit.reproduce.experiments` imports them all); the core looks
them up without importing any."""

from __future__ import annotations

from ..names import EXPERIMENTS
from .experiment import Experiment

_REGISTERED: dict[str, type[Experiment]] = {}


def register(cls: type[Experiment]) -> type[Experiment]:
    """Add an experiment class under its ``name`` (a class decorator).

    Args:
        cls: the experiment; its ``name`` must be one of :data:`~vitkit.reproduce.EXPERIMENTS`.

    Returns:
        ``cls``, unchanged.

    Raises:
        ValueError: the name is not one of the experiments, or is taken by another class.
    """
    if cls.name not in EXPERIMENTS:
        raise ValueError(f"experiment {cls.name!r} is not one of {', '.join(EXPERIMENTS)} (vitkit/reproduce/names.py)")
    if _REGISTERED.get(cls.name, cls) is not cls:
        raise ValueError(f"experiment {cls.name!r} is registered twice: {_REGISTERED[cls.name]} and {cls}")
    _REGISTERED[cls.name] = cls
    return cls


def registered() -> dict[str, type[Experiment]]:
    """The registered experiment classes by name, in the order of :data:`~vitkit.reproduce.EXPERIMENTS`.

    Returns:
        A new dict (those not registered are absent).
    """
    return {name: _REGISTERED[name] for name in EXPERIMENTS if name in _REGISTERED}
