"""Balanced accuracy: the mean per-class recall over the classes present; for two classes (sensitivity +
specificity) / 2. Unlike accuracy, a model that always predicts the majority class scores 1 / K."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import LABEL_INPUTS, metric_info


class BalancedAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABEL_INPUTS)

    def _compute(self, predictions, references, num_classes: int | None = None):
        return {"balanced_accuracy": cm.balanced_accuracy(references, predictions, num_classes)}
