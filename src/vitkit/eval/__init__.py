"""Evaluation of frozen models: classification metrics, few-shot linear, linear probe and kNN.

All of it runs the model through :func:`model_outputs` (the model's own preprocessing, no
augmentation) and returns plain dicts of numbers; the ``vitkit eval | fewshot | probe | predict``
commands (``vitkit.eval.cli``) print them.
"""

from .classify import (
    classification_metrics,
    confusion_matrix,
    evaluate,
    topk_accuracy,
    topk_hits,
    write_confusion_matrix,
)
from .features import (
    ModelOutputs,
    extract_features,
    match_channels,
    model_inputs,
    model_outputs,
    model_preprocessing,
)
from .fewshot import (
    BIAS_CONSTANT,
    DEFAULT_L2,
    DEFAULT_L2_GRID,
    DEFAULT_SHOTS,
    RidgeEigen,
    fewshot_eval,
    fewshot_indices,
    fewshot_needed_indices,
    ridge_closed_form,
)
from .probe import DEFAULT_WD_GRID, DEFAULT_WEIGHT_DECAY, knn_eval, linear_probe

__all__ = [
    "BIAS_CONSTANT",
    "DEFAULT_L2",
    "DEFAULT_L2_GRID",
    "DEFAULT_SHOTS",
    "DEFAULT_WD_GRID",
    "DEFAULT_WEIGHT_DECAY",
    "ModelOutputs",
    "RidgeEigen",
    "classification_metrics",
    "confusion_matrix",
    "evaluate",
    "extract_features",
    "fewshot_eval",
    "fewshot_indices",
    "fewshot_needed_indices",
    "knn_eval",
    "linear_probe",
    "match_channels",
    "model_inputs",
    "model_outputs",
    "model_preprocessing",
    "ridge_closed_form",
    "topk_accuracy",
    "topk_hits",
    "write_confusion_matrix",
]
