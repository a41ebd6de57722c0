"""Batch regularization on the device: RandAugment / TrivialAugment, random erasing, Mixup / CutMix with label
smoothing, and timm's evaluation centre crop.

Where it runs. The host path is unchanged: it hands over uint8 batches. On the device, `DevicePreprocessor` turns a
uint8 batch into normalised float pixels (random resized crop + flip) in a forward pre-hook on the model;
`BatchAugmenter.attach` adds a second pre-hook, registered after it, that augments that float batch, in training
only. `EvalCenterCrop.attach` adds a pre-hook registered *before* the preprocessor, for evaluation only.

Per-sample randomness. Every random choice is drawn per image, batched, from `generator` (None: the device's default
generator, which the Trainer seeds and saves in its checkpoints): RandAugment's op, magnitude and sign per image and
per layer; random erasing's box per image; Mixup's lam, CutMix's box and the Mixup-or-CutMix switch per image (timm's
`mode="elem"`; DeiT's default `"batch"` shares one lam per batch). kornia was measured and not used: its RandAugment
and TrivialAugment draw the operations once per batch (only magnitudes and signs per image), so every image of a batch
gets the same ops; see benchmarks/regularization_cost.py for the speed of both. The Trainer seeds every rank alike,
so with the default generator all ranks draw the same parameters at a given step (for different images), as the
DevicePreprocessor's crops do; a per-rank `generator` avoids that but is not saved in checkpoints.
Host-device synchronisations per training batch: one per RandAugment layer (the op group sizes), one for random
erasing (which images get noise), one or two for the Beta draws; nothing else waits for the device.

Order, as timm/DeiT apply them per image: RandAugment on [0, 1] pixels (the batch is un-normalised and normalised
again around it: two element-wise passes), random erasing on normalised pixels (noise ~ N(0, 1) there), then
Mixup/CutMix across the batch.

Labels. The forward pre-hook cannot see the labels (with `compute_loss_func` the Trainer keeps them out of the model),
so it records what it did: per image the weight lam of its own label and its partner in the batch. `loss`, given to
the Trainer as `compute_loss_func`, turns the hard labels into soft targets the way timm's `mixup_target` does: label
smoothing first, y = (1 - eps) one_hot + eps / C, then the mix y_i = lam_i y_i + (1 - lam_i) y_partner(i), and
computes soft-target cross-entropy. With `compute_loss_func` set the Trainer's own `LabelSmoother` never runs, so
smoothing is applied once. Evaluation forwards record nothing and get plain cross-entropy on hard labels (timm
evaluates with plain cross-entropy too).
"""

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.training.losses import reduce_per_image_loss

# ---------------------------------------------------------------- RandAugment / TrivialAugment spec (timm's notation)

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


# ---------------------------------------------------------------- the ops, batched, on [0, 1] pixels
# Each op takes x (n, 3, H, W) in [0, 1], frac = m / 10 (n,), sign (n,) of +-1 (timm negates the argument of the
# geometric and "increasing" enhance ops with probability 1/2) and returns x in [0, 1]. The arguments follow timm's
# `LEVEL_TO_ARG`; the pixel operations follow PIL's (ImageOps, ImageEnhance), which timm calls.


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


# ---------------------------------------------------------------- random erasing (Zhong et al. 2020, timm's defaults)


def random_erasing(
    x: torch.Tensor, prob: float, generator=None, area=(0.02, 1 / 3), aspect=(0.3, 1 / 0.3), attempts: int = 10
) -> torch.Tensor:
    """With probability `prob` per image, replace one rectangle by per-pixel N(0, 1) noise (timm's mode 'pixel', as
    DeiT; on normalised pixels that is noise around the dataset mean). Area fraction ~ U(area), log aspect ~
    U(log aspect); h = round(sqrt(A r)), w = round(sqrt(A / r)); the first of `attempts` draws with h < H and w < W is
    used (none: the image is left alone), at a uniformly drawn position. Returns a new tensor."""
    n, _, height, width = x.shape
    dev = x.device
    target = (
        (torch.rand(n, attempts, device=dev, generator=generator) * (area[1] - area[0]) + area[0]) * height * width
    )
    log_low, log_high = math.log(aspect[0]), math.log(aspect[1])
    ratio = torch.exp(torch.rand(n, attempts, device=dev, generator=generator) * (log_high - log_low) + log_low)
    box_h, box_w = torch.sqrt(target * ratio).round(), torch.sqrt(target / ratio).round()
    fits = (box_h < height) & (box_w < width)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first attempt that fits (0 when none does)
    box_h, box_w = box_h.gather(1, first).squeeze(1), box_w.gather(1, first).squeeze(1)
    erase = fits.any(dim=1) & (torch.rand(n, device=dev, generator=generator) < prob)
    top = torch.floor(torch.rand(n, device=dev, generator=generator) * (height - box_h + 1))
    left = torch.floor(torch.rand(n, device=dev, generator=generator) * (width - box_w + 1))
    mask = box_mask(top, box_h, left, box_w, height, width).unsqueeze(1)
    # Noise only for the images erased (reading their indices is one host-device synchronisation).
    erased = torch.nonzero(erase).squeeze(1)
    out = x.clone()
    if erased.numel():
        noise = torch.randn((erased.numel(), *x.shape[1:]), device=dev, generator=generator, dtype=x.dtype)
        out[erased] = torch.where(mask[erased], noise, x[erased])
    return out


