"""MAE pretraining through recipes/pretrain_mae.py in real processes, then fine-tuning through recipes/train_vit.py:

- ZeRO-2 on 2 processes (torchrun), 8 steps, a checkpoint every 4, an evaluation (reconstruction loss and k-NN
  accuracy) every 4: the uninterrupted reference;
- the same run with rank 1 SIGKILLed when step 7 begins, then resumed from checkpoint-4;
- ZeRO-3 on 2 processes (accelerate launch), 4 steps;
- the ZeRO-2 run's model fine-tuned by train_vit.py (one process, 2 steps at learning rate 1e-12: the saved
  classifier holds the weights it loaded, to 2e-12).

Tiny on purpose (16 px digits: 16 patches, 4 visible; 16 images per process and step; a 64-image k-NN bank and 32
queries): it checks the plumbing, not the representation. Five recipe runs share the checks.
"""

import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTMAEConfig

from hf_vit_scaling.models.flops import mae_forward_macs_per_image
from hf_vit_scaling.pretraining.reconstruction import read_layout
from tests.helpers.launchers import (
    DS_CONFIGS,
    RECIPE,
    REPO,
    launcher_cmd,
    logged_losses,
    read_json,
    run,
    run_recipe,
    steps_trained_since,
)

pytestmark = pytest.mark.distributed

PRETRAIN = REPO / "recipes" / "pretrain_mae.py"
SMALL_EVAL = ["--knn_train_samples", "64", "--knn_eval_samples", "32", "--max_eval_samples", "32",
              "--per_device_eval_batch_size", "32", "--logging_steps", "1"]  # fmt: skip
ZERO2 = ["--ds_config", str(DS_CONFIGS / "zero2.json"), "--max_steps", "8", "--save_strategy", "steps",
         "--save_steps", "4", "--knn_eval_steps", "4", *SMALL_EVAL]  # fmt: skip
ZERO3 = ["--ds_config", str(DS_CONFIGS / "zero3.json"), "--max_steps", "4", "--knn_eval_steps", "4", *SMALL_EVAL]
KILL_AT = 7  # rank 1 dies as step 7 begins: checkpoint-4 is the newest, steps 5 and 6 are lost


def pretrain(out, args, launcher, **env):
    proc = run_recipe(out, *args, launcher=launcher, nproc=2, script=PRETRAIN, **env)
    return {"out": out, "log": proc.stdout + proc.stderr}


@pytest.fixture(scope="module")
def zero2(tmp_path_factory):
    return pretrain(tmp_path_factory.mktemp("mae") / "zero2", ZERO2, "torchrun")


@pytest.fixture(scope="module")
def zero3(zero2):
    return pretrain(zero2["out"].parent / "zero3", ZERO3, "accelerate")


@pytest.fixture(params=["zero2", "zero3"])
def pretrained(request):
    return request.getfixturevalue(request.param)


def knn_history(out) -> list[tuple[int, float]]:
    state = read_json(out / "trainer_state.json")
    return [(entry["step"], entry["eval_knn_accuracy"]) for entry in state["log_history"] if "eval_knn_accuracy"
            in entry]  # fmt: skip


def test_pretraining_logs_knn_accuracy_and_draws_the_picture(pretrained):
    out = pretrained["out"]
    steps = read_json(out / "trainer_state.json")["global_step"]
    losses = logged_losses(out)
    assert len(losses) == steps and all(map(math.isfinite, losses))
    # k-NN accuracy in the Trainer's logged history (what TensorBoard plots) every 4 steps; the final evaluation's
    # in the results, a fraction of the 32 queries.
    history = knn_history(out)
    assert [step for step, _ in history] == list(range(4, steps + 1, 4))
    results = read_json(out / "all_results.json")
    assert 0.0 <= results["eval_knn_accuracy"] <= 1.0 and (results["eval_knn_accuracy"] * 32).is_integer()
    assert results["eval_knn_accuracy"] == history[-1][1]  # the same model, the same images, no randomness
    assert math.isfinite(results["eval_loss"])
    layout = read_layout(out / "reconstructions.png")
    assert layout["rows"] == 8 and layout["columns"] == ["original", "masked", "reconstruction"]
    # The throughput report counts what runs: the encoder on 1 + 4 tokens, the decoder on 17.
    config = ViTMAEConfig.from_pretrained(out)
    assert (config.model_type, config.mask_ratio, config.image_size) == ("vit_mae", 0.75, 16)
    flops = read_json(out / "throughput.json")["flops"]
    assert flops["forward_macs_per_image"] == mae_forward_macs_per_image(config)
    assert flops["train_flops_per_image"] == 6 * mae_forward_macs_per_image(config)
    pretraining = read_json(out / "pretraining.json")
    assert (pretraining["steps"], pretraining["mask_ratio"]) == (steps, 0.75)
    assert len(re.findall(r"Done: .*\(knn_accuracy [\d.]+, ZeRO-\d", pretrained["log"])) == 1


