"""Evaluation with `evaluate` modules shipped inside the package (no Hub, no network): the training recipe's
`compute_metrics` (`ModuleComputeMetrics`), and what a medical result needs around them: a decision threshold chosen
on validation, bootstrap confidence intervals, ROC and reliability plots.

The modules live in `metric_modules/<name>/<name>.py` and wrap the formulas of `classification_metrics`;
`load_metric(name)` loads one by path, so `HF_HUB_OFFLINE=1` changes nothing.
"""

import json
import os
from collections import defaultdict

import numpy as np
from datasets import Sequence, Value

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation import classification_metrics as cm

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


# ---------------------------------------------------------------- bootstrap confidence intervals


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


# ---------------------------------------------------------------- the Trainer's compute_metrics through the modules

CLASS_REPORT_FILENAME = "{prefix}_confusion_matrix.json"  # prefix: eval, or eval_ema for the EMA weights


class ModuleComputeMetrics:
    """`compute_metrics` for the Trainer from the shipped modules, under the names `metrics.make_compute_metrics`
    gives (so `eval_accuracy`, `eval_top5_accuracy` and `metric_for_best_model` keep their meaning):

    - `accuracy`: top-1, the accuracy of the argmax predictions (`accuracy` module);
    - `top5_accuracy`, with more than 5 classes (`top_k_accuracy` module; ties ranked by class index, as argmax);
    - `macro_f1`: the unweighted mean of per-class F1 over all `num_labels` classes (`macro_f1` module).

    The Trainer's metrics must be numbers, and one per class would swamp its logs and the model card (1,000 for
    ImageNet, at every evaluation). So the confusion matrix and the per-class accuracy (`confusion_matrix` and
    `per_class_accuracy` modules) of the latest call are kept in `latest`, which `VitTrainer.evaluate` files under
    its metric prefix and `save_class_report` writes after the final evaluation.

    Cost: `evaluate` passes the (N, K) scores of the top-k module through an Arrow table; 10,000 x 1,000 logits
    took 6-9 s and 0.6 GB of extra memory on this project's busy 2-core CPU, against 0.3 s for numpy on the array.
    Every rank computes the metrics (the Trainer gathers all predictions to each).
    """

    def __init__(self, label_names: list[str]):
        self.label_names = list(label_names)
        self.num_labels = len(self.label_names)
        self.modules = {name: load_metric(name) for name in ("accuracy", "macro_f1", "per_class_accuracy",
                                                             "confusion_matrix")}  # fmt: skip
        self.top_k = load_metric("top_k_accuracy") if self.num_labels > 5 else None
        self.latest: dict | None = None

    def __call__(self, eval_pred) -> dict[str, float]:
        logits, labels = eval_pred.predictions, eval_pred.label_ids
        # float32 as `make_compute_metrics`: the same scores, so the same ties (the modules widen to float64 exactly)
        logits = np.asarray(logits[0] if isinstance(logits, tuple) else logits, dtype=np.float32)
        labels = np.asarray(labels, dtype=np.int64)
        predictions = logits.argmax(axis=1)  # ties: the lowest class index
        given = {"predictions": predictions, "references": labels}
        every_class = {**given, "num_classes": self.num_labels}
        metrics = {"accuracy": self.modules["accuracy"].compute(**given)["accuracy"]}
        if self.top_k is not None:
            metrics["top5_accuracy"] = self.top_k.compute(predictions=logits, references=labels, k=5)["top_k_accuracy"]
        metrics["macro_f1"] = self.modules["macro_f1"].compute(**every_class)["macro_f1"]
        matrix = self.modules["confusion_matrix"].compute(**every_class)["confusion_matrix"]
        per_class = self.modules["per_class_accuracy"].compute(**every_class)["per_class_accuracy"]
        self.latest = class_report(self.label_names, matrix, per_class)
        return metrics


def make_module_compute_metrics(label_names: list[str]) -> ModuleComputeMetrics:
    """The recipe's `compute_metrics` (see `ModuleComputeMetrics`)."""
    return ModuleComputeMetrics(label_names)


