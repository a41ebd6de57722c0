"""Mixup and CutMix per image (timm's `mode="elem"`), their Beta draws and boxes. The soft targets and the
soft-target cross-entropy they train with are losses (`losses/soft_target.py`)."""

import math
from dataclasses import dataclass

import torch


def box_mask(top, box_h, left, box_w, height: int, width: int) -> torch.Tensor:
    """(n, H, W) bool: rows [top, top + box_h) x columns [left, left + box_w), per image."""
    rows = torch.arange(height, device=top.device).view(1, height, 1)
    cols = torch.arange(width, device=top.device).view(1, 1, width)
    n = top.shape[0]
    in_rows = (rows >= top.view(n, 1, 1)) & (rows < (top + box_h).view(n, 1, 1))
    in_cols = (cols >= left.view(n, 1, 1)) & (cols < (left + box_w).view(n, 1, 1))
    return in_rows & in_cols


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
