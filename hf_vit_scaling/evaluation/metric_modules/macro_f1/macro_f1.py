"""Macro F1: the unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN); a class never true nor predicted
scores 0. `num_classes` (optional) counts absent classes too."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import LABEL_INPUTS, metric_info


class MacroF1(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABEL_INPUTS)

    def _compute(self, predictions, references, num_classes: int | None = None):
        return {"macro_f1": cm.macro_f1(references, predictions, num_classes)}