def class_report(label_names: list[str], matrix: list[list[int]], per_class_accuracy: list[float]) -> dict:
    """Per-class results as JSON-ready values: a class with no images has accuracy None (NaN is not JSON)."""
    return {
        "labels": list(label_names),
        "images_per_class": [int(sum(row)) for row in matrix],
        "per_class_accuracy": [None if np.isnan(v) else float(v) for v in per_class_accuracy],
        "confusion_matrix": [[int(v) for v in row] for row in matrix],
        "layout": "confusion_matrix[i][j] counts images of true class labels[i] predicted as labels[j]",
    }


def save_class_report(output_dir: str, prefix: str, report: dict) -> str:
    """Write `report` to output_dir/<prefix>_confusion_matrix.json, one matrix row per line (readable for tens of
    classes, still one file for 1,000). Call from the main process."""
    path = os.path.join(output_dir, CLASS_REPORT_FILENAME.format(prefix=prefix))
    fields = []
    for key, value in report.items():
        if key == "confusion_matrix":
            rows = ",\n".join(f"    {json.dumps(row)}" for row in value)
            fields.append(f'  "{key}": [\n{rows}\n  ]')
        else:
            fields.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(fields) + "\n}\n")
    return path


# ---------------------------------------------------------------- plots (matplotlib: the `plots` extra)


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or a clear error when it is not installed."""
    try:
        import matplotlib
    except ImportError as err:
        raise UserInputError(
            "the ROC and reliability plots need matplotlib. Fix: pip install 'hf-vit-scaling[plots]' (or matplotlib)."
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_roc_curve(path: str, references, scores, threshold: float | None = None, title: str = "ROC curve") -> str:
    """The ROC curve with its AUROC, the chance diagonal and the operating point at `threshold`, as a PNG."""
    plt = pyplot()
    fpr, tpr, _ = cm.roc_points(references, scores)
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=120)
    ax.plot(fpr, tpr, lw=2, label=f"AUROC {cm.roc_auc(references, scores):.3f}")
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="chance")
    if threshold is not None:
        point = cm.sensitivity_specificity(references, scores, threshold)
        ax.plot(
            1 - point["specificity"],
            point["sensitivity"],
            "o",
            color="C3",
            label=f"threshold {threshold:.3f}: sens {point['sensitivity']:.3f}, spec {point['specificity']:.3f}",
        )
    ax.set(
        xlabel="1 - specificity (false positive rate)",
        ylabel="sensitivity (true positive rate)",
        title=title,
        xlim=(0, 1),
        ylim=(0, 1.01),
    )
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def save_reliability_diagram(
    path: str, references, probabilities, n_bins: int = 15, title: str = "Reliability diagram"
) -> str:
    """Accuracy against mean confidence per confidence bin (Guo et al. 2017, fig. 1), with the ECE and the share of
    images per bin, as a PNG. A calibrated model's bars meet the diagonal."""
    plt = pyplot()
    bins = cm.calibration_bins(references, probabilities, n_bins)
    ece = cm.expected_calibration_error(references, probabilities, n_bins)
    edges, width = bins["edges"], 1.0 / n_bins
    filled = bins["count"] > 0
    fig, (ax, hist) = plt.subplots(
        2, 1, figsize=(4.5, 5.5), dpi=120, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax.bar(
        edges[:-1][filled], bins["accuracy"][filled], width=width, align="edge", edgecolor="black", label="accuracy"
    )
    ax.bar(
        edges[:-1][filled],
        (bins["confidence"] - bins["accuracy"])[filled],
        bottom=bins["accuracy"][filled],
        width=width,
        align="edge",
        color="C3",
        alpha=0.35,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1)
    ax.set(ylabel="accuracy", title=f"{title} (ECE {ece:.3f}, {n_bins} bins)", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=7)
    hist.bar(edges[:-1], bins["count"] / bins["count"].sum(), width=width, align="edge", edgecolor="black")
    hist.set(xlabel="confidence (largest class probability)", ylabel="share")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
