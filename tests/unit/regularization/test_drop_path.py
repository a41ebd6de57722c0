"""Tests `regularization.drop_path`: stochastic depth on a tiny ViT."""

import math

import pytest
import torch
from transformers import ViTForImageClassification

from hf_vit_scaling.regularization.drop_path import DropPath, drop_path_rates, vit_blocks

SIZE = 16  # the tiny_vit fixture's image size


def pixels(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def test_drop_path_rates_rise_linearly_over_depth():
    assert drop_path_rates(4, 0.3) == pytest.approx([0.0, 0.1, 0.2, 0.3])  # DeiT: linspace(0, rate, L)
    assert drop_path_rates(12, 0.1)[-1] == pytest.approx(0.1)
    assert drop_path_rates(1, 0.5) == [0.0]


def test_drop_path_is_the_identity_in_eval_and_leaves_a_plain_saved_model(tiny_vit, tmp_path):
    tiny_vit.eval()
    x = pixels(8)
    with torch.no_grad():
        before = tiny_vit(pixel_values=x).logits
        DropPath(tiny_vit, 0.5)
        assert torch.equal(tiny_vit(pixel_values=x).logits, before)
        tiny_vit.save_pretrained(tmp_path)
        reloaded = ViTForImageClassification.from_pretrained(tmp_path).eval()
        assert type(reloaded) is ViTForImageClassification
        assert torch.allclose(reloaded(pixel_values=x).logits, before, atol=1e-6)


def test_drop_path_drops_whole_branches_per_image_at_the_configured_rates(tiny_vit):
    """Each (image, branch) is either all zeros or the undropped output x 1 / (1 - p); the dropped fraction over
    n images is within 4.5 standard deviations (sqrt(p (1 - p) / n)) of p."""
    n, rate = 1500, 0.6
    drop = DropPath(tiny_vit, rate)
    assert drop.rates == pytest.approx([0.0, 0.2, 0.4, 0.6])
    seen = {}

    def observer(key, stage):
        def hook(module, args, output):
            seen[(key, stage)] = (output[0] if isinstance(output, tuple) else output).detach()

        return hook

    for i, (_, layer) in enumerate(vit_blocks(tiny_vit)[1]):
        for branch_name in ("attention", "mlp"):
            branch = getattr(layer, branch_name)
            branch.register_forward_hook(observer((i, branch_name), "raw"), prepend=True)  # before the drop
            branch.register_forward_hook(observer((i, branch_name), "out"))  # after it
    tiny_vit.train()
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_vit(pixel_values=pixels(n))
    for i, p in enumerate(drop.rates):
        for branch_name in ("attention", "mlp"):
            check_branch(seen[((i, branch_name), "raw")], seen[((i, branch_name), "out")], p, n, (i, branch_name))
    drop.remove()
    with torch.no_grad():
        tiny_vit(pixel_values=pixels(4))
    assert torch.equal(seen[((3, "mlp"), "raw")], seen[((3, "mlp"), "out")])


def check_branch(raw, out, p, n, where):
    dropped = (out == 0).flatten(1).all(dim=1)
    kept = torch.isclose(out, raw / (1 - p), rtol=1e-5, atol=1e-6).flatten(1).all(dim=1)
    assert torch.equal(dropped | kept, torch.ones(n, dtype=torch.bool)), where
    tolerance = 4.5 * math.sqrt(p * (1 - p) / n)
    assert dropped.float().mean().item() == pytest.approx(p, abs=tolerance + 1e-9), where
