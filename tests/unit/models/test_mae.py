"""MAE models (models/mae.py): the pretraining loss counts only the masked patches (hand-computed on a tiny batch,
with and without norm_pix_loss); the encoder is the ViT preset's; a saved MAE's encoder loads whole into a
ViTForImageClassification (every tensor equal), and a checkpoint missing an encoder tensor or with one of the wrong
shape is refused with one error."""

import json
import logging
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import ViTMAEConfig, ViTMAEForPreTraining

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.mae import (
    DECODER_PRESETS,
    PRETRAINING_FILENAME,
    mae_config,
    pretraining_summary,
    vit_config_from_mae,
)
from hf_vit_scaling.models.presets import (
    MODEL_PRESETS,
    build_model_from_preset,
    image_processor_for,
    load_model_for_finetuning,
    mae_sincos_table,
    preset_config,
)

LABELS = ["a", "b", "c"]


def tiny_mae_config(norm_pix_loss=True, mask_ratio=0.75) -> ViTMAEConfig:
    return ViTMAEConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, decoder_hidden_size=8, decoder_num_hidden_layers=1,
                        decoder_num_attention_heads=2, decoder_intermediate_size=16, mask_ratio=mask_ratio,
                        norm_pix_loss=norm_pix_loss)  # fmt: skip


def hand_loss(pixels: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor, norm_pix_loss: bool) -> float:
    """MAE's loss written out patch by patch: each masked patch's mean squared error over its 4x4x3 pixels (each
    patch's pixels normalised by their own mean and unbiased variance first when `norm_pix_loss`), averaged over
    the masked patches; visible patches count nothing."""
    total, count = 0.0, 0
    for b in range(pixels.shape[0]):
        for row in range(2):
            for col in range(2):
                p = row * 2 + col
                if mask[b, p] == 0:
                    continue
                patch = pixels[b, :, row * 4 : row * 4 + 4, col * 4 : col * 4 + 4].permute(1, 2, 0).reshape(-1)
                if norm_pix_loss:
                    patch = (patch - patch.mean()) / (patch.var() + 1e-6) ** 0.5
                total += float(((logits[b, p] - patch) ** 2).mean())
                count += 1
    return total / count


@pytest.mark.parametrize("norm_pix_loss", [True, False])
def test_loss_counts_only_masked_patches_and_matches_a_hand_computed_value(norm_pix_loss):
    torch.manual_seed(0)
    model = ViTMAEForPreTraining(tiny_mae_config(norm_pix_loss)).eval()
    pixels = torch.randn(2, 3, 8, 8)
    noise = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.8, 0.2, 0.6, 0.3]])  # keeps patch 0 of image 0, 1 of image 1
    with torch.no_grad():
        out = model(pixel_values=pixels, noise=noise)
    assert out.mask.tolist() == [[0, 1, 1, 1], [1, 0, 1, 1]]  # int(4 x 0.25) = 1 visible patch per image
    expected = hand_loss(pixels, out.logits, out.mask, norm_pix_loss)
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)

    # A prediction on a visible patch does not count; on a masked one it does.
    def shift(patch_index):
        def hook(module, args, output):
            output = output.clone()
            output[:, 1 + patch_index] += 100.0  # decoder_pred runs on CLS + patches
            return output

        return model.decoder.decoder_pred.register_forward_hook(hook)

    handle = shift(0)  # patch 0: visible in image 0, masked in image 1
    with torch.no_grad():
        shifted = model(pixel_values=pixels, noise=noise).loss.item()
    handle.remove()
    assert shifted > out.loss.item() + 100
    only_visible = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.1, 0.9, 0.5, 0.7]])  # patch 0 visible in both images
    with torch.no_grad():
        base = model(pixel_values=pixels, noise=only_visible).loss.item()
        handle = shift(0)
        visible_shifted = model(pixel_values=pixels, noise=only_visible).loss.item()
    handle.remove()
    assert visible_shifted == base


def test_encoder_is_the_vit_preset_and_decoder_the_preset_row():
    vit = preset_config("vit-b-16", LABELS)
    config = mae_config(vit, 0.75, True, DECODER_PRESETS["vit-b-16"])
    for key, value in MODEL_PRESETS["vit-b-16"].items():
        assert getattr(config, key) == value, key
    assert (config.decoder_hidden_size, config.decoder_num_hidden_layers) == (512, 8)  # He et al. 2021, Table 1
    assert config.mask_ratio == 0.75 and config.norm_pix_loss
    classifier = vit_config_from_mae(config)  # what fine-tuning builds: the same encoder, no decoder
    assert classifier.model_type == "vit" and not hasattr(classifier, "decoder_hidden_size")
    assert all(getattr(classifier, key) == value for key, value in MODEL_PRESETS["vit-b-16"].items())
    with pytest.raises(UserInputError, match="--decoder_hidden_size 30 is not a multiple"):
        mae_config(vit, 0.75, True, {**DECODER_PRESETS["vit-b-16"], "decoder_hidden_size": 30})


def save_tiny_mae(path, seed=0) -> ViTMAEForPreTraining:
    torch.manual_seed(seed)
    vit = preset_config("vit-tiny-cpu", LABELS, image_size=16)
    config = mae_config(vit, 0.75, True, DECODER_PRESETS["vit-tiny-cpu"])
    model = build_model_from_preset(config)
    with torch.no_grad():  # every encoder tensor distinct from a fresh classifier's
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(path)
    image_processor_for(config).save_pretrained(path)
    return model


