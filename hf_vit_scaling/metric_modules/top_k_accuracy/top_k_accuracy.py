"""Top-k accuracy: the fraction of images whose true class is among the k highest scores (`k`, default 5).

Inputs: `predictions`, per-class scores (logits or probabilities) of each image; `references`, integer labels."""

import evaluate

from hf_vit_scaling import classification_metrics as cm
from hf_vit_scaling.evaluation import SCORE_INPUTS, metric_info


class TopKAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, SCORE_INPUTS)

    def _compute(self, predictions, references, k: int = 5):
        return {"top_k_accuracy": cm.top_k_accuracy(references, predictions, k), "k": k}
