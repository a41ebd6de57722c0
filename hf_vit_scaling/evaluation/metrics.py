"""Top-1 / top-5 accuracy for the Trainer with numpy alone: the light `compute_metrics` of
`recipes/train_vit_minimal.py`. `recipes/train_vit.py` computes the same values, and more, through the shipped
`evaluate` modules (`evaluation.make_module_compute_metrics`). Both use `classification_metrics.top_k_accuracy`, so
both break ties in scores the same way (lowest class index first, as `argmax`)."""

import json
import os

import numpy as np

from hf_vit_scaling.evaluation.classification_metrics import top_k_accuracy
from hf_vit_scaling.evaluation.metric_loading import load_metric


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


CLASS_REPORT_FILENAME = "{prefix}_confusion_matrix.json"  # prefix: eval, or eval_ema for the EMA weights


class ModuleComputeMetrics:
    """`compute_metrics` for the Trainer from the shipped modules, under the names `metrics.make_compute_metrics`
    gives (so `eval_accuracy`, `eval_top5_accuracy` and `metric_for_best_model` keep their meaning):

    - `accuracy`: top-1, the accuracy of the argmax predictions (`accuracy` module);
    - `top5_accuracy`, with more than 5 classes (`top_k_accuracy` module; ties ranked by class index, as argmax);
    - `macro_f1`: the unweighted mean of per-class F1 over the classes present in the labels or the predictions
      (`macro_f1` module; a class neither true nor predicted in the evaluated set is left out, not scored 0).

    The Trainer's metrics must be numbers, and one per class would swamp its logs and the model card (1,000 for
    ImageNet, at every evaluation). So the confusion matrix and the per-class accuracy (`confusion_matrix` and
    `per_class_accuracy` modules) of the latest call are kept in `latest`, which `VitTrainer.evaluate` files under
    its metric prefix and `save_class_report` writes after the final evaluation.

    Cost: `evaluate` passes the (N, K) scores of the top-k module through an Arrow table, many times slower than numpy
    on the array at ImageNet's 1,000 classes (measured: docs/recipe.md, "What was measured").
    Every rank computes the metrics (the Trainer gathers all predictions to each).
    """

    def __init__(self, label_names: list[str]):
        self.label_names = list(label_names)
        self.num_labels = len(self.label_names)
        self.modules = {
            name: load_metric(name) for name in ("accuracy", "macro_f1", "per_class_accuracy", "confusion_matrix")
        }
        self.top_k = load_metric("top_k_accuracy") if self.num_labels > 5 else None
        self.latest: dict | None = None

    def __call__(self, eval_pred) -> dict[str, float]:
        logits, labels = eval_pred.predictions, eval_pred.label_ids
        # float32 as `make_compute_metrics`: the same scores, so the same ties (the modules widen to float64 exactly)
        logits = np.asarray(logits[0] if isinstance(logits, tuple) else logits, dtype=np.float32)
        labels = np.asarray(labels, dtype=np.int64)
        predictions = logits.argmax(axis=1)  # ties: the lowest class index
        given = {"predictions": predictions, "references": labels}
        every_class = {**given, "num_classes": self.num_labels}
        metrics = {"accuracy": self.modules["accuracy"].compute(**given)["accuracy"]}
        if self.top_k is not None:
            metrics["top5_accuracy"] = self.top_k.compute(predictions=logits, references=labels, k=5)["top_k_accuracy"]
        metrics["macro_f1"] = self.modules["macro_f1"].compute(**every_class)["macro_f1"]
        matrix = self.modules["confusion_matrix"].compute(**every_class)["confusion_matrix"]
        per_class = self.modules["per_class_accuracy"].compute(**every_class)["per_class_accuracy"]
        self.latest = class_report(self.label_names, matrix, per_class)
        return metrics


def make_module_compute_metrics(label_names: list[str]) -> ModuleComputeMetrics:
    """The recipe's `compute_metrics` (see `ModuleComputeMetrics`)."""
    return ModuleComputeMetrics(label_names)


def class_report(label_names: list[str], matrix: list[list[int]], per_class_accuracy: list[float]) -> dict:
    """Per-class results as JSON-ready values: a class with no images has accuracy None (NaN is not JSON)."""
    return {
        "labels": list(label_names),
        "images_per_class": [int(sum(row)) for row in matrix],
        "per_class_accuracy": [None if np.isnan(v) else float(v) for v in per_class_accuracy],
        "confusion_matrix": [[int(v) for v in row] for row in matrix],
        "layout": "confusion_matrix[i][j] counts images of true class labels[i] predicted as labels[j]",
    }


def save_class_report(output_dir: str, prefix: str, report: dict) -> str:
    """Write `report` to output_dir/<prefix>_confusion_matrix.json, one matrix row per line (readable for tens of
    classes, still one file for 1,000). Call from the main process."""
    path = os.path.join(output_dir, CLASS_REPORT_FILENAME.format(prefix=prefix))
    fields = []
    for key, value in report.items():
        if key == "confusion_matrix":
            rows = ",\n".join(f"    {json.dumps(row)}" for row in value)
            fields.append(f'  "{key}": [\n{rows}\n  ]')
        else:
            fields.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(fields) + "\n}\n")
    return path