def test_finetuning_loads_every_encoder_tensor_of_a_saved_mae(tmp_path, caplog):
    mae = save_tiny_mae(tmp_path / "mae")
    with caplog.at_level(logging.INFO, logger="hf_vit_scaling"):
        model = load_model_for_finetuning(str(tmp_path / "mae"), LABELS)
    loaded = model.state_dict()
    encoder = {k: v for k, v in mae.state_dict().items() if k.startswith("vit.")}
    assert len(encoder) == 4 * 16 + 6  # 4 layers of 16 tensors, cls, position table, patch conv (2), final norm (2)
    assert set(loaded) == set(encoder) | {"classifier.weight", "classifier.bias"}
    for name, tensor in encoder.items():  # the fixed sin-cos position table included
        assert torch.equal(loaded[name], tensor), name
    assert model.vit.embeddings.position_embeddings.requires_grad  # trained when fine-tuning, as MAE's models_vit
    saved = load_file(str(tmp_path / "mae" / "model.safetensors"))
    decoder = sum(k.startswith("decoder.") for k in saved)
    assert (f"Loaded 70/70 encoder tensors from the MAE checkpoint {tmp_path / 'mae'}; dropped {decoder} decoder "
            "tensors; new: classifier.bias, classifier.weight") in caplog.text  # fmt: skip
    assert model.classifier.weight.shape == (3, 96)


@pytest.mark.parametrize("damage", ["missing", "wrong_shape"])
def test_an_mae_checkpoint_without_a_whole_encoder_is_refused(tmp_path, damage):
    save_tiny_mae(tmp_path / "mae")
    path = tmp_path / "mae" / "model.safetensors"
    tensors = load_file(str(path))
    key = "vit.encoder.layer.2.intermediate.dense.weight"
    if damage == "missing":
        del tensors[key]
    else:
        tensors[key] = torch.zeros(191, 96)
    save_file(tensors, str(path), metadata={"format": "pt"})
    if damage == "missing":
        what = f"1 encoder tensor(s) missing: {key}"
    else:
        what = f"1 encoder tensor(s) of the wrong shape: {key} (191, 96) (expected (192, 96))"
    expected = re.escape(f"does not hold the whole encoder of its config: {what}. Fix:")
    with pytest.raises(UserInputError, match=expected) as err:
        load_model_for_finetuning(str(tmp_path / "mae"), LABELS)
    assert "\n" not in str(err.value)


def test_pretraining_summary_names_the_run(tmp_path):
    assert pretraining_summary(str(tmp_path)) is None
    (tmp_path / PRETRAINING_FILENAME).write_text(json.dumps({"model": "vit-tiny-cpu", "mask_ratio": 0.75,
        "norm_pix_loss": True, "steps": 300, "dataset": "digits", "knn_accuracy": 0.5}))  # fmt: skip
    assert pretraining_summary(str(tmp_path)) == (f"MAE {tmp_path} (vit-tiny-cpu, mask ratio 0.75, norm_pix_loss "
                                                  "True, 300 steps on digits, k-NN accuracy 0.5000)")  # fmt: skip


def test_a_new_mae_starts_from_sincos_positions_and_drawn_tokens():
    """MAE's start (facebookresearch/mae `initialize_weights`): fixed 2-D sine-cosine position tables in encoder and
    decoder, CLS and mask tokens drawn from N(0, 0.02²). transformers 5.x left all four at zero, so every masked
    patch reached the decoder as the same token and got the same prediction: the loss stayed at the mean's."""
    torch.manual_seed(0)
    config = ViTMAEConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, decoder_hidden_size=8, decoder_num_hidden_layers=1,
                          decoder_num_attention_heads=2, decoder_intermediate_size=16)  # fmt: skip
    model = build_model_from_preset(config)
    embeddings, decoder = model.vit.embeddings, model.decoder
    torch.testing.assert_close(embeddings.position_embeddings, mae_sincos_table(4, 16))
    torch.testing.assert_close(decoder.decoder_pos_embed, mae_sincos_table(4, 8))
    assert not embeddings.position_embeddings.requires_grad and not decoder.decoder_pos_embed.requires_grad
    # The table: a zero CLS row, then for patch (h, w) [sin w | cos w | sin h | cos h] (MAE's released layout).
    table = mae_sincos_table(4, 8)[0]
    assert torch.equal(table[0], torch.zeros(8))
    assert table[1 + 4 * 2 + 3, 0] == pytest.approx(torch.sin(torch.tensor(3.0)).item())  # row 2, column 3
    assert table[1 + 4 * 2 + 3, 4] == pytest.approx(torch.sin(torch.tensor(2.0)).item())
    for token in (embeddings.cls_token, decoder.mask_token):
        assert 0.01 < token.std().item() < 0.04
    # Behaviour: masked patches of one flat image get different predictions (their positions differ).
    model.eval()
    with torch.no_grad():
        out = model(pixel_values=torch.zeros(1, 3, 16, 16), noise=torch.arange(16.0).unsqueeze(0))
    masked = out.logits[0][out.mask[0].bool()]
    assert len(masked) == 12 and torch.cdist(masked, masked).fill_diagonal_(1).min() > 1e-4
