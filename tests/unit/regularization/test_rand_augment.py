"""Tests `regularization.rand_augment`: every op's shape, dtype and range, fidelity to PIL, spec parsing."""

import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.regularization.rand_augment import (
    OP_FUNCTIONS,
    RAND_AUGMENT_OPS,
    RandAugmentSpec,
    parse_rand_augment,
)

MEAN = STD = (0.5, 0.5, 0.5)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", RAND_AUGMENT_OPS)
@pytest.mark.parametrize("increasing", [False, True])
def test_every_op_keeps_shape_dtype_and_range(name, increasing):
    x = torch.rand(6, 3, 20, 20, generator=generator(0))
    frac = torch.linspace(0, 1, 6)
    sign = torch.tensor([1.0, -1.0] * 3)
    y = OP_FUNCTIONS[name](x.clone(), frac, sign, increasing, torch.tensor(MEAN))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.min() >= 0 and y.max() <= 1


def _pil_image() -> Image.Image:
    rng = np.random.default_rng(0)
    array = (rng.random((32, 32, 3)) ** 2 * 200 + 20).astype(np.uint8)
    array[8:20, 5:25] = 240
    return Image.fromarray(array)


def _ours(image: Image.Image, name: str, frac: float, sign: float = 1.0, increasing: bool = False) -> np.ndarray:
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1).float().div(255).unsqueeze(0)
    fill = torch.tensor([128 / 255] * 3)
    y = OP_FUNCTIONS[name](x, torch.tensor([frac]), torch.tensor([sign]), increasing, fill)
    return (y[0].permute(1, 2, 0) * 255).round().numpy()


def test_pixel_ops_match_pil_within_one_level():
    """timm runs these ops through PIL; ours agree to within one 8-bit level (rounding)."""
    image = _pil_image()
    m = 0.9  # magnitude 9 of 10
    expected = {
        ("AutoContrast", False): ImageOps.autocontrast(image),
        ("Equalize", False): ImageOps.equalize(image),
        ("Invert", False): ImageOps.invert(image),
        ("Posterize", False): ImageOps.posterize(image, int(4 * m)),
        ("Posterize", True): ImageOps.posterize(image, 4 - int(4 * m)),
        ("Solarize", False): ImageOps.solarize(image, int(256 * m)),
        ("Solarize", True): ImageOps.solarize(image, 256 - int(256 * m)),
        ("SolarizeAdd", False): image.point([min(255, i + int(110 * m)) if i < 128 else i for i in range(256)] * 3),
    }
    for name, enhancer in (
        ("Color", ImageEnhance.Color),
        ("Contrast", ImageEnhance.Contrast),
        ("Brightness", ImageEnhance.Brightness),
        ("Sharpness", ImageEnhance.Sharpness),
    ):
        expected[(name, False)] = enhancer(image).enhance(m * 1.8 + 0.1)
        expected[(name, True)] = enhancer(image).enhance(1.0 + m * 0.9)
    for (name, increasing), reference in expected.items():
        diff = np.abs(np.asarray(reference, dtype=float) - _ours(image, name, m, 1.0, increasing))
        assert diff.max() <= 1.0, (name, increasing, diff.max())


def test_geometric_ops_match_pil_on_average():
    """Bilinear warps agree with PIL's to about one level on average (they differ only along the image border)."""
    image = _pil_image()
    kw = dict(resample=Image.BILINEAR, fillcolor=(128, 128, 128))
    cases = {
        "ShearX": image.transform(image.size, Image.AFFINE, (1, 0.27, 0, 0, 1, 0), **kw),
        "ShearY": image.transform(image.size, Image.AFFINE, (1, 0, 0, 0.27, 1, 0), **kw),
        "TranslateXRel": image.transform(image.size, Image.AFFINE, (1, 0, 0.405 * 32, 0, 1, 0), **kw),
        "TranslateYRel": image.transform(image.size, Image.AFFINE, (1, 0, 0, 0, 1, 0.405 * 32), **kw),
        "Rotate": image.rotate(27, **kw),
    }
    for name, reference in cases.items():
        diff = np.abs(np.asarray(reference, dtype=float) - _ours(image, name, 0.9))
        assert diff.mean() < 1.5, (name, diff.mean())


def test_parse_rand_augment_specs():
    deit = parse_rand_augment("rand-m9-mstd0.5-inc1")
    assert deit == RandAugmentSpec(num_ops=2, magnitude=9, magnitude_std=0.5, increasing=True, prob=0.5)
    assert parse_rand_augment("rand-n3-m7-p1.0-mmax12").num_ops == 3
    assert math.isinf(parse_rand_augment("rand-m9-mstd101").magnitude_std)
    trivial = parse_rand_augment("trivial")
    assert (trivial.num_ops, trivial.prob, trivial.increasing) == (1, 1.0, True)
    assert math.isinf(trivial.magnitude_std)
    for bad in ("autoaug-m9", "rand-q9", "rand-m9-mstd", "rand-n0", "rand-p1.5"):
        with pytest.raises(UserInputError, match="--rand_augment") as err:
            parse_rand_augment(bad)
        assert "Fix:" in str(err.value)
