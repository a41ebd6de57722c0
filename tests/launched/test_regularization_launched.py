"""--ema_decay and --layer_decay in real runs of recipes/train_vit.py: torchrun processes over gloo, or one python
process for the plain Trainer.

EMA: an uninterrupted ZeRO-2 run on 2 processes against the same run whose rank 1 SIGKILLs itself (faults.py) and
is resumed from its newest checkpoint. Schedule: 96 images / (2 processes x 16) = 3 steps per epoch; 6 steps; a
checkpoint every 2 steps; the kill comes as step 5 starts, 1 step after checkpoint-4, in epoch 2 (steps 4-6).
Decay 0.6 averages about the last 1 / (1 - 0.6) = 2.5 steps, so every step of the run shows in the final EMA.

Layer decay: one optimizer step at lr 1e-2, decay 0.5 on vit-tiny-cpu (4 blocks): head 1e-2, block i
1e-2 x 0.5^(4 - i), embeddings 1e-2 x 0.5^5 = 3.1e-4. The lrs are read from layer_decay_groups.json (the optimizer's
groups when training starts: under ZeRO-2 DeepSpeed's optimizer) and from the weights themselves: AdamW's first
step with no weight decay moves every element by lr x g / (|g| + eps), i.e. by the group's lr wherever |g| >> eps.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTForImageClassification

from hf_vit_scaling.training.checkpoints import checkpoint_problem
from tests.helpers.launchers import (
    DS_CONFIGS,
    TINY_ARGS,
    fsdp_args,
    logged_losses,
    printed_json,
    read_json,
    run_recipe,
    run_script,
)

pytestmark = pytest.mark.distributed

ZERO2 = ["--ds_config", str(DS_CONFIGS / "zero2.json")]


def assert_same_tensors(path_a, path_b) -> None:
    a, b = load_file(path_a), load_file(path_b)
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs by up to {(a[name] - b[name]).abs().max().item()}"


# ---------------------------------------------------------------- EMA: SIGKILL + resume

STEPS, SAVE_EVERY, KILL_AT = 6, 2, 5
EMA_RUN = [
    "--max_train_samples", "96", "--max_eval_samples", "32", "--max_steps", str(STEPS),
    "--save_strategy", "steps", "--save_steps", str(SAVE_EVERY), "--logging_steps", "1",
    "--random_resized_crop", "false", "--ema_decay", "0.6",
]  # fmt: skip


def test_zero2_ema_resumes_exactly(tmp_path):
    """The uninterrupted run's checkpoint-4 (its EMA beside the weights), copied to a new folder and resumed on the
    same 2 processes: the same final weights and EMA, bit for bit. The SIGKILL before a resume is
    test_reliability.py's (ZeRO-2, core)."""
    reference = tmp_path / "reference"
    run_recipe(reference, *ZERO2, *EMA_RUN, launcher="torchrun", nproc=2)

    out = tmp_path / "run"
    shutil.copytree(reference / "checkpoint-4", out / "checkpoint-4")
    assert checkpoint_problem(out / "checkpoint-4") is None and (out / "checkpoint-4" / "ema.safetensors").is_file()
    resumed = run_recipe(
        out, *ZERO2, *EMA_RUN, "--resume_from_checkpoint", str(out / "checkpoint-4"), launcher="torchrun", nproc=2
    )
    assert f"resuming from {out / 'checkpoint-4'}" in resumed.stdout
    assert read_json(out / "trainer_state.json")["global_step"] == STEPS
    # Bitwise: the same world size replays the same gloo reductions in the same order, and the checkpoint holds the
    # fp32 weights, optimizer moments, lr schedule, RNG states and EMA exactly.
    assert_same_tensors(out / "model.safetensors", reference / "model.safetensors")
    assert_same_tensors(out / "ema" / "model.safetensors", reference / "ema" / "model.safetensors")
    assert logged_losses(out)[-1] == logged_losses(reference)[-1]
    # A real average, not a copy of the weights.
    ema, model = load_file(reference / "ema" / "model.safetensors"), load_file(reference / "model.safetensors")
    assert any(not torch.equal(ema[name], model[name]) for name in model)
    assert "eval_ema_accuracy" in read_json(out / "eval_results.json")


# ---------------------------------------------------------------- layer decay: the lr of every group

LR, DECAY, NUM_LAYERS = 1e-2, 0.5, 4  # vit-tiny-cpu has 4 blocks
LAYER_DECAY_RUN = [
    "--learning_rate", str(LR), "--layer_decay", str(DECAY), "--weight_decay", "0", "--max_steps", "1",
    "--max_train_samples", "64", "--max_eval_samples", "16", "--random_resized_crop", "false",
]  # fmt: skip
# Softmax over keys ignores a constant added to every key, so the key bias gets a zero gradient (up to rounding) and
# Adam moves it by far less than its lr.
ZERO_GRADIENT = ".attention.k_proj.bias"

