"""The per-sample transforms that run in the data loader (host side): `ImageTransform` and its crop box."""

import numpy as np
import torch
from PIL import Image

from hf_vit_scaling.data.host_transforms import ImageTransform, random_resized_crop_box


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
