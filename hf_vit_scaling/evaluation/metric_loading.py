"""Evaluation with `evaluate` modules shipped inside the package (no Hub, no network): the training recipe's
`compute_metrics` (`ModuleComputeMetrics`), and what a medical result needs around them: a decision threshold chosen
on validation, bootstrap confidence intervals, ROC and reliability plots.

The modules live in `metric_modules/<name>/<name>.py` and wrap the formulas of `classification_metrics`;
`load_metric(name)` loads one by path, so `HF_HUB_OFFLINE=1` changes nothing.
"""

import os

from datasets import Sequence, Value

from hf_vit_scaling.errors import UserInputError

METRIC_MODULES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metric_modules")
SHIPPED_METRICS = (
    "accuracy",
    "balanced_accuracy",
    "confusion_matrix",
    "expected_calibration_error",
    "macro_f1",
    "per_class_accuracy",
    "roc_auc",
    "sensitivity_specificity",
    "top_k_accuracy",
)

# The input columns of the modules (datasets features): labels, per-class scores, or one positive-class score.
LABEL_INPUTS = {"predictions": Value("int64"), "references": Value("int64")}
SCORE_INPUTS = {"predictions": Sequence(Value("float64")), "references": Value("int64")}
BINARY_SCORE_INPUTS = {"prediction_scores": Value("float64"), "references": Value("int64")}
MULTICLASS_SCORE_INPUTS = {"prediction_scores": Sequence(Value("float64")), "references": Value("int64")}


def metric_info(description: str, inputs: dict):
    """The `evaluate.MetricInfo` of a shipped module (its docstring describes it and its inputs)."""
    import evaluate
    from datasets import Features

    return evaluate.MetricInfo(
        description=description,
        citation="hf-vit-scaling: hf_vit_scaling/evaluation/classification_metrics.py",
        inputs_description=description,
        features=Features(inputs),
    )


def load_metric(name: str, config_name: str | None = None):
    """A shipped `evaluate` module by name, loaded from its file (works offline); results are kept in memory."""
    if name not in SHIPPED_METRICS:
        raise UserInputError(f"metric {name!r} is not shipped. Fix: use one of {', '.join(SHIPPED_METRICS)}.")
    try:
        import evaluate
    except ImportError as err:
        raise UserInputError("metrics need the `evaluate` package. Fix: pip install evaluate.") from err
    return evaluate.load(os.path.join(METRIC_MODULES_DIR, name, f"{name}.py"), config_name, keep_in_memory=True)


# ---------------------------------------------------------------- decision threshold (chosen on validation)


# ---------------------------------------------------------------- bootstrap confidence intervals


# ---------------------------------------------------------------- the Trainer's compute_metrics through the modules


# ---------------------------------------------------------------- plots (matplotlib: the `plots` extra)
