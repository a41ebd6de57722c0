"""The reconstruction picture (pretraining/reconstruction.py): the masked column hides exactly the patches the model
masked, the reconstruction shows the visible patches as given and the decoder's prediction elsewhere, and the PNG
has one row per image and three columns."""

import torch
from PIL import Image
from transformers import ViTMAEConfig, ViTMAEForPreTraining

from hf_vit_scaling.pretraining.reconstruction import (
    COLUMNS,
    GAP,
    MASK_VALUE,
    MIN_CELL,
    read_layout,
    reconstruct,
    save_reconstructions,
)


def tiny_mae(norm_pix_loss: bool) -> ViTMAEForPreTraining:
    config = ViTMAEConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, decoder_hidden_size=8, decoder_num_hidden_layers=1,
                          decoder_num_attention_heads=2, decoder_intermediate_size=16, mask_ratio=0.5,
                          norm_pix_loss=norm_pix_loss)  # fmt: skip
    torch.manual_seed(0)
    return ViTMAEForPreTraining(config)


def patch(images: torch.Tensor, b: int, p: int) -> torch.Tensor:
    row, col = divmod(p, 2)
    return images[b, :, row * 4 : row * 4 + 4, col * 4 : col * 4 + 4]


def test_masked_and_reconstructed_columns_follow_the_models_mask():
    model = tiny_mae(norm_pix_loss=False).train()
    pixels = torch.randn(8, 3, 8, 8)
    images = reconstruct(model, pixels, seed=3)
    assert model.training  # mode restored
    assert torch.equal(images["original"], pixels)  # no input hooks here: the model saw the batch itself
    noise = torch.rand(8, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model.eval()(pixel_values=pixels, noise=noise)
    predicted = model.unpatchify(out.logits)
    for b in range(8):
        assert out.mask[b].sum() == 2  # mask ratio 0.5 of 4 patches
        for p in range(4):
            if out.mask[b, p]:
                assert torch.all(patch(images["masked"], b, p) == MASK_VALUE)
                assert torch.allclose(patch(images["reconstruction"], b, p), patch(predicted, b, p), atol=1e-6)
            else:
                assert torch.equal(patch(images["masked"], b, p), patch(pixels, b, p))
                assert torch.allclose(patch(images["reconstruction"], b, p), patch(pixels, b, p), atol=1e-6)


def test_norm_pix_predictions_are_put_back_in_pixel_space():
    # With norm_pix_loss the decoder predicts each patch normalised by its own statistics: a masked patch of the
    # reconstruction is prediction x std + mean of the original patch (here: a constant patch of 5 gives mean 5).
    model = tiny_mae(norm_pix_loss=True)
    pixels = torch.full((1, 3, 8, 8), 5.0)
    images = reconstruct(model, pixels, seed=0)
    masked = [p for p in range(4) if torch.all(patch(images["masked"], 0, p) == MASK_VALUE)]
    assert len(masked) == 2
    for p in masked:  # std ~ sqrt(1e-6): the prediction contributes ~1e-3 x logits
        assert torch.allclose(patch(images["reconstruction"], 0, p), torch.full((3, 4, 4), 5.0), atol=0.01)


def test_png_has_a_row_per_image_and_three_columns(tmp_path):
    model = tiny_mae(norm_pix_loss=True)
    images = reconstruct(model, torch.rand(8, 3, 8, 8) * 2 - 1, seed=0)
    path = tmp_path / "reconstructions.png"
    save_reconstructions(str(path), images, [0.5] * 3, [0.5] * 3, 0.5)
    layout = read_layout(str(path))
    cell = MIN_CELL  # 8 px images enlarged 8x
    assert layout == {"rows": 8, "columns": list(COLUMNS), "size": (GAP + 3 * (cell + GAP), GAP + 8 * (cell + GAP))}
    with Image.open(path) as picture:
        pixel = picture.convert("RGB").getpixel((GAP + 1, GAP + 1))  # the first original image, top-left pixel
    expected = ((images["original"][0, :, 0, 0] * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).tolist()
    assert list(pixel) == expected
