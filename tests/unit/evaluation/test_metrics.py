import numpy as np
from transformers import EvalPrediction

from hf_vit_scaling.evaluation.metrics import make_compute_metrics, topk_accuracy


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
