"""Sensitivity (TP / (TP + FN)) and specificity (TN / (TN + FP)) of the decision score >= `threshold` (default 0.5),
with the four counts. `prediction_scores` is each image's score for the positive class `pos_label` (default 1)."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import BINARY_SCORE_INPUTS, metric_info


class SensitivitySpecificity(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, BINARY_SCORE_INPUTS)

    def _compute(self, prediction_scores, references, threshold: float = 0.5, pos_label: int = 1):
        return cm.sensitivity_specificity(references, prediction_scores, threshold, pos_label)
