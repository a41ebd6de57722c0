"""Fixtures shared by the unit tests of several sub-packages (regularization, data, training)."""

import pytest
import torch

from hf_vit_scaling.models.presets import build_model_from_preset, preset_config


@pytest.fixture
def tiny_vit():
    """vit-tiny-cpu at 16 px (4 x 4 patches of 4 px + CLS = 17 tokens), 10 classes, seeded."""
    torch.manual_seed(0)
    return build_model_from_preset(preset_config("vit-tiny-cpu", [str(i) for i in range(10)], 16))
