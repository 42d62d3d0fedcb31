"""The paper's experiments, one module each (with its figures and, where long, its numbers or its
prose beside it). Importing this package registers every experiment with the core
(:func:`vitkit.reproduce.core.registry.register`), in the order of
:data:`~vitkit.reproduce.EXPERIMENTS`."""

from . import attention, compute, data_scaling, pooling, pos_embed, resolution

__all__ = ["attention", "compute", "data_scaling", "pooling", "pos_embed", "resolution"]
