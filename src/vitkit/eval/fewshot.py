"""Few-shot linear evaluation: closed-form regularised least squares on frozen features.

The paper (section 4.1, "few-shot accuracies") freezes the network, takes the pre-logits of
``shots`` training images per class and solves a regularised least-squares regression from them
to {-1, 1}^K targets in closed form; the test accuracy is that of the argmax. This module follows
big_vision's ``evaluators/fewshot_lsr.py`` step for step, so that the same features give the same
numbers:

1. sampling: for each seed, ``numpy.random.default_rng(seed)`` permutes the indices of every
   class; a ``shots``-shot sample takes the first ``shots`` of each permutation (so the samples
   of one seed are nested across shot counts; a class with fewer images gives all it has);
2. whitening: features minus the sample's mean, divided by the sample's standard deviation
   (population, ``ddof=0``) plus 1e-5;
3. bias: a constant column of value 100 is appended. Like big_vision this is plain ridge on the
   augmented matrix: the bias weight *is* regularised, but because its feature is 100 its
   effective penalty is ``l2 / 100**2`` (0.1 at the default l2 of 1024), almost none;
4. targets ``2 * one_hot(y) - 1``; weights ``W = (X^T X + l2 I)^{-1} X^T Y`` for the default
   ``l2 = 1024`` (big_vision's ``fewshot`` default, 2**10) or a grid of values.

For a grid, one eigendecomposition per (shots, seed) serves every l2: with
``X^T X = Q diag(e) Q^T``, ``W = Q diag(1 / (e + l2)) Q^T X^T Y``. When the sample has fewer
rows than columns the same is done with ``X X^T`` (``W = X^T Q diag(1 / (e + l2)) Q^T Y``), the
identical solution from a smaller matrix. Everything is numpy float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.base import ArrayDataset, Dataset
from .features import extract_features

BIAS_CONSTANT = 100.0
"""The value of the constant column appended to the whitened features, as big_vision's."""
DEFAULT_L2 = 1024.0
"""The default regulariser of the least squares (big_vision's ``fewshot`` default, 2**10)."""
DEFAULT_L2_GRID = tuple(float(2**p) for p in range(0, 21, 2))  # 1 ... 2**20
"""A grid of regularisers to search: 1, 4, 16 ... 2**20."""
DEFAULT_SHOTS = (1, 5, 10, 25)
"""The shot counts (training images per class) scored by default, as the paper's."""
WHITEN_EPS = 1e-5

ArrayLike = np.ndarray | torch.Tensor | Sequence


def _numpy(a: ArrayLike, dtype: Any = None) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=dtype)


@dataclass
class RidgeEigen:
    """Regularised least squares for many l2 values from one eigendecomposition.

    ``fit(X, Y)`` decomposes ``X^T X`` (or ``X X^T`` when X has fewer rows than columns);
    ``solve(l2)`` is then ``(X^T X + l2 I)^{-1} X^T Y`` for any ``l2 > 0``, at the cost of one
    (D, r) x (r, C) product.

    Attributes:
        eigs: the eigenvalues (r,).
        lhs: the factor left of the scaling (D, r).
        rhs: the factor right of it (r, C).
    """

    eigs: np.ndarray  # (r,)
    lhs: np.ndarray  # (D, r)
    rhs: np.ndarray  # (r, C)

    @classmethod
    def fit(cls, X: ArrayLike, Y: ArrayLike) -> RidgeEigen:
        """Decompose the problem of inputs ``X`` and targets ``Y``, once for every l2.

        Args:
            X: the inputs (N, D).
            Y: the targets (N, C), or (N,) for one column.

        Returns:
            The decomposition, float64.

        Raises:
            ValueError: ``X`` not 2-D, or a number of rows of ``Y`` other than ``X``'s.
        """
        X = _numpy(X, np.float64)
        Y = _numpy(Y, np.float64)
        if Y.ndim == 1:
            Y = Y[:, None]
        if X.ndim != 2 or Y.shape[0] != X.shape[0]:
            raise ValueError(f"expected X (N, D) and Y (N, C), got {X.shape} and {Y.shape}")
        n, d = X.shape
        if n >= d:
            eigs, q = np.linalg.eigh(X.T @ X)  # (D,), (D, D)
            return cls(eigs, q, q.T @ (X.T @ Y))
        eigs, q = np.linalg.eigh(X @ X.T)  # (N,), (N, N)
        return cls(eigs, X.T @ q, q.T @ Y)

    def solve(self, l2: float) -> np.ndarray:
        """Weights (D, C) for the regulariser ``l2`` (> 0).

        Args:
            l2: the regulariser.

        Returns:
            The weights (D, C), float64.

        Raises:
            ValueError: ``l2`` is not positive.
        """
        if not l2 > 0:
            raise ValueError(f"l2 must be positive, got {l2}")
        return (self.lhs / (self.eigs + l2)) @ self.rhs


