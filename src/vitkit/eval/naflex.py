"""NaFlex batches from a source: images kept at their own aspect ratio, as the model takes them.

A decoding source (an image folder, a labels file) decodes each image straight to its grid's size
(:meth:`~vitkit.data.streaming.StreamingDataset.with_naflex`); a source of arrays (the built-in
datasets) gives square batches, each image of which is resized to its grid here. Either way the
transform of the run (evaluation's crop and normalisation, training's augmentation) is applied to
each image at its own size before it is cut into patches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..data.base import Dataset
from ..errors import UsageError
from ..models.naflex import NaflexBatch, collate
from ..preprocessing import fit_grid

# (uint8 image (1, C, h, w) on the device, (H, W) wanted) -> float (1, C, H, W) in the model's range
PerImage = Callable[[torch.Tensor, tuple[int, int]], torch.Tensor]


def naflex_source(dataset: Dataset, patch: int, max_tokens: int) -> Dataset:
    """``dataset`` decoding its images at their own aspect ratio where it decodes files.

    Args:
        dataset: the source.
        patch: the model's patch side in pixels.
        max_tokens: the most patches an image may have.

    Returns:
        A copy that decodes each image to its grid (a decoding source), else ``dataset`` itself.

    Raises:
        UsageError: ``max_tokens`` below 1.
    """
    if max_tokens < 1:
        raise UsageError(f"data.naflex.max_tokens must be at least 1 (one patch), got {max_tokens}")
    with_naflex = getattr(dataset, "with_naflex", None)
    return with_naflex(patch, max_tokens) if with_naflex is not None else dataset


def to_naflex(
    images: torch.Tensor | Sequence[torch.Tensor], patch: int, max_tokens: int, per_image: PerImage
) -> NaflexBatch:
    """A batch as a source gives it -> a :class:`NaflexBatch` of transformed images.

    Args:
        images: a list of uint8 (C, H, W) images already at their grids' sizes (a source from
            :func:`naflex_source`; one over ``max_tokens`` is fitted to it), or a uint8 batch
            (B, C, H, W) whose images are each resized to the grid their aspect ratio gets.
        patch: the model's patch side in pixels.
        max_tokens: the most patches an image may have.
        per_image: the transform of one image to a given size (see ``PerImage``).

    Returns:
        The batch, its patches float32 on the images' device.
    """
    fitted = not isinstance(images, torch.Tensor)
    out = []
    for im in images:
        h, w = im.shape[-2:]
        rows, cols = h // patch, w // patch
        if not fitted or rows * cols > max_tokens:  # a square batch, or a smaller budget than the source's
            rows, cols = fit_grid(h, w, patch, max_tokens)
        out.append(per_image(im[None], (rows * patch, cols * patch))[0])
    return collate(out, patch, max_tokens, fitted=True)


__all__ = ["PerImage", "naflex_source", "to_naflex"]
