"""The process-wide settings CPU training runs under, made in one place before a run starts.

- Denormals flushed to zero: Adam's second moments of tiny gradients underflow into denormal
  floats, which x86 cores compute on in a slow microcode path; flushing them changes no result
  that matters.
- Freed memory kept mapped (:func:`vitkit.train.allocator.keep_freed_memory`): otherwise glibc
  hands every step's activations back to the kernel and faults them in again, page by page.

``benchmarks/RESULTS.md`` has what each is worth. Both are process properties: they stay set
after the run, and every model trained in the process shares them.
"""

from __future__ import annotations

import torch

from ..allocator import keep_freed_memory


def configure_process(device: torch.device) -> dict[str, bool]:
    """Make the settings for training on ``device`` (nothing on accelerators); returns which took effect.

    Args:
        device: the device the run trains on; only a CPU gets the settings.

    Returns:
        ``{"flush_denormal": ..., "keep_freed_memory": ...}``: whether each setting took effect.
    """
    if device.type != "cpu":
        return {"flush_denormal": False, "keep_freed_memory": False}
    return {"flush_denormal": torch.set_flush_denormal(True), "keep_freed_memory": keep_freed_memory()}
