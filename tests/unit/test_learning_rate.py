"""Learning-rate scaling with the global batch."""

import pytest

from hf_vit_scaling import scaled_learning_rate


def test_lr_scaling_rules():
    assert scaled_learning_rate(1e-4, 512, 64, "linear") == pytest.approx(8e-4)
    assert scaled_learning_rate(1e-4, 512, 64, "sqrt") == pytest.approx(1e-4 * 8**0.5)
    assert scaled_learning_rate(1e-4, 512, 64, "none") == 1e-4
