"""Builders shared by the unit tests (the `tiny_vit` fixture in conftest.py uses them)."""

import torch

from hf_vit_scaling.models import build_model_from_preset, preset_config

NUM_CLASSES = 10
SIZE = 16  # vit-tiny-cpu at 16 px: 4 x 4 patches of 4 px + CLS = 17 tokens


def build_tiny_vit(seed: int = 0):
    torch.manual_seed(seed)
    return build_model_from_preset(preset_config("vit-tiny-cpu", [str(i) for i in range(NUM_CLASSES)], SIZE))