def ridge_closed_form(X: ArrayLike, Y: ArrayLike, l2: float) -> np.ndarray:
    """``argmin_W ||X W - Y||^2 + l2 ||W||^2`` in closed form, float64 (D, C).

    Every column of X is regularised alike (plain ridge; add a constant column yourself for a
    bias). Equal to ``numpy.linalg.lstsq`` on ``[X; sqrt(l2) I]`` and ``[Y; 0]``.

    Args:
        X: the inputs (N, D).
        Y: the targets (N, C), or (N,) for one column.
        l2: the regulariser, positive.

    Returns:
        W (D, C), float64.

    Raises:
        ValueError: shapes that do not match, or an ``l2`` that is not positive.
    """
    return RidgeEigen.fit(X, Y).solve(l2)


def fewshot_indices(
    labels: ArrayLike, shots: Sequence[int], seed: int, num_classes: int | None = None
) -> dict[int, np.ndarray]:
    """Indices into ``labels`` of the ``shots``-per-class sample of ``seed``, for each shot count.

    big_vision's scheme: one seeded permutation per class, of which each shot count takes the
    first ``shots`` (nested samples; a class with fewer images gives all it has).

    Args:
        labels: the class of every training example (N,).
        shots: the shot counts (examples per class).
        seed: the sample's seed.
        num_classes: the number of classes; None: the largest label plus one.

    Returns:
        For each shot count, the indices (int64) of its sample, class by class.
    """
    labels = _numpy(labels).astype(np.int64)
    k = int(labels.max()) + 1 if num_classes is None else num_classes
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(k)]
    return {int(s): np.concatenate([p[:s] for p in per_class]) for s in shots}


def fewshot_needed_indices(
    labels: ArrayLike, shots: Sequence[int], seeds: int | Sequence[int] = 3, num_classes: int | None = None
) -> np.ndarray:
    """Sorted indices of every training example some (shots, seed) sample uses.

    With labels known in advance, only these need embedding: pass their features to
    :func:`fewshot_eval` with ``train_rows`` set to this array.

    Args:
        labels: the class of every training example (N,).
        shots: the shot counts; the largest decides (the samples are nested).
        seeds: a count (seeds 0 .. n-1) or explicit seeds.
        num_classes: the number of classes; None: the largest label plus one.

    Returns:
        The indices, sorted and unique, int64.
    """
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    top = [max(int(s) for s in shots)]
    parts = [fewshot_indices(labels, top, seed, num_classes)[top[0]] for seed in seed_list]
    return np.unique(np.concatenate(parts))


def _targets(y: np.ndarray, num_classes: int) -> np.ndarray:
    t = -np.ones((y.shape[0], num_classes))
    t[np.arange(y.shape[0]), y] = 1.0
    return t  # (N, K) in {-1, 1}


