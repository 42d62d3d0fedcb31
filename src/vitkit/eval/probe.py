"""Linear probe and k-nearest-neighbour accuracy of frozen features.

- Linear probe: multinomial logistic regression on features standardised with the training
  set's mean and standard deviation, trained full-batch with L-BFGS (strong-Wolfe line search).
  The objective is ``mean cross-entropy + weight_decay / 2 * ||W||^2`` (the bias is not
  decayed). One weight-decay value, or a grid chosen on a held-out 20% of the training features
  and then refit on all of them.
- kNN: cosine similarity (features scaled to unit length, not standardised), the ``k`` most
  similar training examples vote. ``weighting="distance"`` is the DINO protocol (Caron et al.,
  2021): each neighbour votes ``exp(similarity / temperature)`` with temperature 0.07;
  ``"majority"``: one vote each, ties to the lowest class index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.base import Dataset
from ..errors import UsageError
from .classify import topk_accuracy, topk_hits
from .features import extract_features

DEFAULT_WEIGHT_DECAY = 1e-4
"""The linear probe's weight decay when none is given."""
DEFAULT_WD_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
"""A grid of weight decays for the probe to choose from on held-out training features."""
DEFAULT_K = 20
DEFAULT_TEMPERATURE = 0.07

ArrayLike = np.ndarray | torch.Tensor | Sequence


def _tensor(a: ArrayLike, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not isinstance(a, torch.Tensor):
        a = torch.as_tensor(np.asarray(a))
    # .clone() turns tensors made under inference_mode into ordinary ones autograd may save.
    return a.detach().to(device=device, dtype=dtype).clone()


def _check(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor) -> None:
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"train features {tuple(train_x.shape)} and test features {tuple(test_x.shape)} differ")
    if train_y.shape != (train_x.shape[0],) or test_y.shape != (test_x.shape[0],):
        raise ValueError("one label per feature row is needed, for train and test alike")
    if train_x.shape[0] == 0 or test_x.shape[0] == 0:
        raise ValueError("need train and test features")


def _default_dtype(device: torch.device) -> torch.dtype:
    # float64 keeps L-BFGS's convergence tests meaningful; accelerators are much faster in float32.
    return torch.float64 if device.type == "cpu" else torch.float32


# ----------------------------------------------------------------------------------------------
# Linear probe


def _standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    mean = train.mean(dim=0)
    std = train.std(dim=0, unbiased=False) + 1e-6
    return [(t - mean) / std for t in (train, *others)]


