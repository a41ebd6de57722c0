"""RandAugment / TrivialAugment on the device, batched, with timm's op set, magnitude scale and `rand-m9-mstd0.5`
spec strings; every op, magnitude and sign is drawn per image."""

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hf_vit_scaling.errors import UserInputError

LEVEL_DENOM = 10.0  # timm: magnitude m is on a 0-10 scale; an op's argument is a function of m / 10


# timm's `_RAND_TRANSFORMS` in its order; `inc1` swaps Posterize, Solarize and the four enhance ops for their
# "increasing" variants (stronger as m grows), timm's `_RAND_INCREASING_TRANSFORMS`.
RAND_AUGMENT_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)


RAND_AUGMENT_EXAMPLE = "rand-m9-mstd0.5-inc1"


@dataclass(frozen=True)
class RandAugmentSpec:
    """RandAugment (Cubuk et al. 2020) as timm parameterises it; TrivialAugment (Müller & Hutter 2021) is the case
    num_ops=1, prob=1, magnitude uniform in [0, magnitude] (magnitude_std=inf)."""

    num_ops: int = 2  # n: ops applied in sequence to each image, each drawn uniformly (with replacement)
    magnitude: float = 10.0  # m
    magnitude_std: float = 0.0  # mstd: per-application m ~ N(m, mstd); inf: m ~ U(0, m)
    magnitude_max: float = LEVEL_DENOM  # mmax: m is clipped to [0, mmax]
    increasing: bool = False  # inc1
    prob: float = 0.5  # p: each drawn op is applied with this probability (timm's RandAugment default)


def parse_rand_augment(spec: str, flag: str = "--rand_augment") -> RandAugmentSpec:
    """'rand-m9-mstd0.5-inc1' (DeiT), 'rand-m9-n2-mstd0.5-mmax10-p0.5', or 'trivial' (TrivialAugment's sampling:
    one op per image, strength uniform in [0, 10], always applied, over timm's increasing ops; other keys may follow,
    e.g. 'trivial-mmax10')."""
    fix = f"Fix: use timm's notation, e.g. {flag} {RAND_AUGMENT_EXAMPLE} or {flag} trivial."
    parts = spec.strip().split("-")
    if parts[0] == "rand":
        values = {}
    elif parts[0] == "trivial":
        values = dict(num_ops=1, magnitude=LEVEL_DENOM, magnitude_std=math.inf, increasing=True, prob=1.0)
    else:
        raise UserInputError(f"{flag} {spec!r} must start with 'rand' or 'trivial'. {fix}")
    keys = {
        "m": "magnitude",
        "n": "num_ops",
        "mstd": "magnitude_std",
        "mmax": "magnitude_max",
        "inc": "increasing",
        "p": "prob",
    }
    for part in parts[1:]:
        match = re.fullmatch(r"([a-z]+)(\d+(?:\.\d*)?)", part)
        if not match or match.group(1) not in keys:
            raise UserInputError(f"{flag} {spec!r}: cannot read {part!r} (keys: m, n, mstd, mmax, inc, p). {fix}")
        key, number = match.group(1), float(match.group(2))
        values[keys[key]] = number
    values["num_ops"] = int(values.get("num_ops", 2))
    values["increasing"] = bool(values.get("increasing", False))
    if values.get("magnitude_std", 0.0) > 100:  # timm: mstd > 100 means uniform sampling in [0, m]
        values["magnitude_std"] = math.inf
    parsed = RandAugmentSpec(**values)
    if parsed.num_ops < 1:
        raise UserInputError(f"{flag} {spec!r}: n must be >= 1 op per image. {fix}")
    if not 0.0 <= parsed.prob <= 1.0:
        raise UserInputError(f"{flag} {spec!r}: p is a probability and must be in [0, 1]. {fix}")
    if parsed.magnitude_max <= 0:
        raise UserInputError(f"{flag} {spec!r}: mmax must be > 0. {fix}")
    return parsed


