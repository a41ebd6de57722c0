"""Tests `medical.statistics`: the threshold choice, the grouped bootstrap and the binary report."""

import numpy as np
import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation import classification_metrics as cm
from hf_vit_scaling.medical.plots import save_reliability_diagram, save_roc_curve
from hf_vit_scaling.medical.statistics import BINARY_REPORT_METRICS, binary_report, bootstrap_ci, choose_threshold

# Fixed predictions, hand-counted: 4 negatives scored .7 .3 .2 .1 and 4 positives scored .9 .8 .4 .35.
LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 1])
SCORES = np.array([0.7, 0.3, 0.2, 0.1, 0.9, 0.8, 0.4, 0.35])


def test_threshold_choice_on_validation():
    # J = TPR - FPR at each score: .9: .25; .8: .5; .7: .5 - .25; .4: .75 - .25 = .5; .35: 1 - .25 = .75 (max).
    chosen = choose_threshold(LABELS, SCORES)
    assert chosen == {
        "threshold": 0.35,
        "rule": "youden",
        "validation_sensitivity": 1.0,
        "validation_specificity": 0.75,
    }
    # The highest threshold with sensitivity >= 0.7 is .4 (3 of 4 positives), specificity 3 / 4.
    assert choose_threshold(LABELS, SCORES, "sensitivity", 0.7)["threshold"] == 0.4
    with pytest.raises(UserInputError, match="threshold rule"):
        choose_threshold(LABELS, SCORES, "f1")
    with pytest.raises(UserInputError, match=r"must be in \(0, 1\]"):
        choose_threshold(LABELS, SCORES, "sensitivity", 1.5)


def test_bootstrap_is_seeded_and_resamples_whole_groups():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 30)
    s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
    first = bootstrap_ci(cm.roc_auc, y, s, n_resamples=300, seed=3)
    assert first == bootstrap_ci(cm.roc_auc, y, s, n_resamples=300, seed=3)
    assert first["ci_low"] < first["value"] < first["ci_high"]
    # Three identical copies of every image, grouped: the same seed draws the same groups, so the interval equals the
    # image-level one on the originals (AUROC does not change when every image is tripled).
    tripled = bootstrap_ci(
        cm.roc_auc, np.repeat(y, 3), np.repeat(s, 3), groups=np.repeat(np.arange(60), 3), n_resamples=300, seed=3
    )
    assert tripled == pytest.approx(first)
    # Ungrouped, the copies pass for independent images and the interval shrinks: the reason to group.
    naive = bootstrap_ci(cm.roc_auc, np.repeat(y, 3), np.repeat(s, 3), n_resamples=300, seed=3)
    assert naive["ci_high"] - naive["ci_low"] < 0.8 * (first["ci_high"] - first["ci_low"])


def test_binary_report_and_plots(tmp_path):
    probs = np.stack([1 - SCORES, SCORES], axis=1)
    report = binary_report(LABELS, probs, threshold=0.5, n_resamples=50)
    assert report["roc_auc"]["value"] == 14 / 16 and report["sensitivity"]["value"] == 0.5
    assert report["specificity"]["value"] == 0.75 and report["confusion_matrix"] == [[3, 1], [2, 2]]
    for name in BINARY_REPORT_METRICS:
        assert report[name]["ci_low"] <= report[name]["value"] <= report[name]["ci_high"]
    roc = save_roc_curve(str(tmp_path / "roc.png"), LABELS, SCORES, threshold=0.5)
    reliability = save_reliability_diagram(str(tmp_path / "rel.png"), LABELS, probs)
    for path in (roc, reliability):
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
