"""Tests `evaluation.classification_metrics`: ties, multiclass AUROC, calibration, top-k by hand."""

import numpy as np
import pytest

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import load_metric
from hf_vit_scaling.evaluation.metrics import topk_accuracy


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


def test_macro_f1_averages_the_classes_present_as_scikit_learn():
    from sklearn.metrics import f1_score

    # 10 classes known, 3 in the evaluated set: class 4 only true, class 7 true and predicted, class 9 only predicted
    # (its F1 is 0 and counts). Classes never true nor predicted are not scored: absent, not wrong.
    references, predictions = [4, 4, 7, 7, 7, 4], [4, 7, 7, 7, 9, 4]
    present = np.union1d(references, predictions)
    expected = f1_score(references, predictions, labels=present, average="macro")
    assert expected == pytest.approx((4 / 5 + 4 / 6 + 0.0) / 3)  # 2TP / (2TP + FP + FN) per class
    assert cm.macro_f1(references, predictions) == pytest.approx(expected, abs=1e-12)
    assert cm.macro_f1(references, predictions, num_classes=10) == pytest.approx(expected, abs=1e-12)
    module = load_metric("macro_f1").compute(references=references, predictions=predictions, num_classes=10)
    assert module["macro_f1"] == pytest.approx(expected, abs=1e-12)
    rng = np.random.default_rng(3)
    for _ in range(20):
        y, p = rng.integers(0, 12, 40), rng.integers(2, 9, 40)
        reference = f1_score(y, p, labels=np.union1d(y, p), average="macro")
        assert cm.macro_f1(y, p, num_classes=15) == pytest.approx(reference, abs=1e-12)
