from __future__ import annotations

import numpy as np
import pytest
import torch

from vitkit.models import resample_pos_embed, sincos_2d_pos_embed


def test_bilinear_equals_scipy_zoom_order1():
    scipy_ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(0)
    pe = rng.normal(size=(1, 1 + 5 * 7, 8)).astype(np.float32)
    out = resample_pos_embed(torch.from_numpy(pe), (9, 4), old_grid=(5, 7)).numpy()
    grid = pe[0, 1:].reshape(5, 7, 8)
    ref = scipy_ndimage.zoom(grid.astype(np.float64), (9 / 5, 4 / 7, 1), order=1)
    np.testing.assert_allclose(out[0, 1:].reshape(9, 4, 8), ref, atol=1e-6)
    np.testing.assert_array_equal(out[0, 0], pe[0, 0])


def test_same_grid_is_identity():
    pe = torch.randn(1, 17, 4)
    assert resample_pos_embed(pe, (4, 4)) is pe


def test_non_square_needs_old_grid():
    with pytest.raises(ValueError, match="not a square"):
        resample_pos_embed(torch.randn(1, 1 + 6, 4), (3, 3))


def test_sincos_is_separable_and_bounded():
    pe = sincos_2d_pos_embed((3, 5), 16)
    assert pe.shape == (15, 16) and pe.abs().max() <= 1
    grid = pe.reshape(3, 5, 16)
    # first half encodes the column (x), second half the row (y)
    torch.testing.assert_close(grid[0, :, :8], grid[2, :, :8])
    torch.testing.assert_close(grid[:, 0, 8:], grid[:, 4, 8:])
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_pos_embed((2, 2), 6)
