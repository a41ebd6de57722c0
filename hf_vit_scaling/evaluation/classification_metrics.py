"""Classification metric formulas, written once: the shipped `evaluate` modules (`metric_modules/`) wrap them, and the
evaluation helpers (thresholds, bootstrap intervals) call them directly on numpy arrays.

Conventions: `references` are integer labels 0..K-1; `predictions` are integer labels; `scores` are per-class scores
(N, K) (logits or probabilities) or, for binary metrics, the positive class's probability (N,). A binary decision at
threshold t predicts positive when score >= t. Confusion matrices are rows = true label, columns = predicted (as
scikit-learn's).
"""

import numpy as np


def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _num_classes(*label_arrays, num_classes: int | None = None) -> int:
    return int(num_classes) if num_classes else int(max(int(a.max(initial=-1)) for a in label_arrays) + 1)


def confusion_matrix(references, predictions, num_classes: int | None = None) -> np.ndarray:
    """(K, K) counts: entry [i, j] = images of true class i predicted as j."""
    y, p = _ints(references), _ints(predictions)
    k = _num_classes(y, p, num_classes=num_classes)
    return np.bincount(y * k + p, minlength=k * k).reshape(k, k)


def accuracy(references, predictions) -> float:
    y, p = _ints(references), _ints(predictions)
    return float((y == p).mean())


def top_k_accuracy(references, scores, k: int) -> float:
    """Fraction of rows whose true class is among the k highest scores.

    Ties are ranked by class index, lowest first, as `argmax` breaks them: the true class's rank is the number of
    classes scoring strictly higher plus the number scoring the same with a lower index, and the row counts when
    that rank is below k. So top-1 equals the accuracy of the `argmax` predictions that `accuracy`, the confusion
    matrix and per-class accuracy count, top-k never falls as k grows, and the same scores always give the same
    value. Ties are common in practice: bf16 logits keep 8 significant bits, and a collapsed model scores every
    class alike. Crediting ties to the true class instead would score such a model 100%; `np.argpartition`
    breaks them in whatever order its selection algorithm leaves. E.g. scores [[1, 1, 0]]: label 0 is top-1,
    label 1 is not (rank 1) but is top-2.
    """
    y, s = _ints(references), np.asarray(scores, dtype=np.float64)
    true_score = s[np.arange(len(y)), y][:, None]
    before = np.arange(s.shape[1])[None, :] < y[:, None]
    rank = (s > true_score).sum(axis=1) + ((s == true_score) & before).sum(axis=1)
    return float((rank < k).mean())


