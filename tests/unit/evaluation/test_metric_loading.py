"""Tests `evaluation.metric_loading`: the shipped `evaluate` modules loaded offline, their values by hand."""

import os
import subprocess
import sys

import numpy as np
import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation.metric_loading import SHIPPED_METRICS, load_metric
from hf_vit_scaling.evaluation.metrics import topk_accuracy

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


def test_every_shipped_module_is_a_package_data_file():
    """setup.cfg ships metric_modules/*/*.py: each module is <name>/<name>.py, the layout evaluate.load expects."""
    folder = os.path.join(os.path.dirname(load_metric.__code__.co_filename), "metric_modules")
    found = sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, f"{name}.py")))
    assert found == sorted(SHIPPED_METRICS)
    package_root = os.path.dirname(os.path.dirname(folder))
    setup_cfg = open(os.path.join(package_root, "..", "setup.cfg"), encoding="utf-8").read()
    assert "hf_vit_scaling = evaluation/metric_modules/*/*.py" in setup_cfg