def test_resume_logs_the_uninterrupted_losses(zero2, tmp_path):
    """The uninterrupted run's checkpoint-4, copied to a new folder and resumed: the resumed processes train steps
    5-8 on both ranks and no other (their own --trace_samples lines), to the uninterrupted run's losses and k-NN
    accuracies. Fails if the resume is a restart (steps 1-8 again give the same losses). The SIGKILL before a resume
    is test_reliability.py's (ZeRO-2, core)."""
    out = tmp_path / "resumed"
    shutil.copytree(zero2["out"] / "checkpoint-4", out / "checkpoint-4")
    args = [*ZERO2, "--trace_samples", "true"]
    resumed = run_recipe(out, *args, "--resume_from_checkpoint", "latest", launcher="torchrun", nproc=2,
                         script=PRETRAIN)  # fmt: skip
    assert steps_trained_since(out, {}) == {f"rank{r}.jsonl": [5, 6, 7, 8] for r in (0, 1)}  # not from step 1
    assert f"resuming from {out / 'checkpoint-4'}" in resumed.stdout
    assert logged_losses(out) == logged_losses(zero2["out"])  # all 8 steps, 5-8 retrained, bit for bit
    assert len(logged_losses(out)) == 8
    assert knn_history(out) == knn_history(zero2["out"])  # the evaluation at step 8 too


def test_the_pretrained_encoder_fine_tunes_with_every_tensor_loaded(zero2, tmp_path):
    mae = zero2["out"]
    out = tmp_path / "finetuned"
    # Learning rate 1e-12 (the recipe refuses 0): Adam moves a weight by about the learning rate a step, so the
    # saved classifier holds what it loaded to 2e-12, while a tensor left at a fresh init would differ by ~0.02.
    # One plain process; not run_recipe's tiny flags, which name a preset.
    flags = ["--max_steps", "2", "--max_eval_samples", "32", "--learning_rate", "1e-12", "--report_to", "none",
             "--per_device_train_batch_size", "16", "--dataloader_num_workers", "0",
             "--disable_tqdm", "true"]  # fmt: skip
    proc = run([*launcher_cmd("python", 1), RECIPE, "--model_name_or_path", mae, "--output_dir", out, *flags])
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = proc.stdout + proc.stderr
    saved_mae = load_file(str(mae / "model.safetensors"))
    encoder = {k: v for k, v in saved_mae.items() if k.startswith("vit.")}
    decoder = len(saved_mae) - len(encoder)
    assert len(encoder) == 70 and decoder == 40
    assert (f"Loaded 70/70 encoder tensors from the MAE checkpoint {mae}; dropped 40 decoder tensors; new: "
            "classifier.bias, classifier.weight") in text  # fmt: skip
    finetuned = load_file(str(out / "model.safetensors"))
    assert set(finetuned) == set(encoder) | {"classifier.weight", "classifier.bias"}
    for key, tensor in encoder.items():  # the same saved names in both files (transformers' on-disk ViT names)
        assert torch.allclose(finetuned[key].float(), tensor.float(), rtol=0, atol=1e-9), key
    assert finetuned["classifier.weight"].shape == (10, 96)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"| pretraining | MAE {mae} (vit-tiny-cpu, mask ratio 0.75, norm_pix_loss True, 8 steps on" in card
