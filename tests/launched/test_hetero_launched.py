"""Heterogeneous ranks, launched: uneven per-rank batches over 2 processes give the same gradient as even ones.
(That the recipes' --help lists the heterogeneity flags: tests/launched/test_recipe_commands.py.)"""

import pytest
import torch
from safetensors.torch import load_file
from transformers import set_seed

from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
from hf_vit_scaling.parallel.hetero import split_batch
from tests.helpers.launchers import REPO, fsdp_args, read_json, run_recipe

SGD_ONE_STEP = [
    "--max_steps",
    "1",
    "--optim",
    "sgd",
    "--learning_rate",
    "1.0",
    "--max_grad_norm",
    "0",
    "--weight_decay",
    "0",
    "--per_device_train_batch_size",
    "12",
    "--eval_strategy",
    "no",
    "--max_eval_samples",
    "20",
    "--throughput_warmup_steps",
    "0",
    "--random_resized_crop",
    "false",
]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "ds_config, more",
    [
        (None, []),
        ("zero2.json", []),
        # Without the Trainer's global item count, VitTrainer's own loss weights b_r x W / B do the work.
        (None, ["--average_tokens_across_devices", "false"]),
        (None, fsdp_args()),  # FSDP2's reduce-scatter averages over ranks as DDP's all-reduce does
    ],
    ids=["ddp", "zero2", "ddp-own-weights", "fsdp2"],
)
def test_uneven_batches_give_the_same_gradient(tmp_path, ds_config, more):
    """One SGD step with lr 1 moves the weights by exactly the gradient: equal vs uneven per-rank batches over the
    same global batch (24 images) must land on the same weights."""
    extra = ["--ds_config", str(REPO / "ds_configs" / ds_config)] if ds_config else []
    weights = {}
    for shares in ("1,1", "1,3"):
        out = tmp_path / shares.replace(",", "-")
        run_recipe(out, *SGD_ONE_STEP, *extra, *more, "--balance_batches", shares, launcher="torchrun", nproc=2)
        report = read_json(out / "throughput.json")
        expected = split_batch(24, [float(x) for x in shares.split(",")])
        assert report["setup"]["rank_batches"] == expected
        assert [r["images"] for r in report["ranks"]["per_rank"]] == expected  # real per-rank batches counted
        weights[shares] = load_file(out / "model.safetensors")
    for name, tensor in weights["1,1"].items():
        torch.testing.assert_close(weights["1,3"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    set_seed(0)  # the recipe's seed: the weights before the step
    initial = build_model_from_preset(preset_config("vit-tiny-cpu", [str(i) for i in range(10)], image_size=16))
    step = (weights["1,1"]["classifier.weight"] - initial.classifier.weight.detach()).abs().max().item()
    assert step > 1e-3  # the step really moved the weights (so equality above is not trivial)