def _fit_sample(
    x: np.ndarray, y: np.ndarray, num_classes: int, bias: float
) -> tuple[RidgeEigen, np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    std = x.std(axis=0) + WHITEN_EPS
    xa = np.concatenate([(x - mean) / std, np.full((x.shape[0], 1), bias)], axis=1)  # (n, D+1)
    return RidgeEigen.fit(xa, _targets(y, num_classes)), mean, std


def _predict(test_x: np.ndarray, w: np.ndarray, mean: np.ndarray, std: np.ndarray, bias: float) -> np.ndarray:
    # Whitening folded into the weights, so the test set is never copied per sample:
    # ((x - m) / s) @ W[:D] + bias * W[D]  ==  x @ (W[:D] / s) + (bias * W[D] - (m / s) @ W[:D])
    wx = w[:-1] / std[:, None]  # (D, K)
    b = bias * w[-1] - (mean / std) @ w[:-1]  # (K,)
    return (test_x @ wx + b).argmax(axis=1)


def fewshot_eval(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    test_labels: ArrayLike,
    shots: Sequence[int] = DEFAULT_SHOTS,
    seeds: int | Sequence[int] = 3,
    l2: float | Sequence[float] = DEFAULT_L2,
    num_classes: int | None = None,
    train_rows: ArrayLike | None = None,
    bias_constant: float = BIAS_CONSTANT,
) -> dict[str, Any]:
    """Few-shot linear accuracy for every shot count, seed and l2 value (see the module doc).

    ``seeds``: a count (seeds 0 .. n-1, as big_vision) or explicit seeds. ``l2``: one value or a
    grid; a grid shares one eigendecomposition per (shots, seed). ``train_rows``: when only some
    training examples were embedded, their indices into ``train_labels`` (one per feature row);
    see :func:`fewshot_needed_indices`.

    Args:
        train_features: the training examples' features (N, F), or those of ``train_rows``.
        train_labels: the class of every training example (N,).
        test_features: the test features (M, F).
        test_labels: their classes (M,).
        shots: the shot counts (examples per class).
        seeds: a count (seeds 0 .. n-1) or explicit seeds.
        l2: one regulariser or a grid of them, positive.
        num_classes: the number of classes; None: the largest label plus one.
        train_rows: the index into ``train_labels`` of each row of ``train_features``; None:
            one row per training example.
        bias_constant: the value of the constant column appended to the whitened features.

    Returns:
        ``{"shots", "seeds", "l2", "num_classes", "results", "best"}``: ``results`` is a list
        of ``{"shots", "l2", "mean", "std", "per_seed", "train_examples"}`` (accuracies in [0, 1];
        ``std`` over seeds with ``ddof=1``, 0 for one seed); ``best`` (only for a grid) holds, per
        shot count, the row of the l2 with the highest mean, a choice made on the test features
        and so optimistic.

    Raises:
        ValueError: features that are empty or not (N, F) alike, labels or ``train_rows`` that
            do not fit them, a shot count or l2 that is not positive, no seed, or a sampled
            example missing from ``train_rows``.
    """
    train_x = _numpy(train_features, np.float64)
    train_y = _numpy(train_labels).astype(np.int64)
    test_x = _numpy(test_features, np.float64)
    test_y = _numpy(test_labels).astype(np.int64)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"train features {train_x.shape} and test features {test_x.shape} must be (N, F) alike")
    if train_x.shape[0] == 0 or test_x.shape[0] == 0:
        raise ValueError("few-shot evaluation needs train and test features")
    if test_y.shape != (test_x.shape[0],):
        raise ValueError(f"{test_y.shape[0]} test labels for {test_x.shape[0]} test features")
    k = num_classes if num_classes is not None else int(max(train_y.max(), test_y.max())) + 1
    shot_list, seed_list, l2s = _settings(shots, seeds, l2)
    rows_of = _row_lookup(train_x, train_y, train_rows)

    acc = np.zeros((len(shot_list), len(seed_list), len(l2s)))
    sizes: dict[int, int] = {}
    for j, seed in enumerate(seed_list):
        samples = fewshot_indices(train_y, shot_list, seed, k)
        for i, s in enumerate(shot_list):
            idx = samples[s]
            sizes[s] = int(idx.size)
            solver, mean, std = _fit_sample(rows_of(idx), train_y[idx], k, bias_constant)
            for m, reg in enumerate(l2s):
                pred = _predict(test_x, solver.solve(reg), mean, std, bias_constant)
                acc[i, j, m] = float((pred == test_y).mean())
    results, best = _summarise(acc, shot_list, l2s, sizes)
    return {"shots": shot_list, "seeds": seed_list, "l2": l2s, "num_classes": k, "results": results, "best": best}


