"""Tests `evaluation.metrics`: top-k accuracy, compute_metrics for the Trainer, class reports."""

import json

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_vit_scaling.evaluation.metrics import (
    class_report,
    make_compute_metrics,
    make_module_compute_metrics,
    save_class_report,
    topk_accuracy,
)


def test_topk_accuracy_known_values():
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [0.5, 0.4, 0.1]])
    labels = np.array([1, 2, 2, 1])
    assert topk_accuracy(logits, labels, 1) == 0.5  # rows 0 and 2
    assert topk_accuracy(logits, labels, 2) == 0.75  # row 1's label 2 is third
    assert topk_accuracy(logits, labels, 3) == 1.0


def test_top5_only_with_more_than_five_classes():
    rng = np.random.default_rng(0)
    few = make_compute_metrics(5)(EvalPrediction(rng.normal(size=(8, 5)), rng.integers(0, 5, 8)))
    many = make_compute_metrics(10)(EvalPrediction(rng.normal(size=(8, 10)), rng.integers(0, 10, 8)))
    assert set(few) == {"accuracy"}
    assert set(many) == {"accuracy", "top5_accuracy"} and many["top5_accuracy"] >= many["accuracy"]


def argpartition_topk(logits, labels, k):
    """The recipe's top-k before the tie rule was fixed (np.argpartition: ties broken in no stated order)."""
    topk = np.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
    return float((topk == labels[:, None]).any(axis=-1).mean())


def test_without_ties_top_k_is_unchanged_from_the_argpartition_version():
    rng = np.random.default_rng(3)
    logits, labels = rng.normal(size=(500, 20)).astype(np.float32), rng.integers(0, 20, 500)
    for k in (1, 5):
        assert topk_accuracy(logits, labels, k) == argpartition_topk(logits, labels, k)


def numpy_reference(logits, labels, num_labels):
    """Each metric computed directly, without the modules or classification_metrics."""
    predicted = logits.argmax(axis=1)
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    order = np.argsort(-logits, axis=1, kind="stable")  # descending; equal scores keep the lower index first
    f1 = []
    for c in range(num_labels):
        tp = np.sum((predicted == c) & (labels == c))
        fp, fn = np.sum((predicted == c) & (labels != c)), np.sum((predicted != c) & (labels == c))
        if tp + fp + fn:  # a class neither true nor predicted is not scored
            f1.append(2 * tp / (2 * tp + fp + fn))
    support = np.bincount(labels, minlength=num_labels)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.diag(matrix) / support
    return {
        "accuracy": float(np.mean(predicted == labels)),
        "top5_accuracy": float(np.mean((order[:, :5] == labels[:, None]).any(axis=1))),
        "macro_f1": float(np.mean(f1)),
        "confusion_matrix": matrix.tolist(),
        "per_class_accuracy": [None if np.isnan(v) else float(v) for v in per_class],
        "images_per_class": support.tolist(),
    }


@pytest.mark.parametrize("num_labels", [10, 5])
def test_module_compute_metrics_equals_todays_names_and_values(monkeypatch, num_labels):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # before any module is loaded: they load from the package's files
    rng = np.random.default_rng(7)
    # Integer logits 0..3: most rows tie at their top, many tie at the 5th place; the last class is never true
    # (its per-class accuracy has no images; it is predicted, so its F1 counts, as 0).
    logits = rng.integers(0, 4, size=(300, num_labels)).astype(np.float32)
    labels = rng.integers(0, num_labels - 1, 300)
    pred = EvalPrediction(logits, labels)
    compute = make_module_compute_metrics([f"c{i}" for i in range(num_labels)])
    new, today = compute(pred), make_compute_metrics(num_labels)(pred)
    assert set(new) == set(today) | {"macro_f1"}  # accuracy, top5_accuracy (more than 5 classes), macro_f1
    for name in today:
        assert new[name] == today[name], name
    expected = numpy_reference(logits, labels, num_labels)
    assert new["accuracy"] == expected["accuracy"]
    if num_labels > 5:
        assert new["top5_accuracy"] == expected["top5_accuracy"]
    assert new["macro_f1"] == pytest.approx(expected["macro_f1"], abs=1e-12)
    report = compute.latest
    assert report["labels"] == [f"c{i}" for i in range(num_labels)]
    for key in ("confusion_matrix", "per_class_accuracy", "images_per_class"):
        assert report[key] == expected[key], key
    assert report["per_class_accuracy"][-1] is None  # no images of the last class


def test_class_report_file_is_json_with_one_matrix_row_per_line(tmp_path):
    report = class_report(["cat", "dog", "eel"], [[3, 1, 0], [0, 2, 0], [0, 0, 0]], [0.75, 1.0, float("nan")])
    path = save_class_report(str(tmp_path), "eval_ema", report)
    assert path == str(tmp_path / "eval_ema_confusion_matrix.json")
    text = open(path, encoding="utf-8").read()
    assert json.loads(text) == report and "    [3, 1, 0]," in text.splitlines()
    assert report["per_class_accuracy"] == [0.75, 1.0, None] and report["images_per_class"] == [4, 2, 0]
