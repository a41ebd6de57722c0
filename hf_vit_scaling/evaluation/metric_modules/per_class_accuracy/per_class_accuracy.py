"""Per-class accuracy: for each class, the fraction of its images predicted as that class (its recall); NaN for a
class with no images. `num_classes` (optional) fixes the length when some classes are absent."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import LABEL_INPUTS, metric_info


class PerClassAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, LABEL_INPUTS)

    def _compute(self, predictions, references, num_classes: int | None = None):
        return {"per_class_accuracy": cm.per_class_accuracy(references, predictions, num_classes).tolist()}
