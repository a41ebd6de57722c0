"""Expected calibration error: sum over equal-width confidence bins of |bin| / N x |accuracy - mean confidence|
(Guo et al. 2017, eq. 3), confidence being the largest class probability. `prediction_scores` holds each image's
class probabilities (rows summing to 1); `n_bins` defaults to 15."""

import evaluate

from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.evaluation.metric_loading import MULTICLASS_SCORE_INPUTS, metric_info


class ExpectedCalibrationError(evaluate.Metric):
    def _info(self):
        return metric_info(__doc__, MULTICLASS_SCORE_INPUTS)

    def _compute(self, prediction_scores, references, n_bins: int = 15):
        return {"expected_calibration_error": cm.expected_calibration_error(references, prediction_scores, n_bins)}
