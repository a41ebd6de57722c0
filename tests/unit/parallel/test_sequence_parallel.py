"""Sequence parallelism without processes: the refusals (flag and fix named), the loss-gradient scale and batch
arithmetic, position-embedding interpolation for high-resolution fine-tuning, and the shipped high-resolution
recipe file. The multi-process checks are in tests/launched/test_sequence_parallel_launched.py."""

import os

import pytest
import torch

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.presets import build_model_from_preset, load_model_for_finetuning, preset_config
from hf_vit_scaling.parallel.deepspeed_config import read_config
from hf_vit_scaling.parallel.sequence_parallel import (
    check_sequence_parallel,
    sequence_parallel_ds_values,
    sequence_parallel_loss_grad_scale,
)
from tests.helpers.launchers import REPO

ZERO = {stage: read_config({"zero_optimization": {"stage": stage}}) for stage in range(4)}  # as the Engine reads it


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(ds_config=read_config(None)), ["--sequence_parallel_size", "--ds_config"]),
        (dict(world_size=3), ["does not divide the 3 launched processes"]),
        (dict(num_attention_heads=3), ["does not divide the model's 3 attention heads", "[3]"]),
        (
            dict(ds_config=read_config({"zero_optimization": {"stage": 3, "reduce_scatter": False}})),
            ["reduce_scatter"],
        ),
        (dict(attn_implementation="flex_attention"), ["--attn_implementation flex_attention"]),
        (dict(attn_implementation="eager"), ["--attn_implementation eager"]),
        (dict(balance_batches="calibrate"), ["--balance_batches"]),
    ],
)
def test_refusals_name_the_flag_and_the_fix(kwargs, words):
    args = dict(sp_size=2, world_size=4, ds_config=ZERO[2], num_attention_heads=4) | kwargs
    with pytest.raises(UserInputError) as err:
        check_sequence_parallel(**args)
    for word in [*words, "Fix"]:
        assert word in str(err.value)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_zero_stage_is_accepted(stage):
    check_sequence_parallel(2, 4, ZERO[stage], 4)
    check_sequence_parallel(1, 3, read_config(None), 3)  # N = 1: nothing to check
    no_split = {"stage": 3, "reduce_scatter": False, "contiguous_gradients": False}  # one path: no mixed buckets
    check_sequence_parallel(2, 4, read_config({"zero_optimization": no_split}), 4)


def test_loss_gradient_scale_and_batch_arithmetic():
    # ZeRO 0-2 sum the SP group's gradients (divide by world / N): each rank carries 1/N. ZeRO-3 divides by the world.
    assert [sequence_parallel_loss_grad_scale(4, s) for s in range(4)] == [0.25, 0.25, 0.25, 1.0]
    values = sequence_parallel_ds_values(2, per_device_batch=3, accumulation=2, world_size=8)
    assert values == {"train_batch_size": 3 * 2 * 4, "sequence_parallel_size": 2}


def test_position_embeddings_interpolated_like_transformers(tmp_path):
    """--image_size with a checkpoint: the table is resized once, exactly as `interpolate_pos_encoding=True` does
    on every forward, so the fine-tuned model starts from what transformers itself would compute."""
    torch.manual_seed(0)
    original = build_model_from_preset(preset_config("vit-tiny-cpu", list("abc"), image_size=16)).eval()
    original.save_pretrained(tmp_path / "ckpt")
    model = load_model_for_finetuning(str(tmp_path / "ckpt"), list("abcd"), image_size=32).eval()
    assert model.config.image_size == 32
    assert model.vit.embeddings.position_embeddings.shape[1] == (32 // 4) ** 2 + 1  # 65 from 17
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = original.vit(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state
        got = model.vit(pixel_values=pixels).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserInputError, match="--image_size 30"):
        load_model_for_finetuning(str(tmp_path / "ckpt"), list("ab"), image_size=30)


def test_high_resolution_recipe_file_parses_and_fits_its_model(tmp_path):
    """recipes/vit_b16_1024_sp.yaml: every key is a recipe flag; ViT-B/16 (12 heads) splits over its 4 ranks."""
    import yaml
    from transformers import HfArgumentParser

    from hf_vit_scaling.arguments.parse import ALL_ARGUMENT_CLASSES
    from hf_vit_scaling.models.presets import MODEL_PRESETS

    values = yaml.safe_load((REPO / "recipes" / "vit_b16_1024_sp.yaml").read_text(encoding="utf-8"))
    values.update(bf16=False, use_cpu=True, output_dir=str(tmp_path))  # bf16 needs an accelerator
    for key in ("train_dir", "validation_dir"):  # the file names the user's folders: stand-ins here
        values[key] = str(tmp_path / key)
        os.makedirs(values[key])
    model_args, _, engine_args, *_ = HfArgumentParser(ALL_ARGUMENT_CLASSES).parse_dict(values)
    assert (model_args.image_size // 16) ** 2 + 1 == 4097
    heads = MODEL_PRESETS["vit-b-16"]["num_attention_heads"]
    check_sequence_parallel(engine_args.sequence_parallel_size, 8, ZERO[2], heads)
