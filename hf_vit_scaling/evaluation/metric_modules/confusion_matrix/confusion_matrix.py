"""Confusion matrix: entry [i][j] counts images of true class i predicted as class j (rows true, columns predicted).
`num_classes` (optional) fixes the size when some classes are absent."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import LABEL_INPUTS, metric_info


class ConfusionMatrix(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABEL_INPUTS)

    def _compute(self, predictions, references, num_classes: int | None = None):
        return {"confusion_matrix": cm.confusion_matrix(references, predictions, num_classes).tolist()}
