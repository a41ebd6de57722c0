"""Top-1 / top-5 accuracy for the Trainer, computed locally (no `evaluate.load` download)."""

import numpy as np


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of rows whose label is among the k highest logits."""
    topk = np.argpartition(-logits, kth=k - 1, axis=-1)[:, :k]
    return float((topk == labels[:, None]).any(axis=-1).mean())


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
