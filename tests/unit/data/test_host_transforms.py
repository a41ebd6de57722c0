"""The per-sample transforms that run in the data loader (host side): `ImageTransform`, its crop box, and the crop and
flip defaults by image size (`crops_at`, `flips_at`)."""

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_scaling.data.host_transforms import ImageTransform, crops_at, flips_at, random_resized_crop_box


def test_eval_transform_is_deterministic_and_train_augments():
    img = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4, mode="L")
    eval_t = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=False)
    assert torch.equal(eval_t(img), eval_t(img))
    train_t = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=True, crop_scale_min=0.3, horizontal_flip=True)
    torch.manual_seed(0)
    outs = [train_t(img) for _ in range(8)]
    assert all(o.shape == (3, 16, 16) for o in outs)
    assert any(not torch.equal(outs[0], o) for o in outs[1:])
    no_aug = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=True, random_resized_crop=False, horizontal_flip=False)
    assert torch.equal(no_aug(img), eval_t(img))


def test_random_resized_crop_box_stays_inside_and_respects_scale():
    torch.manual_seed(0)
    for _ in range(200):
        top, left, h, w = random_resized_crop_box(30, 40, 0.5)
        assert 0 <= top and top + h <= 30 and 0 <= left and left + w <= 40
        assert h * w >= 0.5 * 30 * 40 * 0.9  # rounding slack


@pytest.mark.parametrize("flag, size, crops", [(None, 28, False), (None, 63, False), (None, 64, True),
                                               (None, 224, True), (True, 28, True), (False, 224, False)])  # fmt: skip
def test_crop_and_flip_default_by_image_size_unless_given(flag, size, crops):
    assert crops_at(flag, size) is crops
    assert flips_at(flag, size) is crops
