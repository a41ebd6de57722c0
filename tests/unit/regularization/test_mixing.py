"""Tests `regularization.mixing`: Mixup/CutMix targets, label smoothing, Beta draws, the soft-target loss."""

import pytest
import torch
import torch.nn.functional as F

from hf_vit_scaling.losses.soft_target import soft_target_cross_entropy, soft_targets
from hf_vit_scaling.regularization.mixing import mix_batch, sample_beta

NUM_CLASSES, SIZE = 10, 16  # the tiny_vit fixture's classes and image size


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def labelled_images(n: int, size: int = 16) -> torch.Tensor:
    """Image i is the constant i + 1: a pixel's value says which image it came from."""
    return (torch.arange(n, dtype=torch.float32) + 1).view(n, 1, 1, 1).expand(n, 3, size, size).clone()


@pytest.mark.parametrize("mixup_alpha, cutmix_alpha", [(0.0, 1.0), (0.8, 0.0), (0.8, 1.0)])
def test_mix_targets_sum_to_one_and_match_the_pixels_mixed(mixup_alpha, cutmix_alpha):
    n = 64
    x = labelled_images(n)
    mixed, record = mix_batch(x, mixup_alpha, cutmix_alpha, prob=0.8, switch_prob=0.5, generator=generator(0))
    own = x[:, 0, 0, 0].view(n, 1, 1)
    other = x[record.partner, 0, 0, 0].view(n, 1, 1)
    plane = mixed[:, 0]
    is_cut = ((plane == own) | (plane == other)).all(dim=(1, 2)) & ~(plane == plane[:, :1, :1]).all(dim=(1, 2))
    for i in range(n):
        if record.partner[i] == i:
            continue  # the middle image of an odd batch is its own partner
        if is_cut[i]:  # CutMix: the exact fraction of own pixels
            assert (plane[i] == own[i]).float().mean().item() == pytest.approx(record.lam[i].item(), abs=1e-6)
        else:  # Mixup (or not mixed, lam 1): every pixel lam x own + (1 - lam) x other
            lam = ((plane[i] - other[i]) / (own[i] - other[i])).flatten()
            assert torch.allclose(lam, record.lam[i].expand_as(lam), atol=1e-5)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=generator(1))
    targets = soft_targets(labels, NUM_CLASSES, smoothing=0.1, record=record)
    assert torch.allclose(targets.sum(dim=1), torch.ones(n), atol=1e-6)
    smooth = soft_targets(labels, NUM_CLASSES, smoothing=0.1)
    lam = record.lam.view(n, 1)
    assert torch.allclose(targets, lam * smooth + (1 - lam) * smooth[record.partner], atol=1e-6)


def test_mix_probability_zero_leaves_images_and_targets_alone():
    x = labelled_images(8)
    mixed, record = mix_batch(x, 0.8, 1.0, prob=0.0, generator=generator(0))
    assert torch.equal(mixed, x) and torch.equal(record.lam, torch.ones(8))


def test_label_smoothing_targets():
    targets = soft_targets(torch.tensor([2, 0]), 4, smoothing=0.2)
    assert torch.allclose(targets, torch.tensor([[0.05, 0.05, 0.85, 0.05], [0.85, 0.05, 0.05, 0.05]]))


def test_sample_beta_moments():
    for alpha in (0.2, 0.8, 1.0, 3.0):
        lam = sample_beta(alpha, 40_000, generator=generator(0))
        assert ((lam >= 0) & (lam <= 1)).all()
        # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
        assert lam.mean().item() == pytest.approx(0.5, abs=0.01)
        assert lam.var().item() == pytest.approx(1 / (4 * (2 * alpha + 1)), rel=0.05)


def test_soft_target_cross_entropy_matches_torch():
    logits = torch.randn(8, NUM_CLASSES, generator=generator(0))
    labels = torch.randint(0, NUM_CLASSES, (8,), generator=generator(1))
    one_hot = soft_targets(labels, NUM_CLASSES)
    assert torch.allclose(soft_target_cross_entropy(logits, one_hot), F.cross_entropy(logits, labels))
    smoothed = soft_targets(labels, NUM_CLASSES, smoothing=0.1)
    assert torch.allclose(
        soft_target_cross_entropy(logits, smoothed), F.cross_entropy(logits, labels, label_smoothing=0.1)
    )
    total = F.cross_entropy(logits, labels, reduction="sum")
    assert torch.allclose(soft_target_cross_entropy(logits, one_hot, torch.tensor(20)), total / 20)