def box_mask(top, box_h, left, box_w, height: int, width: int) -> torch.Tensor:
    """(n, H, W) bool: rows [top, top + box_h) x columns [left, left + box_w), per image."""
    rows = torch.arange(height, device=top.device).view(1, height, 1)
    cols = torch.arange(width, device=top.device).view(1, 1, width)
    n = top.shape[0]
    in_rows = (rows >= top.view(n, 1, 1)) & (rows < (top + box_h).view(n, 1, 1))
    in_cols = (cols >= left.view(n, 1, 1)) & (cols < (left + box_w).view(n, 1, 1))
    return in_rows & in_cols


# ---------------------------------------------------------------- Mixup (Zhang et al. 2018), CutMix (Yun et al. 2019)


def sample_beta(alpha: float, n: int, device=None, generator=None) -> torch.Tensor:
    """n draws of Beta(alpha, alpha) = G1 / (G1 + G2), G ~ Gamma(alpha), from `generator` (torch's own Beta
    sampler takes none). Gamma by Marsaglia & Tsang (2000): for a >= 1, d = a - 1/3, c = 1 / sqrt(9d), draw
    z ~ N(0, 1), v = (1 + cz)^3, accept d v when v > 0 and log u < z^2 / 2 + d - d v + d log v (accepts >= 95%);
    for a < 1, Gamma(a) = Gamma(a + 1) U^(1/a). Float64, so tiny alphas do not underflow to 0/0."""

    def gamma() -> torch.Tensor:
        shape = alpha + 1.0 if alpha < 1.0 else alpha
        d = shape - 1.0 / 3.0
        c = 1.0 / math.sqrt(9.0 * d)
        out = torch.zeros(n, dtype=torch.float64, device=device)
        todo = torch.ones(n, dtype=torch.bool, device=device)
        while bool(todo.any()):  # one or two rounds in practice; each reads one flag back from the device
            z = torch.randn(n, dtype=torch.float64, device=device, generator=generator)
            u = torch.rand(n, dtype=torch.float64, device=device, generator=generator)
            v = (1.0 + c * z) ** 3
            ok = (v > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp(min=1e-300)))
            out = torch.where(todo & ok, d * v, out)
            todo = todo & ~ok
        if alpha < 1.0:
            out = out * torch.rand(n, dtype=torch.float64, device=device, generator=generator) ** (1.0 / alpha)
        return out

    g1, g2 = gamma(), gamma()
    total = g1 + g2
    coin = (torch.rand(n, dtype=torch.float64, device=device, generator=generator) < 0.5).double()
    return torch.where(total > 0, g1 / total.clamp(min=1e-300), coin).float()


@dataclass
class MixRecord:
    """What Mixup/CutMix did to a batch: image i became lam_i x_i + (1 - lam_i) x_partner(i) (CutMix: lam_i is the
    exact fraction of its pixels kept)."""

    lam: torch.Tensor  # (n,) float
    partner: torch.Tensor  # (n,) long


