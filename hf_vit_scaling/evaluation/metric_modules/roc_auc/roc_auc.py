"""Area under the ROC curve. Default ("binary"): `prediction_scores` is each image's score for the positive class
(label 1). Config "multiclass": `prediction_scores` holds each image's class probabilities, and the result is the
unweighted mean of the one-vs-rest areas."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import BINARY_SCORE_INPUTS, MULTICLASS_SCORE_INPUTS, metric_info


class RocAuc(evaluate.Metric):
    def _info(self):
        inputs = MULTICLASS_SCORE_INPUTS if self.config_name == "multiclass" else BINARY_SCORE_INPUTS
        return metric_info(__doc__, inputs)

    def _compute(self, prediction_scores, references):
        multi_class = "ovr" if self.config_name == "multiclass" else None
        return {"roc_auc": cm.roc_auc(references, prediction_scores, multi_class)}
