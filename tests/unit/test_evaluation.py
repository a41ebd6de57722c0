import os
import subprocess
import sys

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_vit_scaling import classification_metrics as cm
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation import (
    BINARY_REPORT_METRICS,
    SHIPPED_METRICS,
    binary_report,
    bootstrap_ci,
    choose_threshold,
    load_metric,
    make_module_compute_metrics,
    save_reliability_diagram,
    save_roc_curve,
)
from hf_vit_scaling.metrics import make_compute_metrics, topk_accuracy

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


def test_module_compute_metrics_matches_todays_and_adds_the_rest():
    rng = np.random.default_rng(1)
    names = [f"c{i}" for i in range(10)]
    pred = EvalPrediction(rng.normal(size=(64, 10)).astype(np.float32), rng.integers(0, 10, 64))
    new, old = make_module_compute_metrics(names)(pred), make_compute_metrics(10)(pred)
    assert new["accuracy"] == old["accuracy"] and new["top5_accuracy"] == old["top5_accuracy"]
    assert {"macro_f1", "balanced_accuracy", "accuracy_c0", "accuracy_c9"} <= set(new)
    binary = make_module_compute_metrics(["no", "yes"])(
        EvalPrediction(np.array([[0.0, 1.0], [2.0, 0.0]]), np.array([1, 0]))
    )
    assert binary["roc_auc"] == 1.0 and "top5_accuracy" not in binary


def test_modules_load_offline_with_a_cold_cache(tmp_path):
    """A fresh HF cache and HF_HUB_OFFLINE=1: every module loads from the package's files."""
    code = (
        "from hf_vit_scaling.evaluation import SHIPPED_METRICS, load_metric\n"
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
    setup_cfg = open(os.path.join(os.path.dirname(folder), "..", "setup.cfg"), encoding="utf-8").read()
    assert "hf_vit_scaling = metric_modules/*/*.py" in setup_cfg
