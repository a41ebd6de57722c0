"""Accuracy: the fraction of images whose predicted label equals the true label (top-1 when predictions are argmax)."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import LABEL_INPUTS, metric_info


class Accuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABEL_INPUTS)

    def _compute(self, predictions, references):
        return {"accuracy": cm.accuracy(references, predictions)}
