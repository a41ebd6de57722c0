import json
import os
import subprocess
import sys

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import SHIPPED_METRICS, load_metric
from hf_vit_scaling.evaluation.metrics import (
    class_report,
    make_compute_metrics,
    make_module_compute_metrics,
    save_class_report,
    topk_accuracy,
)
from hf_vit_scaling.medical.plots import save_reliability_diagram, save_roc_curve
from hf_vit_scaling.medical.statistics import BINARY_REPORT_METRICS, binary_report, bootstrap_ci, choose_threshold

# Fixed predictions, hand-counted: 4 negatives scored .7 .3 .2 .1 and 4 positives scored .9 .8 .4 .35.
LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 1])
SCORES = np.array([0.7, 0.3, 0.2, 0.1, 0.9, 0.8, 0.4, 0.35])
AT_HALF = (SCORES >= 0.5).astype(int)  # predicted [1, 0, 0, 0, 1, 1, 0, 0]


def test_binary_metrics_equal_hand_computed_values():
    # Positive-negative pairs ranked right: .9 and .8 beat all 4, .4 and .35 beat 3 (not .7): 14 of 16.
    assert load_metric("roc_auc").compute(references=LABELS, prediction_scores=SCORES) == {"roc_auc": 14 / 16}
    result = load_metric("sensitivity_specificity").compute(references=LABELS, prediction_scores=SCORES, threshold=0.5)
    assert result == {"sensitivity": 2 / 4, "specificity": 3 / 4, "threshold": 0.5, "tp": 2, "fn": 2, "tn": 3, "fp": 1}
    assert load_metric("balanced_accuracy").compute(references=LABELS, predictions=AT_HALF) == {
        "balanced_accuracy": (2 / 4 + 3 / 4) / 2
    }
    assert load_metric("confusion_matrix").compute(references=LABELS, predictions=AT_HALF) == {
        "confusion_matrix": [[3, 1], [2, 2]]
    }
    assert load_metric("accuracy").compute(references=LABELS, predictions=AT_HALF) == {"accuracy": 5 / 8}
    # F1 = 2TP / (2TP + FP + FN): class 0: 6 / (6 + 2 + 1); class 1: 4 / (4 + 1 + 2).
    f1 = load_metric("macro_f1").compute(references=LABELS, predictions=AT_HALF)["macro_f1"]
    assert f1 == pytest.approx((6 / 9 + 4 / 7) / 2, abs=1e-12)
    assert load_metric("per_class_accuracy").compute(references=LABELS, predictions=AT_HALF) == {
        "per_class_accuracy": [3 / 4, 2 / 4]
    }


def test_roc_auc_counts_ties_half_and_multiclass_is_the_mean_of_one_vs_rest():
    assert cm.roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.2, 0.9]) == pytest.approx((0.5 + 1 + 1 + 1) / 4)
    probs = [[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]
    # One-vs-rest: every class's own images score above the others' -> 1.0 each.
    assert load_metric("roc_auc", "multiclass").compute(references=[0, 1, 2, 2], prediction_scores=probs) == {
        "roc_auc": 1.0
    }


def test_expected_calibration_error_by_hand():
    positive = np.array([0.1, 0.8, 0.4, 0.3, 0.9])
    probs = np.stack([1 - positive, positive], axis=1)
    # Confidences .9 .8 .6 .7 .9, correct 1 1 0 1 1; 15 bins: .9 x2 (bin 13, acc 1), .8 (bin 12), .6 (bin 9, acc 0),
    # .7 (bin 10): (2 x .1 + .2 + .6 + .3) / 5.
    result = load_metric("expected_calibration_error").compute(references=[0, 1, 1, 0, 1], prediction_scores=probs)
    assert result["expected_calibration_error"] == pytest.approx((2 * 0.1 + 0.2 + 0.6 + 0.3) / 5, abs=1e-12)
    assert cm.expected_calibration_error([0, 1], [[1.0, 0.0], [0.0, 1.0]]) == 0.0


def test_accuracy_and_top_k_equal_topk_accuracy_on_the_same_predictions():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(200, 10)), rng.integers(0, 10, 200)
    top = load_metric("top_k_accuracy")
    for k in (1, 2, 5, 10):
        assert top.compute(predictions=logits, references=labels, k=k)["top_k_accuracy"] == topk_accuracy(
            logits, labels, k
        )
    accuracy = load_metric("accuracy").compute(predictions=logits.argmax(1), references=labels)["accuracy"]
    assert accuracy == topk_accuracy(logits, labels, 1)