def mix_batch(
    x: torch.Tensor,
    mixup_alpha: float,
    cutmix_alpha: float,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    generator=None,
) -> tuple[torch.Tensor, MixRecord]:
    """Mixup/CutMix per image, as timm's `Mixup(mode="elem")`: each image is mixed with probability `prob`, by
    CutMix with probability `switch_prob` when both alphas are > 0, with lam ~ Beta(alpha, alpha) of its method; its
    partner is the image at the mirrored position in the batch (x.flip(0), timm's pairing).
    CutMix's box (Yun et al.; timm `rand_bbox`): sides int(H sqrt(1 - lam)) x int(W sqrt(1 - lam)), centre uniform,
    half-sides floor-divided, clipped to the image; lam is then the kept area (timm's `correct_lam`)."""
    n, _, height, width = x.shape
    dev = x.device
    use_cutmix = torch.zeros(n, dtype=torch.bool, device=dev)
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = torch.rand(n, device=dev, generator=generator) < switch_prob
        lam = torch.where(
            use_cutmix, sample_beta(cutmix_alpha, n, dev, generator), sample_beta(mixup_alpha, n, dev, generator)
        )
    elif mixup_alpha > 0:
        lam = sample_beta(mixup_alpha, n, dev, generator)
    else:
        use_cutmix = torch.ones(n, dtype=torch.bool, device=dev)
        lam = sample_beta(cutmix_alpha, n, dev, generator)
    mixed = torch.rand(n, device=dev, generator=generator) < prob
    lam = torch.where(mixed, lam, 1.0)
    use_cutmix = use_cutmix & mixed

    cut = torch.sqrt(1.0 - lam)
    half_h, half_w = torch.floor(torch.floor(height * cut) / 2), torch.floor(torch.floor(width * cut) / 2)
    cy = torch.floor(torch.rand(n, device=dev, generator=generator) * height)
    cx = torch.floor(torch.rand(n, device=dev, generator=generator) * width)
    top, bottom = (cy - half_h).clamp(0, height), (cy + half_h).clamp(0, height)
    left, right = (cx - half_w).clamp(0, width), (cx + half_w).clamp(0, width)
    box = box_mask(top, bottom - top, left, right - left, height, width)
    # Weight of the image's own pixels: CutMix 0 inside the box, 1 outside; Mixup lam everywhere.
    weight = torch.where(use_cutmix.view(n, 1, 1), (~box).to(x.dtype), lam.view(n, 1, 1).to(x.dtype))
    kept = torch.where(use_cutmix, weight.mean(dim=(1, 2)), lam)
    partner = torch.arange(n - 1, -1, -1, device=dev)
    # lerp(partner, own, w) = partner + w (own - partner) = w own + (1 - w) partner, in one pass.
    return torch.lerp(x.flip(0), x, weight.unsqueeze(1)), MixRecord(kept, partner)  # x.flip(0) = x[partner]


# ---------------------------------------------------------------- targets and the loss


