"""Top-k accuracy: the fraction of images whose true class is among the k highest scores (`k`, default 5).

Ties in scores are ranked by class index, lowest first, as `argmax` breaks them: an image counts when fewer than k
classes score higher than its true class or score the same with a lower index. So k = 1 gives exactly the accuracy
of argmax predictions, and a model that scores every class alike is not credited with the true class. E.g. scores
[1, 1, 0]: true class 0 is top-1; true class 1 is top-2, not top-1.

Inputs: `predictions`, per-class scores (logits or probabilities) of each image; `references`, integer labels."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import SCORE_INPUTS, metric_info


class TopKAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, SCORE_INPUTS)

    def _compute(self, predictions, references, k: int = 5):
        return {"top_k_accuracy": cm.top_k_accuracy(references, predictions, k), "k": k}