def _settings(
    shots: Sequence[int], seeds: int | Sequence[int], l2: float | Sequence[float]
) -> tuple[list[int], list[int], list[float]]:
    """The shot counts, seeds and l2 values as lists, checked."""
    shot_list = [int(s) for s in shots]
    if not shot_list or min(shot_list) < 1:
        raise ValueError(f"shots must be positive integers, got {list(shots)}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise ValueError("need at least one seed")
    l2s = [float(l2)] if isinstance(l2, (int, float)) else [float(v) for v in l2]
    if not l2s or min(l2s) <= 0:
        raise ValueError(f"l2 values must be positive, got {l2s}")
    return shot_list, seed_list, l2s


def _row_lookup(
    train_x: np.ndarray, train_y: np.ndarray, train_rows: ArrayLike | None
) -> Callable[[np.ndarray], np.ndarray]:
    """A function from training-example indices to their feature rows; with ``train_rows``, the
    features hold only the embedded examples, in that order."""
    if train_rows is None:
        if train_y.shape != (train_x.shape[0],):
            raise ValueError(f"{train_y.shape[0]} train labels for {train_x.shape[0]} train features")
        return lambda idx: train_x[idx]
    rows = _numpy(train_rows).astype(np.int64)
    if rows.shape != (train_x.shape[0],):
        raise ValueError(f"{rows.shape[0]} train_rows for {train_x.shape[0]} train features")
    row_order = np.argsort(rows, kind="stable")
    sorted_rows = rows[row_order]

    def rows_of(idx: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(sorted_rows, idx).clip(max=len(sorted_rows) - 1)
        missing = idx[sorted_rows[pos] != idx]
        if missing.size:
            raise ValueError(f"train example {int(missing[0])} is sampled but was not embedded (see train_rows)")
        return train_x[row_order[pos]]

    return rows_of


def _summarise(
    acc: np.ndarray, shot_list: list[int], l2s: list[float], sizes: dict[int, int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Accuracies (shots, seeds, l2) -> result rows (mean, std over seeds) and the best l2 per shot count."""
    results = []
    for i, s in enumerate(shot_list):
        for m, reg in enumerate(l2s):
            per_seed = acc[i, :, m]
            results.append(
                {
                    "shots": s,
                    "l2": reg,
                    "mean": float(per_seed.mean()),
                    "std": float(per_seed.std(ddof=1)) if acc.shape[1] > 1 else 0.0,
                    "per_seed": [float(a) for a in per_seed],
                    "train_examples": sizes[s],
                }
            )
    best = []
    if len(l2s) > 1:
        for s in shot_list:
            rows_s = [r for r in results if r["shots"] == s]
            best.append(max(rows_s, key=lambda r: r["mean"]))
    return results, best


def evaluate_fewshot(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    shots: Sequence[int] = DEFAULT_SHOTS,
    seeds: int | Sequence[int] = 3,
    l2: float | Sequence[float] = DEFAULT_L2,
    max_train: int | None = None,
    max_test: int | None = None,
    progress: Callable[[int], None] | None = None,
    **run: Any,
) -> dict[str, Any]:
    """Few-shot linear accuracy of ``model``'s representation: pre-logits of ``train`` (the
    examples to sample from) and ``test`` (scored), then :func:`fewshot_eval`.

    An in-memory ``train`` split (its labels known in advance) embeds only the examples some
    (shots, seed) sample uses. ``run``: ``batch_size``, ``device``, ``precision``, ``img_size``
    of :func:`vitkit.eval.extract_features`.

    Args:
        model: the model whose pre-logits are the features.
        train: the split to sample the training examples from.
        test: the split scored.
        shots: the shot counts (examples per class).
        seeds: a count (seeds 0 .. n-1) or explicit seeds.
        l2: one regulariser or a grid of them.
        max_train: embed a seeded random subset of this many training images to sample from;
            None: all of them (of an in-memory split, only those the samples use).
        max_test: score a seeded random subset of this many test images; None: all.
        progress: called with the number of images of each finished batch.
        **run: how the model runs, as above.

    Returns:
        :func:`fewshot_eval`'s dict plus ``num_features`` and ``num_test``.

    Raises:
        ValueError: settings :func:`fewshot_eval` refuses.
    """
    k = train.num_classes
    if isinstance(train, ArrayDataset) and max_train is None:
        rows = fewshot_needed_indices(train.labels, shots, seeds, k)
        train_x, _ = extract_features(model, train.subset(torch.as_tensor(rows)), progress=progress, **run)
        train_y = train.labels
    else:
        rows = None
        train_x, train_y = extract_features(model, train, max_images=max_train, progress=progress, **run)
    test_x, test_y = extract_features(model, test, max_images=max_test, progress=progress, **run)
    res = fewshot_eval(train_x, train_y, test_x, test_y, shots, seeds, l2, num_classes=k, train_rows=rows)
    return {**res, "num_features": int(train_x.shape[1]), "num_test": int(test_x.shape[0])}
