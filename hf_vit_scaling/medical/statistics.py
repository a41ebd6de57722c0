"""Statistics of a binary (tumour yes/no) evaluation: the decision threshold (Youden's J, or a minimum
sensitivity), bootstrap confidence intervals, and the report of AUROC, sensitivity, specificity and calibration."""

from collections import defaultdict

import numpy as np

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import load_metric

THRESHOLD_RULES = ("youden", "sensitivity")


# What `binary_report` gives, each with a bootstrap interval.
BINARY_REPORT_METRICS = (
    "roc_auc",
    "sensitivity",
    "specificity",
    "balanced_accuracy",
    "accuracy",
    "expected_calibration_error",
)


def choose_threshold(references, scores, rule: str = "youden", min_sensitivity: float = 0.95) -> dict:
    """The decision threshold (positive when score >= threshold) picked on validation predictions.

    youden: maximise Youden's J = sensitivity + specificity - 1 (Youden 1950) over every distinct score; among equal
    J the lowest threshold, i.e. the most sensitive (a missed tumour costs more than a false alarm).
    sensitivity: the highest threshold whose sensitivity is >= `min_sensitivity` (the most specific such one).
    """
    if rule not in THRESHOLD_RULES:
        raise UserInputError(f"threshold rule {rule!r} is unknown. Fix: use one of {', '.join(THRESHOLD_RULES)}.")
    if rule == "sensitivity" and not 0 < min_sensitivity <= 1:
        raise UserInputError(f"minimum sensitivity {min_sensitivity} must be in (0, 1]. Fix: e.g. 0.95.")
    fpr, tpr, thresholds = cm.roc_points(references, scores)
    finite = np.isfinite(thresholds)  # the first point (+inf) predicts nothing positive
    fpr, tpr, thresholds = fpr[finite], tpr[finite], thresholds[finite]
    if rule == "youden":
        j = tpr - fpr
        best = np.flatnonzero(j == j.max())[-1]  # thresholds decrease along the curve: the last is the lowest
    else:
        reaching = np.flatnonzero(tpr >= min_sensitivity)
        best = reaching[0]  # the first (highest) threshold that reaches the target
    return {
        "threshold": float(thresholds[best]),
        "rule": rule if rule == "youden" else f"sensitivity >= {min_sensitivity:g}",
        "validation_sensitivity": float(tpr[best]),
        "validation_specificity": float(1 - fpr[best]),
    }


def bootstrap_ci(
    statistic, references, scores, groups=None, n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> dict:
    """Percentile bootstrap interval (Efron & Tibshirani 1993, ch. 13) of `statistic(references, scores)`.

    Resampling is stratified by label, as pROC's default for AUROC (Robin et al. 2011): every resample keeps each
    label's count of units, so AUROC, sensitivity and specificity are always defined. With `groups` (duplicate groups
    or patients) the units are whole groups (a cluster bootstrap; Field & Welsh 2007): near-duplicate images are not
    independent, and resampling them one by one would give intervals that are too narrow. A group counts toward its
    most frequent label. The same seed gives the same interval.
    """
    y = np.asarray(references, dtype=np.int64).reshape(-1)
    s = np.asarray(scores, dtype=np.float64)
    members = defaultdict(list)
    for i, g in enumerate(range(len(y)) if groups is None else groups):
        members[g].append(i)
    by_label = defaultdict(list)
    for idx in members.values():
        by_label[int(np.bincount(y[idx]).argmax())].append(np.asarray(idx))
    rng = np.random.default_rng(seed)
    values = np.empty(n_resamples)
    for r in range(n_resamples):
        picked = [units[k] for units in by_label.values() for k in rng.integers(0, len(units), len(units))]
        idx = np.concatenate(picked)
        values[r] = statistic(y[idx], s[idx])
    alpha = (1 - confidence) / 2
    low, high = np.nanpercentile(values, [100 * alpha, 100 * (1 - alpha)])
    return {"value": float(statistic(y, s)), "ci_low": float(low), "ci_high": float(high)}


def binary_report(
    references,
    probabilities,
    threshold: float,
    groups=None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    n_bins: int = 15,
) -> dict:
    """Test metrics of a binary classifier (label 1 = positive) at a fixed threshold, each with its bootstrap
    interval: the point values from the shipped `evaluate` modules, the intervals from the same formulas on the
    resamples. `probabilities`: (N, 2) class probabilities. Also the confusion matrix at the threshold."""
    y = np.asarray(references, dtype=np.int64)
    p = np.asarray(probabilities, dtype=np.float64)
    positive = p[:, 1]
    decided = (positive >= threshold).astype(np.int64)
    values = {
        "roc_auc": load_metric("roc_auc").compute(references=y, prediction_scores=positive)["roc_auc"],
        **{
            k: v
            for k, v in load_metric("sensitivity_specificity")
            .compute(references=y, prediction_scores=positive, threshold=threshold)
            .items()
            if k in ("sensitivity", "specificity")
        },
        "balanced_accuracy": load_metric("balanced_accuracy").compute(references=y, predictions=decided)[
            "balanced_accuracy"
        ],
        "accuracy": load_metric("accuracy").compute(references=y, predictions=decided)["accuracy"],
        "expected_calibration_error": load_metric("expected_calibration_error").compute(
            references=y, prediction_scores=p, n_bins=n_bins
        )["expected_calibration_error"],
    }
    statistics = {
        "roc_auc": lambda yy, pp: cm.roc_auc(yy, pp[:, 1]),
        "sensitivity": lambda yy, pp: cm.sensitivity_specificity(yy, pp[:, 1], threshold)["sensitivity"],
        "specificity": lambda yy, pp: cm.sensitivity_specificity(yy, pp[:, 1], threshold)["specificity"],
        "balanced_accuracy": lambda yy, pp: cm.balanced_accuracy(yy, (pp[:, 1] >= threshold).astype(np.int64), 2),
        "accuracy": lambda yy, pp: cm.accuracy(yy, (pp[:, 1] >= threshold).astype(np.int64)),
        "expected_calibration_error": lambda yy, pp: cm.expected_calibration_error(yy, pp, n_bins),
    }
    report = {}
    for name, statistic in statistics.items():
        interval = bootstrap_ci(statistic, y, p, groups, n_resamples, confidence, seed)
        report[name] = {"value": float(values[name]), "ci_low": interval["ci_low"], "ci_high": interval["ci_high"]}
    report["confusion_matrix"] = load_metric("confusion_matrix").compute(
        references=y, predictions=decided, num_classes=2
    )["confusion_matrix"]
    report["threshold"] = float(threshold)
    report["bootstrap"] = {
        "resamples": n_resamples,
        "confidence": confidence,
        "seed": seed,
        "units": "groups" if groups is not None else "images",
        "stratified_by": "label",
    }
    return report