def test_top_k_ranks_tied_scores_by_class_index_as_argmax():
    # Row scores [1, 1, 0]: class 0 comes first (top-1), class 1 second, class 2 third.
    scores = [[1.0, 1.0, 0.0]] * 3
    top = load_metric("top_k_accuracy")
    for label, rank in ((0, 0), (1, 1), (2, 2)):
        for k in (1, 2, 3):
            expected = float(rank < k)
            assert cm.top_k_accuracy([label], scores[:1], k) == expected
            assert topk_accuracy(np.array(scores[:1]), np.array([label]), k) == expected
            assert top.compute(predictions=scores[:1], references=[label], k=k)["top_k_accuracy"] == expected
    # A collapsed model (every class scored alike) is credited only for the classes argmax would pick.
    flat, labels = np.zeros((10, 10)), np.arange(10)
    assert cm.top_k_accuracy(labels, flat, 1) == 0.1 and cm.top_k_accuracy(labels, flat, 5) == 0.5


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
        f1.append(0.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn))
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
    # Integer logits 0..3: most rows tie at their top, many tie at the 5th place; the last class never appears
    # (its per-class accuracy has no images, its F1 counts 0).
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


def test_modules_load_offline_with_a_cold_cache(tmp_path):
    """A fresh HF cache and HF_HUB_OFFLINE=1: every module loads from the package's files."""
    code = (
        "from hf_vit_scaling.evaluation.metric_loading import SHIPPED_METRICS, load_metric\n"
        "print(sorted(type(load_metric(n)).__name__ for n in SHIPPED_METRICS))"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("'") == 2 * len(SHIPPED_METRICS)


def test_unknown_metric_is_a_user_error():
    with pytest.raises(UserInputError, match="not shipped"):
        load_metric("bleu")


def test_threshold_choice_on_validation():
    # J = TPR - FPR at each score: .9: .25; .8: .5; .7: .5 - .25; .4: .75 - .25 = .5; .35: 1 - .25 = .75 (max).
    chosen = choose_threshold(LABELS, SCORES)
    assert chosen == {
        "threshold": 0.35,
        "rule": "youden",
        "validation_sensitivity": 1.0,
        "validation_specificity": 0.75,
    }
    # The highest threshold with sensitivity >= 0.7 is .4 (3 of 4 positives), specificity 3 / 4.
    assert choose_threshold(LABELS, SCORES, "sensitivity", 0.7)["threshold"] == 0.4
    with pytest.raises(UserInputError, match="threshold rule"):
        choose_threshold(LABELS, SCORES, "f1")
    with pytest.raises(UserInputError, match=r"must be in \(0, 1\]"):
        choose_threshold(LABELS, SCORES, "sensitivity", 1.5)


def test_bootstrap_is_seeded_and_resamples_whole_groups():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 30)
    s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
    first = bootstrap_ci(cm.roc_auc, y, s, n_resamples=300, seed=3)
    assert first == bootstrap_ci(cm.roc_auc, y, s, n_resamples=300, seed=3)
    assert first["ci_low"] < first["value"] < first["ci_high"]
    # Three identical copies of every image, grouped: the same seed draws the same groups, so the interval equals the
    # image-level one on the originals (AUROC does not change when every image is tripled).
    tripled = bootstrap_ci(
        cm.roc_auc, np.repeat(y, 3), np.repeat(s, 3), groups=np.repeat(np.arange(60), 3), n_resamples=300, seed=3
    )
    assert tripled == pytest.approx(first)
    # Ungrouped, the copies pass for independent images and the interval shrinks: the reason to group.
    naive = bootstrap_ci(cm.roc_auc, np.repeat(y, 3), np.repeat(s, 3), n_resamples=300, seed=3)
    assert naive["ci_high"] - naive["ci_low"] < 0.8 * (first["ci_high"] - first["ci_low"])


def test_binary_report_and_plots(tmp_path):
    probs = np.stack([1 - SCORES, SCORES], axis=1)
    report = binary_report(LABELS, probs, threshold=0.5, n_resamples=50)
    assert report["roc_auc"]["value"] == 14 / 16 and report["sensitivity"]["value"] == 0.5
    assert report["specificity"]["value"] == 0.75 and report["confusion_matrix"] == [[3, 1], [2, 2]]
    for name in BINARY_REPORT_METRICS:
        assert report[name]["ci_low"] <= report[name]["value"] <= report[name]["ci_high"]
    roc = save_roc_curve(str(tmp_path / "roc.png"), LABELS, SCORES, threshold=0.5)
    reliability = save_reliability_diagram(str(tmp_path / "rel.png"), LABELS, probs)
    for path in (roc, reliability):
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_without_matplotlib_say_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserInputError, match=r"hf-vit-scaling\[plots\]"):
        save_roc_curve(str(tmp_path / "roc.png"), LABELS, SCORES)


def test_every_shipped_module_is_a_package_data_file():
    """setup.cfg ships metric_modules/*/*.py: each module is <name>/<name>.py, the layout evaluate.load expects."""
    folder = os.path.join(os.path.dirname(load_metric.__code__.co_filename), "metric_modules")
    found = sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, f"{name}.py")))
    assert found == sorted(SHIPPED_METRICS)
    package_root = os.path.dirname(os.path.dirname(folder))
    setup_cfg = open(os.path.join(package_root, "..", "setup.cfg"), encoding="utf-8").read()
    assert "hf_vit_scaling = evaluation/metric_modules/*/*.py" in setup_cfg
