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
    what = "1 encoder tensor(s) missing" if damage == "missing" else "1 encoder tensor(s) of the wrong shape"
    expected = re.escape(f"does not hold the whole encoder of its config: {what}: {key}. Fix:")
    with pytest.raises(UserInputError, match=expected) as err:
        load_model_for_finetuning(str(tmp_path / "mae"), LABELS)
    assert "\n" not in str(err.value)


def test_pretraining_summary_names_the_run(tmp_path):
    assert pretraining_summary(str(tmp_path)) is None
    (tmp_path / PRETRAINING_FILENAME).write_text(json.dumps({"model": "vit-tiny-cpu", "mask_ratio": 0.75,
        "norm_pix_loss": True, "steps": 300, "dataset": "digits", "knn_accuracy": 0.5}))  # fmt: skip
    assert pretraining_summary(str(tmp_path)) == (f"MAE {tmp_path} (vit-tiny-cpu, mask ratio 0.75, norm_pix_loss "
                                                  "True, 300 steps on digits, k-NN accuracy 0.5000)")  # fmt: skip
