"""Kept for imports of its old place: :mod:`vitkit.allocator` holds :func:`keep_freed_memory`."""

from ..allocator import keep_freed_memory

__all__ = ["keep_freed_memory"]