def per_class_accuracy(references, predictions, num_classes: int | None = None) -> np.ndarray:
    """Recall of each class: correct / images of that class (NaN for a class with no images)."""
    cm = confusion_matrix(references, predictions, num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.diag(cm) / cm.sum(axis=1)


def balanced_accuracy(references, predictions, num_classes: int | None = None) -> float:
    """Mean per-class recall over the classes present in `references` (Brodersen et al. 2010; scikit-learn's
    `balanced_accuracy_score`). For two classes: (sensitivity + specificity) / 2."""
    return float(np.nanmean(per_class_accuracy(references, predictions, num_classes)))


def macro_f1(references, predictions, num_classes: int | None = None) -> float:
    """Unweighted mean of F1 = 2 TP / (2 TP + FP + FN) over the classes present in `references` or in `predictions`
    (a class only predicted scores 0 and counts), as scikit-learn's `f1_score(average="macro")` with the labels
    present in either (its default). A class neither true nor predicted is left out, whatever `num_classes` (which
    only sizes the confusion matrix): it is absent from the evaluated set, not misclassified, and counting it as 0
    would pull the score down by the share of classes a small or partial evaluation set happens to lack."""
    cm = confusion_matrix(references, predictions, num_classes)
    tp = np.diag(cm).astype(np.float64)
    denominator = cm.sum(axis=0) + cm.sum(axis=1)  # (TP + FP) + (TP + FN): 0 exactly for an absent class
    present = denominator > 0
    return float((2 * tp[present] / denominator[present]).mean()) if present.any() else 0.0


def binary_counts(references, scores, threshold: float, pos_label: int = 1) -> dict[str, int]:
    """TP, FN, TN, FP of the decision score >= threshold."""
    positive = _ints(references) == pos_label
    predicted = np.asarray(scores, dtype=np.float64).reshape(-1) >= threshold
    return {
        "tp": int((positive & predicted).sum()),
        "fn": int((positive & ~predicted).sum()),
        "tn": int((~positive & ~predicted).sum()),
        "fp": int((~positive & predicted).sum()),
    }


def sensitivity_specificity(references, scores, threshold: float, pos_label: int = 1) -> dict[str, float]:
    """Sensitivity = TP / (TP + FN) (recall of the positive class), specificity = TN / (TN + FP), at `threshold`."""
    c = binary_counts(references, scores, threshold, pos_label)
    positives, negatives = c["tp"] + c["fn"], c["tn"] + c["fp"]
    return {
        "sensitivity": c["tp"] / positives if positives else float("nan"),
        "specificity": c["tn"] / negatives if negatives else float("nan"),
        "threshold": float(threshold),
        **c,
    }


def roc_auc(references, scores, multi_class: str | None = None) -> float:
    """Area under the ROC curve (ties in scores count half, the Mann-Whitney U statistic / (n+ n-); Hanley & McNeil
    1982). Binary: `scores` is the positive class's score (N,). Multiclass (`multi_class="ovr"`): (N, K) probabilities,
    the unweighted mean of the one-vs-rest areas (scikit-learn's `roc_auc_score(average="macro")`)."""
    # here, not at the top: importing scikit-learn slows every start-up (measured: docs/recipe.md, "What was measured")
    from sklearn.metrics import roc_auc_score

    y = _ints(references)
    if multi_class:
        return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64), multi_class=multi_class, average="macro"))
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64).reshape(-1)))


def roc_points(references, scores, pos_label: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positive rates, true positive rates, thresholds) of every distinct threshold, as scikit-learn's
    `roc_curve` (the first threshold is +inf: nothing predicted positive)."""
    from sklearn.metrics import roc_curve

    fpr, tpr, thresholds = roc_curve(
        _ints(references),
        np.asarray(scores, dtype=np.float64).reshape(-1),
        pos_label=pos_label,
        drop_intermediate=False,
    )
    return fpr, tpr, thresholds


def calibration_bins(references, probabilities, n_bins: int = 15) -> dict[str, np.ndarray]:
    """Equal-width confidence bins on [0, 1] (a confidence of exactly 1 goes to the last bin) for the reliability
    diagram and the ECE: per bin the image count, mean confidence and accuracy (NaN when empty). Confidence is the
    largest class probability, the prediction its class (Guo et al. 2017, section 2)."""
    y = _ints(references)
    p = np.asarray(probabilities, dtype=np.float64)
    confidence, predicted = p.max(axis=1), p.argmax(axis=1)
    index = np.minimum((confidence * n_bins).astype(np.int64), n_bins - 1)
    count = np.bincount(index, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(index, weights=confidence, minlength=n_bins) / count
        bin_accuracy = np.bincount(index, weights=(predicted == y).astype(np.float64), minlength=n_bins) / count
    return {
        "edges": np.linspace(0, 1, n_bins + 1),
        "count": count,
        "confidence": mean_confidence,
        "accuracy": bin_accuracy,
    }


def expected_calibration_error(references, probabilities, n_bins: int = 15) -> float:
    """ECE = sum over bins b of |B_b| / N * |accuracy(B_b) - confidence(B_b)| (Naeini et al. 2015; Guo et al. 2017,
    eq. 3), with `n_bins` equal-width bins (15, as Guo et al.)."""
    bins = calibration_bins(references, probabilities, n_bins)
    filled = bins["count"] > 0
    gaps = np.abs(bins["accuracy"][filled] - bins["confidence"][filled])
    return float((bins["count"][filled] / bins["count"].sum() * gaps).sum())


def softmax(logits) -> np.ndarray:
    """Row-wise softmax, shifted by the row maximum so that large logits do not overflow."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)
