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