def _fit_logreg(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, weight_decay: float, max_iter: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Full-batch L-BFGS on mean cross-entropy + weight_decay / 2 * ||W||^2. Returns W, b, iterations."""
    w = torch.zeros(x.shape[1], num_classes, dtype=x.dtype, device=x.device, requires_grad=True)
    b = torch.zeros(num_classes, dtype=x.dtype, device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-7,
        tolerance_change=1e-12,
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w + b, y) + 0.5 * weight_decay * w.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    iterations = int(opt.state[w].get("n_iter", 0))
    return w.detach(), b.detach(), iterations


def linear_probe(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    test_labels: ArrayLike,
    weight_decay: float | Sequence[float] = DEFAULT_WEIGHT_DECAY,
    num_classes: int | None = None,
    max_iter: int = 500,
    val_fraction: float = 0.2,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Train a logistic-regression probe on frozen features and score it on the test features.

    ``weight_decay``: one value, or several: then each is fitted on a random ``1 - val_fraction``
    of the training features (seeded), scored on the rest, and the best is refitted on all of
    them.

    Args:
        train_features: the features to fit on (N_train, F).
        train_labels: their labels (N_train,).
        test_features: the features to score (N_test, F).
        test_labels: their labels (N_test,).
        weight_decay: one value, or several to choose from, each >= 0.
        num_classes: the number of classes; None: the largest label plus one.
        max_iter: the most L-BFGS iterations of a fit.
        val_fraction: the share of the training features held out to choose the weight decay.
        seed: the seed of that hold-out.
        device: where the fits run (float64 on a CPU, float32 elsewhere).

    Returns:
        ``top1``, ``top5`` (None with fewer than 5 classes), ``train_accuracy``,
        ``weight_decay`` (the one used), ``grid`` (``{"weight_decay", "val_accuracy"}`` rows,
        empty for one value), ``iterations`` (L-BFGS iterations of the final fit),
        ``num_train``, ``num_test``, ``num_classes``. Accuracies are fractions in [0, 1].

    Raises:
        ValueError: features or labels that do not fit one another, no features, a negative
            weight decay, or a hold-out that leaves no feature on one side.
    """
    dev = torch.device(device)
    dtype = _default_dtype(dev)
    train_x, test_x = _tensor(train_features, dtype, dev), _tensor(test_features, dtype, dev)
    train_y, test_y = _tensor(train_labels, torch.int64, dev), _tensor(test_labels, torch.int64, dev)
    _check(train_x, train_y, test_x, test_y)
    k = num_classes if num_classes is not None else int(max(train_y.max(), test_y.max())) + 1
    wds = [float(weight_decay)] if isinstance(weight_decay, (int, float)) else [float(v) for v in weight_decay]
    if not wds or min(wds) < 0:
        raise ValueError(f"weight decay values must be >= 0, got {wds}")

    grid: list[dict[str, float]] = []
    chosen = wds[0]
    if len(wds) > 1:
        n = train_x.shape[0]
        n_val = round(n * val_fraction)
        if not 0 < n_val < n:
            raise ValueError(f"cannot hold out {val_fraction:.0%} of {n} training features for choosing weight decay")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(dev)
        val_idx, fit_idx = perm[:n_val], perm[n_val:]
        fx, vx = _standardise(train_x[fit_idx], train_x[val_idx])
        for wd in wds:
            w, b, _ = _fit_logreg(fx, train_y[fit_idx], k, wd, max_iter)
            acc = ((vx @ w + b).argmax(dim=1) == train_y[val_idx]).double().mean().item()
            grid.append({"weight_decay": wd, "val_accuracy": acc})
        chosen = max(grid, key=lambda r: r["val_accuracy"])["weight_decay"]

    tx, ex = _standardise(train_x, test_x)
    w, b, iterations = _fit_logreg(tx, train_y, k, chosen, max_iter)
    test_scores = ex @ w + b  # (N_test, K)
    return {
        "top1": topk_accuracy(test_scores, test_y, 1),
        "top5": topk_accuracy(test_scores, test_y, 5) if k >= 5 else None,
        "train_accuracy": ((tx @ w + b).argmax(dim=1) == train_y).double().mean().item(),
        "weight_decay": chosen,
        "grid": grid,
        "iterations": iterations,
        "num_train": int(train_x.shape[0]),
        "num_test": int(test_x.shape[0]),
        "num_classes": k,
    }


# ----------------------------------------------------------------------------------------------
# k nearest neighbours


def knn_eval(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    test_labels: ArrayLike,
    k: int = DEFAULT_K,
    weighting: Literal["distance", "majority"] = "distance",
    temperature: float = DEFAULT_TEMPERATURE,
    num_classes: int | None = None,
    batch_size: int = 1024,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """k-nearest-neighbour accuracy with cosine similarity (see the module doc for the votes).

    ``k`` is capped at the number of training features.

    Args:
        train_features: the neighbours' features (N_train, F).
        train_labels: their labels (N_train,).
        test_features: the features to classify (N_test, F).
        test_labels: their labels (N_test,).
        k: the neighbours that vote.
        weighting: "distance" (each votes ``exp(similarity / temperature)``) or "majority".
        temperature: the vote temperature of "distance".
        num_classes: the number of classes; None: the largest label plus one.
        batch_size: test features compared at once.
        device: where the comparisons run.

    Returns:
        ``top1``, ``top5`` (None with fewer than 5 classes; the classes ranked by their votes),
        ``k`` (the one used), ``weighting``, ``temperature`` (None for "majority"),
        ``num_train``, ``num_test``, ``num_classes``. Accuracies are fractions in [0, 1].

    Raises:
        ValueError: ``k`` below 1, an unknown weighting, a temperature that is not positive,
            or features and labels that do not fit one another.
    """
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    if weighting not in ("distance", "majority"):
        raise ValueError(f"weighting must be 'distance' or 'majority', got {weighting!r}")
    if weighting == "distance" and not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    dev = torch.device(device)
    train_x, test_x = _tensor(train_features, torch.float32, dev), _tensor(test_features, torch.float32, dev)
    train_y, test_y = _tensor(train_labels, torch.int64, dev), _tensor(test_labels, torch.int64, dev)
    _check(train_x, train_y, test_x, test_y)
    num_k = num_classes if num_classes is not None else int(max(train_y.max(), test_y.max())) + 1
    k = min(k, train_x.shape[0])
    train_x = F.normalize(train_x, dim=1)  # (N_train, F), unit rows
    top1 = top5 = 0
    for start in range(0, test_x.shape[0], batch_size):
        q = F.normalize(test_x[start : start + batch_size], dim=1)  # (B, F)
        y = test_y[start : start + batch_size]
        sim, idx = (q @ train_x.T).topk(k, dim=1)  # (B, k) cosine similarities, neighbour indices
        weights = (sim / temperature).exp() if weighting == "distance" else torch.ones_like(sim)
        votes = torch.zeros(q.shape[0], num_k, device=dev).scatter_add_(1, train_y[idx], weights)  # (B, K)
        top1 += topk_hits(votes, y, 1)
        if num_k >= 5:
            top5 += topk_hits(votes, y, 5)
    n = test_x.shape[0]
    return {
        "top1": top1 / n,
        "top5": top5 / n if num_k >= 5 else None,
        "k": k,
        "weighting": weighting,
        "temperature": temperature if weighting == "distance" else None,
        "num_train": int(train_x.shape[0]),
        "num_test": n,
        "num_classes": num_k,
    }


def evaluate_probe(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    weight_decay: float | Sequence[float] = DEFAULT_WEIGHT_DECAY,
    max_iter: int = 500,
    knn_k: int = DEFAULT_K,
    knn_weighting: Literal["distance", "majority"] = "distance",
    temperature: float = DEFAULT_TEMPERATURE,
    max_train: int | None = 10000,
    max_test: int | None = None,
    progress: Callable[[int], None] | None = None,
    **run: Any,
) -> dict[str, Any]:
    """A linear probe and a kNN classifier on ``model``'s frozen representation: pre-logits of
    ``train`` (a seeded random ``max_train`` of it) fit both, ``test`` scores them.

    ``run``: ``batch_size``, ``device``, ``precision``, ``img_size`` of
    :func:`vitkit.eval.extract_features`.

    Args:
        model: the model whose pre-logits are the features.
        train: the split that fits the probe and gives the neighbours.
        test: the split scored.
        weight_decay: the probe's weight decay, or several to choose from (:func:`linear_probe`).
        max_iter: the most L-BFGS iterations of a fit.
        knn_k: the neighbours that vote (:func:`knn_eval`).
        knn_weighting: "distance" or "majority".
        temperature: the vote temperature of "distance".
        max_train: embed a seeded random subset of this many training images; None: all.
        max_test: score a seeded random subset of this many test images; None: all.
        progress: called with the number of images of each finished batch.
        **run: how the model runs, as above.

    Returns:
        ``{"linear_probe": linear_probe(...), "knn": knn_eval(...), "num_features"}``.

    Raises:
        UsageError: ``knn_k`` below 1.
        ValueError: settings :func:`linear_probe` or :func:`knn_eval` refuse.
    """
    if knn_k < 1:
        raise UsageError(f"knn_k must be positive, got {knn_k}")
    train_x, train_y = extract_features(model, train, max_images=max_train, progress=progress, **run)
    test_x, test_y = extract_features(model, test, max_images=max_test, progress=progress, **run)
    return probe_features(
        train_x,
        train_y,
        test_x,
        test_y,
        train.num_classes,
        weight_decay=weight_decay,
        max_iter=max_iter,
        knn_k=knn_k,
        knn_weighting=knn_weighting,
        temperature=temperature,
        device=run.get("device", "cpu"),
    )


def probe_features(
    train_x: ArrayLike,
    train_y: ArrayLike,
    test_x: ArrayLike,
    test_y: ArrayLike,
    num_classes: int,
    weight_decay: float | Sequence[float] = DEFAULT_WEIGHT_DECAY,
    max_iter: int = 500,
    knn_k: int = DEFAULT_K,
    knn_weighting: Literal["distance", "majority"] = "distance",
    temperature: float = DEFAULT_TEMPERATURE,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """A linear probe and a kNN classifier on features computed already (by
    :func:`vitkit.eval.extract_features`, or read from an embeddings file).

    Args:
        train_x: (N_train, F) features to fit on.
        train_y: (N_train,) their labels, in ``[0, num_classes)``.
        test_x: (N_test, F) features to score.
        test_y: (N_test,) their labels.
        num_classes: the number of classes.
        weight_decay: one value, or several to choose from (see :func:`linear_probe`).
        max_iter: L-BFGS iterations of the probe.
        knn_k: neighbours that vote (see :func:`knn_eval`).
        knn_weighting: "distance" or "majority".
        temperature: the vote temperature of "distance".
        device: where both run.

    Returns:
        ``{"linear_probe": linear_probe(...), "knn": knn_eval(...), "num_features"}``.
    """
    if knn_k < 1:
        raise UsageError(f"knn_k must be positive, got {knn_k}")
    lin = linear_probe(
        train_x,
        train_y,
        test_x,
        test_y,
        weight_decay=weight_decay,
        num_classes=num_classes,
        max_iter=max_iter,
        device=device,
    )
    knn = knn_eval(
        train_x,
        train_y,
        test_x,
        test_y,
        k=knn_k,
        weighting=knn_weighting,
        temperature=temperature,
        num_classes=num_classes,
        device=device,
    )
    return {"linear_probe": lin, "knn": knn, "num_features": int(np.shape(train_x)[1])}