# The model the recipe starts from (same flags, same seed, same order as its main()) and the one it saved: the
# largest change of each parameter.
FIRST_STEP = """
import json
import sys

from transformers import ViTForImageClassification, set_seed

from hf_vit_scaling import build_model, load_image_classification_data, parse_args

output_dir, recipe_args = sys.argv[1], json.loads(sys.argv[2])
args = parse_args(recipe_args)
set_seed(args.training.seed)
data = load_image_classification_data(args.data, seed=args.training.seed, cache_dir=args.model.cache_dir)
start, _, _ = build_model(args.model, data.label_names)
trained = dict(ViTForImageClassification.from_pretrained(output_dir).named_parameters())
print(json.dumps({name: (trained[name] - p).abs().max().item() for name, p in start.named_parameters()}))
"""


def expected_lr(name: str) -> float:
    """BEiT: layer id 0 for the embeddings, i + 1 for block i, L + 1 after the blocks; lr x decay^(L + 1 - id)."""
    if name.startswith("vit.embeddings."):
        layer_id = 0
    elif name.startswith("vit.layers."):
        layer_id = int(name.split(".")[2]) + 1
    else:
        layer_id = NUM_LAYERS + 1  # final LayerNorm, classifier
    return LR * DECAY ** (NUM_LAYERS + 1 - layer_id)


@pytest.mark.parametrize(
    "engine, launcher, nproc",
    [([], "python", 1), (ZERO2, "torchrun", 2), (fsdp_args(), "torchrun", 2)],
    ids=["trainer-1-process", "zero2-2-processes", "fsdp2-2-processes"],
)
def test_layer_decay_gives_each_parameter_group_its_lr(engine, launcher, nproc, tmp_path):
    out = tmp_path / "run"
    run_recipe(out, *engine, *LAYER_DECAY_RUN, launcher=launcher, nproc=nproc)

    report = read_json(out / "layer_decay_groups.json")
    assert report["step"] == 1 and report["world_size"] == nproc and report["same_on_every_rank"]
    if engine == ZERO2:  # the lrs DeepSpeed's ZeRO optimizer steps with, not only the groups handed to it
        assert "DeepSpeedZeroOptimizer" in report["optimizer"] and report["optimizer"][-1] == "AdamW"
    else:  # the Trainer's AdamW (under FSDP2: over the sharded parameters, in the same groups)
        assert not any("DeepSpeed" in name for name in report["optimizer"])
    for group in report["groups"]:
        for name in group["params"]:
            assert group["lr"] == pytest.approx(expected_lr(name), rel=1e-12), name

    recipe_args = [*TINY_ARGS, "--output_dir", str(tmp_path / "unused"), *LAYER_DECAY_RUN]
    moved = printed_json(run_script(tmp_path, "first_step.py", FIRST_STEP, out, json.dumps(recipe_args)))
    assert sorted(name for group in report["groups"] for name in group["params"]) == sorted(moved)  # each once
    for name, change in moved.items():
        if name.endswith(ZERO_GRADIENT):
            assert change < expected_lr(name), name
        else:
            assert change == pytest.approx(expected_lr(name), rel=1e-3), name


def test_the_ema_saved_beside_the_best_model_is_the_best_step_s(tmp_path):
    """--load_best_model_at_end with --ema_decay: the best checkpoint is step 2 (the highest eval loss counts as
    best), so the model and the EMA saved at the end must both be step 2's, and the log and card say so."""
    out = tmp_path / "best"
    proc = run_recipe(out, *EMA_RUN, "--eval_strategy", "steps", "--eval_steps", str(SAVE_EVERY),
                      "--load_best_model_at_end", "true", "--metric_for_best_model", "loss",
                      "--greater_is_better", "true")  # fmt: skip
    best = read_json(out / "trainer_state.json")["best_model_checkpoint"]
    assert best.endswith("checkpoint-2"), best
    saved = dict(ViTForImageClassification.from_pretrained(out / "ema").named_parameters())
    at_best = load_file(f"{best}/ema.safetensors")
    assert sorted(saved) == sorted(at_best)
    differing = [name for name in at_best if not torch.equal(saved[name].detach(), at_best[name])]
    assert differing == [], differing[:3]
    last = load_file(out / "checkpoint-6" / "ema.safetensors")
    assert any(not torch.equal(last[name], at_best[name]) for name in at_best)  # the last step's is another one
    assert (
        "EMA (decay 0.6) saved in ema/: the average up to step 2, the best checkpoint's, as the model." in proc.stdout
    )
    assert "averaged up to step 2, the best checkpoint's" in (out / "README.md").read_text()