def _per_image(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, 1, 1, 1)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """PIL's RGB -> L: L = R 299/1000 + G 587/1000 + B 114/1000 (ITU-R 601-2)."""
    return (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL ImageEnhance: degenerate + factor * (image - degenerate), clipped (factor 1 = the image)."""
    return (degenerate + _per_image(factor) * (x - degenerate)).clamp_(0.0, 1.0)


def _enhance_factor(frac, sign, increasing: bool) -> torch.Tensor:
    if increasing:  # timm: 1 +- 0.9 m/10, at least 0.1
        return (1.0 + sign * frac * 0.9).clamp(min=0.1)
    return frac * 1.8 + 0.1  # timm: [0.1, 1.9]


def auto_contrast(x, frac, sign, increasing, fill):
    """Per channel: stretch [min, max] to [0, 1]; a flat channel is left as it is."""
    low, high = x.amin(dim=(2, 3), keepdim=True), x.amax(dim=(2, 3), keepdim=True)
    return torch.where(high > low, (x - low) / (high - low).clamp(min=1e-12), x)


def equalize(x, frac, sign, increasing, fill):
    """PIL's ImageOps.equalize per channel on 8-bit values: step = (pixels - count of the top bin) // 255,
    lut[v] = (step // 2 + pixels below v) // step; step 0 (one distinct value) leaves the channel alone."""
    n, c, h, w = x.shape
    values = (x * 255).round_().clamp_(0, 255).long().view(n * c, h * w)
    hist = torch.zeros(n * c, 256, dtype=torch.long, device=x.device).scatter_add_(1, values, torch.ones_like(values))
    bins = torch.arange(256, device=x.device)
    top = torch.where(hist > 0, bins, -1).amax(dim=1, keepdim=True)
    step = torch.div(hist.sum(1, keepdim=True) - hist.gather(1, top), 255, rounding_mode="floor")
    below = hist.cumsum(1) - hist
    lut = torch.div(below + torch.div(step, 2, rounding_mode="floor"), step.clamp(min=1), rounding_mode="floor")
    lut = torch.where(step > 0, lut.clamp(max=255), bins)
    return (lut.gather(1, values).view(n, c, h, w).to(x.dtype)) / 255


def invert(x, frac, sign, increasing, fill):
    return 1.0 - x


def posterize(x, frac, sign, increasing, fill):
    """Keep the top `bits` bits of each 8-bit value; timm: bits = int(4 m/10) (inc1: 4 - that); 0 bits = black."""
    bits = torch.floor(frac * 4)
    if increasing:
        bits = 4 - bits
    scale = _per_image(torch.pow(2.0, 8 - bits))
    return torch.floor((x * 255).round_() / scale) * scale / 255


def solarize(x, frac, sign, increasing, fill):
    """Invert the 8-bit values >= threshold; timm: threshold = int(256 m/10) (inc1: 256 - that)."""
    threshold = torch.floor(frac * 256)
    if increasing:
        threshold = 256 - threshold
    v = x * 255
    return torch.where(v >= _per_image(threshold), 255 - v, v) / 255


def solarize_add(x, frac, sign, increasing, fill):
    """Add int(110 m/10) to the 8-bit values below 128, clipped at 255."""
    v = x * 255
    added = (v + _per_image(torch.floor(frac * 110))).clamp(max=255)
    return torch.where(v < 128, added, v) / 255


def color(x, frac, sign, increasing, fill):
    return _blend(_luma(x).expand_as(x), x, _enhance_factor(frac, sign, increasing))


def contrast(x, frac, sign, increasing, fill):
    """Blend with a flat image at the mean grey level (PIL rounds it to an 8-bit value)."""
    mean = (_luma(x).mean(dim=(1, 2, 3), keepdim=True) * 255).round() / 255
    return _blend(mean.expand_as(x), x, _enhance_factor(frac, sign, increasing))


def brightness(x, frac, sign, increasing, fill):
    return _blend(torch.zeros_like(x), x, _enhance_factor(frac, sign, increasing))


_SMOOTH = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13  # PIL ImageFilter.SMOOTH


def sharpness(x, frac, sign, increasing, fill):
    """Blend with PIL's SMOOTH-filtered image (border pixels kept, as torchvision's adjust_sharpness)."""
    kernel = _SMOOTH.to(x.device, x.dtype).expand(x.shape[1], 1, 3, 3)
    degenerate = x.clone()
    degenerate[..., 1:-1, 1:-1] = F.conv2d(x, kernel, groups=x.shape[1])
    return _blend(degenerate, x, _enhance_factor(frac, sign, increasing))


def warp(x: torch.Tensor, matrix: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Per-image affine warp as PIL's `Image.transform(AFFINE)`: `matrix` (n, 2, 3) maps an output point to the input
    point it samples, in pixel units with the origin at the top-left corner. Bilinear; outside the image: `fill`.

    In `affine_grid`'s normalised coordinates (align_corners=False) a pixel coordinate u in [0, W] is 2u/W - 1, so
    theta = N A N^-1 with N = [[2/W, 0, -1], [0, 2/H, -1], [0, 0, 1]].
    """
    n, _, h, w = x.shape
    to_norm = torch.tensor([[2 / w, 0, -1], [0, 2 / h, -1], [0, 0, 1]], device=x.device, dtype=x.dtype)
    from_norm = torch.tensor([[w / 2, 0, w / 2], [0, h / 2, h / 2], [0, 0, 1]], device=x.device, dtype=x.dtype)
    last_row = torch.tensor([0.0, 0.0, 1.0], device=x.device, dtype=x.dtype).expand(n, 1, 3)
    theta = (to_norm @ torch.cat([matrix.to(x.dtype), last_row], dim=1) @ from_norm)[:, :2]
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    fill = fill.to(x.device, x.dtype).view(1, -1, 1, 1)
    # Sampling x - fill with zero padding and adding fill back gives `fill` outside, blended smoothly at the edge.
    out = F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + fill
    return out.clamp_(0.0, 1.0)


def _affine(n, device, a=1.0, b=0.0, c=0.0, d=0.0, e=1.0, f=0.0) -> torch.Tensor:
    """(n, 2, 3) matrices [[a, b, c], [d, e, f]]; each entry a number or an (n,) tensor."""
    entries = [torch.as_tensor(v, device=device, dtype=torch.float32).expand(n) for v in (a, b, c, d, e, f)]
    return torch.stack(entries, dim=1).view(n, 2, 3)


def rotate(x, frac, sign, increasing, fill):
    """About the image centre by +-30 m/10 degrees."""
    n, _, h, w = x.shape
    angle = torch.deg2rad(sign * frac * 30.0)
    cos, sin = torch.cos(angle), torch.sin(angle)
    cx, cy = w / 2, h / 2
    matrix = _affine(n, x.device, cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy)
    return warp(x, matrix, fill)


def shear_x(x, frac, sign, increasing, fill):
    return warp(x, _affine(x.shape[0], x.device, b=sign * frac * 0.3), fill)  # PIL (1, f, 0, 0, 1, 0), f = +-0.3 m/10


def shear_y(x, frac, sign, increasing, fill):
    return warp(x, _affine(x.shape[0], x.device, d=sign * frac * 0.3), fill)


def translate_x_rel(x, frac, sign, increasing, fill):
    return warp(x, _affine(x.shape[0], x.device, c=sign * frac * 0.45 * x.shape[-1]), fill)  # +-45% m/10 of W


def translate_y_rel(x, frac, sign, increasing, fill):
    return warp(x, _affine(x.shape[0], x.device, f=sign * frac * 0.45 * x.shape[-2]), fill)


OP_FUNCTIONS = dict(
    zip(
        RAND_AUGMENT_OPS,
        (
            auto_contrast,
            equalize,
            invert,
            rotate,
            posterize,
            solarize,
            solarize_add,
            color,
            contrast,
            brightness,
            sharpness,
            shear_x,
            shear_y,
            translate_x_rel,
            translate_y_rel,
        ),
    )
)


class RandAugment:
    """RandAugment / TrivialAugment on a batch of [0, 1] images (n, 3, H, W), ops drawn per image.

    Per layer (num_ops of them), each image draws an op uniformly, whether it is applied (prob), a magnitude and a
    sign. The batch is then sorted by op so that each op runs once on its contiguous group (its share of the batch):
    the cost of one layer is about that of one op on the whole batch plus a gather and a scatter, and reading the group
    sizes is the layer's one host-device synchronisation.
    """

    def __init__(self, spec: RandAugmentSpec, fill=(0.5, 0.5, 0.5)):
        self.spec = spec
        self.fill = torch.tensor(fill, dtype=torch.float32)  # timm fills warped-in areas with the dataset mean
        self.ops = [OP_FUNCTIONS[name] for name in RAND_AUGMENT_OPS]

    def sample(self, n: int, device=None, generator=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer's per-image parameters: op index (len(ops) = not applied), magnitude m in [0, mmax], sign."""
        spec = self.spec
        op = torch.randint(len(self.ops), (n,), device=device, generator=generator)
        applied = torch.rand(n, device=device, generator=generator) < spec.prob
        op = torch.where(applied, op, len(self.ops))
        if math.isinf(spec.magnitude_std):
            magnitude = torch.rand(n, device=device, generator=generator) * spec.magnitude
        else:
            noise = torch.randn(n, device=device, generator=generator) * spec.magnitude_std
            magnitude = spec.magnitude + noise
        magnitude = magnitude.clamp(0.0, spec.magnitude_max)
        sign = torch.where(torch.rand(n, device=device, generator=generator) < 0.5, -1.0, 1.0)
        return op, magnitude, sign

    def apply(self, x: torch.Tensor, op: torch.Tensor, magnitude: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(op, stable=True)
        counts = torch.bincount(op, minlength=len(self.ops) + 1).tolist()
        xs, frac, sign = x[order], magnitude[order] / LEVEL_DENOM, sign[order]
        start = 0
        for index, count in enumerate(counts[: len(self.ops)]):  # the last group (not applied) stays as it is
            if count:
                group = slice(start, start + count)
                xs[group] = self.ops[index](xs[group], frac[group], sign[group], self.spec.increasing, self.fill)
            start += count
        return torch.empty_like(xs).index_copy_(0, order, xs)  # back to the batch's order

    def __call__(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        for _ in range(self.spec.num_ops):
            x = self.apply(x, *self.sample(x.shape[0], x.device, generator))
        return x