def soft_targets(
    labels: torch.Tensor, num_classes: int, smoothing: float = 0.0, record: MixRecord | None = None
) -> torch.Tensor:
    """(n, C) float targets: smoothed one-hot (1 - eps + eps/C on the label, eps/C elsewhere: each row sums to 1),
    then mixed with the partner's row as the pixels were (timm's `mixup_target`)."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device, dtype=torch.float32)
    targets.scatter_(1, labels.view(-1, 1).long(), 1.0 - smoothing + off)
    if record is not None:
        lam = record.lam.to(targets.device).view(-1, 1)
        targets = lam * targets + (1.0 - lam) * targets[record.partner.to(targets.device)]
    return targets


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """sum_c -targets_c log softmax(logits)_c per image, in float32; the mean over the batch, or, with
    `num_items_in_batch` (the Trainer's count over the whole accumulated, all-rank batch), the sum divided by it:
    the same reduction as transformers' `fixed_cross_entropy`, so the Trainer's loss scaling stays right."""
    per_image = -(targets * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)
    return reduce_per_image_loss(per_image, num_items_in_batch)


@dataclass
class _TrainingForward:
    batch_size: int
    record: MixRecord | None  # None: this batch was not mixed


class BatchAugmenter:
    """Training-time batch augmentation on the device: (normalised pixels, labels) -> (pixels, soft targets).

    Use it as two hooks into the Trainer: `attach(model)` after `DevicePreprocessor.attach(model)`, and
    `Trainer(compute_loss_func=augmenter.loss)` when `produces_soft_targets`. Works on any float batch, so on the
    per-sample input path too. `generator` (optional) must live on the model's device.
    """

    def __init__(
        self,
        num_classes: int,
        mean,
        std,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        label_smoothing: float = 0.0,
        rand_augment: str | RandAugmentSpec | None = None,
        random_erasing: float = 0.0,
        generator=None,
    ):
        self.num_classes = num_classes
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.mixup_prob, self.mixup_switch_prob = mixup_prob, mixup_switch_prob
        self.label_smoothing = label_smoothing
        if isinstance(rand_augment, str):
            rand_augment = parse_rand_augment(rand_augment)
        self.rand_augment = RandAugment(rand_augment, fill=mean) if rand_augment else None
        self.random_erasing = random_erasing
        self.generator = generator
        self._last: _TrainingForward | None = None
        self._handle = None

    @classmethod
    def from_arguments(cls, args, num_classes: int, mean, std, label_smoothing: float = 0.0, generator=None):
        """From `RegularizationArguments` (+ TrainingArguments.label_smoothing_factor)."""
        return cls(
            num_classes,
            mean,
            std,
            mixup_alpha=args.mixup_alpha,
            cutmix_alpha=args.cutmix_alpha,
            mixup_prob=args.mixup_prob,
            mixup_switch_prob=args.mixup_switch_prob,
            label_smoothing=label_smoothing,
            rand_augment=args.rand_augment,
            random_erasing=args.random_erasing,
            generator=generator,
        )

    @property
    def mixes(self) -> bool:
        return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.mixup_prob > 0

    @property
    def produces_soft_targets(self) -> bool:
        return self.mixes or self.label_smoothing > 0

    @property
    def active(self) -> bool:
        """False: nothing to do (no hook, no loss function needed)."""
        return self.produces_soft_targets or self.rand_augment is not None or self.random_erasing > 0

    def augment(self, pixels: torch.Tensor) -> tuple[torch.Tensor, MixRecord | None]:
        """Normalised float pixels -> augmented pixels, and what Mixup/CutMix did (None: not mixed)."""
        with torch.no_grad():
            x = pixels
            if self.rand_augment is not None:
                mean, std = self.mean.to(x.device, x.dtype), self.std.to(x.device, x.dtype)
                x = (self.rand_augment((x * std + mean).clamp_(0.0, 1.0), self.generator) - mean) / std
            if self.random_erasing > 0:
                x = random_erasing(x, self.random_erasing, self.generator)
            record = None
            if self.mixes:
                x, record = mix_batch(
                    x, self.mixup_alpha, self.cutmix_alpha, self.mixup_prob, self.mixup_switch_prob, self.generator
                )
        return x, record

    def targets(self, labels: torch.Tensor, record: MixRecord | None) -> torch.Tensor:
        return soft_targets(labels, self.num_classes, self.label_smoothing, record)

    def __call__(self, pixels: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pixels, record = self.augment(pixels)
        return pixels, self.targets(labels, record)

    def attach(self, model: torch.nn.Module):
        """Forward pre-hook: training forwards get augmented pixels (and their mix is recorded for `loss`);
        evaluation forwards are untouched. Register after the DevicePreprocessor's hook (hooks run in order)."""

        def pre_hook(module, args, kwargs):
            pixels = kwargs.get("pixel_values")
            if not module.training or pixels is None:
                self._last = None
                return args, kwargs
            if pixels.dtype == torch.uint8:
                raise RuntimeError(
                    "BatchAugmenter got uint8 pixels: attach it after DevicePreprocessor.attach, so "
                    "that it runs on the normalised float batch."
                )
            kwargs["pixel_values"], record = self.augment(pixels)
            self._last = _TrainingForward(pixels.shape[0], record)
            return args, kwargs

        self._handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        return self._handle

    def loss(self, outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """The Trainer's `compute_loss_func`: soft-target cross-entropy after a training forward (smoothing + the
        recorded mix), plain cross-entropy on hard labels after an evaluation forward."""
        if self._handle is None:
            raise RuntimeError("BatchAugmenter.loss needs the forward hook: call attach(model) first.")
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        last, self._last = self._last, None
        if last is None:
            targets = soft_targets(labels, self.num_classes)
        else:
            if last.batch_size != labels.shape[0]:
                raise RuntimeError(
                    f"BatchAugmenter.loss: {labels.shape[0]} labels for a forward of "
                    f"{last.batch_size} images; each training forward must be followed by its loss."
                )
            targets = self.targets(labels, last.record)
        return soft_target_cross_entropy(logits, targets, num_items_in_batch)


# ---------------------------------------------------------------- evaluation crop (timm's crop_pct)


class EvalCenterCrop:
    """timm's evaluation transform on the device: resize the shorter side to floor(size / crop_pct), then centre
    crop size x size (top = round((H' - size) / 2)). E.g. 224 px at crop_pct 0.875: resize to 256, keep the centre
    224. Runs on the uint8 batch and returns uint8 (as PIL does), before the DevicePreprocessor, which then only
    normalises. Bilinear with antialias, as the rest of the device path."""

    def __init__(self, size: int, crop_pct: float):
        self.size, self.crop_pct = size, crop_pct

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        short = math.floor(self.size / self.crop_pct)
        if height <= width:  # torchvision's Resize(int): the longer side is int(short * long / short_side)
            return short, int(short * width / height)
        return int(short * height / width), short

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        new_h, new_w = self.resized_shape(*pixels.shape[-2:])
        x = F.interpolate(pixels.float(), size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
        top, left = int(round((new_h - self.size) / 2.0)), int(round((new_w - self.size) / 2.0))
        x = x[..., top : top + self.size, left : left + self.size]
        return x.round_().clamp_(0, 255).to(torch.uint8)

    def attach(self, model: torch.nn.Module):
        """Forward pre-hook, placed first: evaluation forwards with uint8 pixels get the resize + centre crop."""

        def pre_hook(module, args, kwargs):
            pixels = kwargs.get("pixel_values")
            if not module.training and pixels is not None and pixels.dtype == torch.uint8:
                kwargs["pixel_values"] = self(pixels)
            return args, kwargs

        return model.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True)
