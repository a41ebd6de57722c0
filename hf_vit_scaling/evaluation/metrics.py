"""Top-1 / top-5 accuracy for the Trainer with numpy alone: the light `compute_metrics` of
`recipes/train_vit_minimal.py`. `recipes/train_vit.py` computes the same values, and more, through the shipped
`evaluate` modules (`evaluation.make_module_compute_metrics`). Both use `classification_metrics.top_k_accuracy`, so
both break ties in scores the same way (lowest class index first, as `argmax`)."""

import numpy as np

from hf_vit_scaling.evaluation.classification_metrics import top_k_accuracy


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of rows whose label is among the k highest logits (ties: see `classification_metrics`)."""
    return top_k_accuracy(labels, logits, k)


def make_compute_metrics(num_labels: int):
    """`compute_metrics` for the Trainer: accuracy (top-1), plus top5_accuracy when there are more than 5 classes."""

    def compute_metrics(eval_pred) -> dict[str, float]:
        logits, labels = eval_pred.predictions, eval_pred.label_ids
        logits = logits[0] if isinstance(logits, tuple) else logits
        logits, labels = np.asarray(logits, dtype=np.float32), np.asarray(labels)
        metrics = {"accuracy": topk_accuracy(logits, labels, 1)}
        if num_labels > 5:
            metrics["top5_accuracy"] = topk_accuracy(logits, labels, 5)
        return metrics

    return compute_metrics
