"""Evaluation of frozen models: classification metrics, few-shot linear, linear probe and kNN.

All of it runs the model through :func:`model_outputs` (the model's own preprocessing, no
augmentation) and returns plain dicts of numbers; the ``vitkit eval | fewshot | probe | predict``
commands (``vitkit.cli``) print them.
"""

from .classify import (
    class_order,
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
    served_model,
)
from .fewshot import (
    BIAS_CONSTANT,
    DEFAULT_L2,
    DEFAULT_L2_GRID,
    DEFAULT_SHOTS,
    RidgeEigen,
    evaluate_fewshot,
    fewshot_eval,
    fewshot_indices,
    fewshot_needed_indices,
    ridge_closed_form,
)
from .predict import class_names, predict, stored_class_names
from .probe import DEFAULT_WD_GRID, DEFAULT_WEIGHT_DECAY, evaluate_probe, knn_eval, linear_probe

__all__ = [
    "BIAS_CONSTANT",
    "DEFAULT_L2",
    "DEFAULT_L2_GRID",
    "DEFAULT_SHOTS",
    "DEFAULT_WD_GRID",
    "DEFAULT_WEIGHT_DECAY",
    "ModelOutputs",
    "RidgeEigen",
    "class_names",
    "class_order",
    "classification_metrics",
    "confusion_matrix",
    "evaluate",
    "evaluate_fewshot",
    "evaluate_probe",
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
    "predict",
    "ridge_closed_form",
    "served_model",
    "stored_class_names",
    "topk_accuracy",
    "topk_hits",
    "write_confusion_matrix",
]
