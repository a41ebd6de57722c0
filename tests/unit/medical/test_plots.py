"""Tests `medical.plots`: the ROC curve and reliability diagram without matplotlib."""

import sys

import numpy as np
import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.medical.plots import save_roc_curve

# Fixed predictions, hand-counted: 4 negatives scored .7 .3 .2 .1 and 4 positives scored .9 .8 .4 .35.
LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 1])
SCORES = np.array([0.7, 0.3, 0.2, 0.1, 0.9, 0.8, 0.4, 0.35])


def test_plots_without_matplotlib_say_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserInputError, match=r"hf-vit-scaling\[plots\]"):
        save_roc_curve(str(tmp_path / "roc.png"), LABELS, SCORES)
