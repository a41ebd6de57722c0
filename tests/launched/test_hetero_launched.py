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


def run_shares(out, shares: str, *engine_args):
    """One SGD step with per-rank batches in proportion `shares`, on 2 processes; -> the saved weights, after checking
    that each rank really trained on its share of the 24 images."""
    run_recipe(out, *SGD_ONE_STEP, *engine_args, "--balance_batches", shares, launcher="torchrun", nproc=2)
    report = read_json(out / "throughput.json")
    expected = split_batch(24, [float(x) for x in shares.split(",")])
    assert report["setup"]["rank_batches"] == expected
    assert [r["images"] for r in report["ranks"]["per_rank"]] == expected  # real per-rank batches counted
    return load_file(out / "model.safetensors")


@pytest.fixture(scope="module")
def even_ddp_weights(tmp_path_factory):
    """The reference: plain DDP with equal batches (12 + 12). Every engine's equal-batch step equals DDP's
    (test_fsdp.py), so one reference serves them all."""
    weights = run_shares(tmp_path_factory.mktemp("even-ddp"), "1,1")
    set_seed(0)  # the recipe's seed: the weights before the step
    initial = build_model_from_preset(preset_config("vit-tiny-cpu", [str(i) for i in range(10)], image_size=16))
    step = (weights["classifier.weight"] - initial.classifier.weight.detach()).abs().max().item()
    assert step > 1e-3  # the step really moved the weights (so the equality below is not trivial)
    return weights


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
def test_uneven_batches_give_the_same_gradient(tmp_path, even_ddp_weights, ds_config, more):
    """One SGD step with lr 1 moves the weights by exactly the gradient: uneven per-rank batches (6 + 18) over the
    same global batch (24 images) must land on the weights of plain DDP's equal batches."""
    extra = ["--ds_config", str(REPO / "ds_configs" / ds_config)] if ds_config else []
    uneven = run_shares(tmp_path / "1-3", "1,3", *extra, *more)
    assert uneven.keys() == even_ddp_weights.keys()
    for name, tensor in even_ddp_weights.items():
        torch.testing.assert_close(uneven[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
