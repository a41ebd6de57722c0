"""Sequence parallelism in real processes (gloo on CPU): the recipe's refusal without DeepSpeed; torchrun of
tests/launched/workers/sp_worker.py with 4 processes (2 data-parallel groups x 2) -- logits,
gradients, eval mode, Trainer batches, parameters after SGD steps under ZeRO 0-3 and offload, all against a
non-parallel reference in the same worker -- and the recipe itself (SP over 2 ranks vs one process on the same
batches; a high-resolution fine-tune under ZeRO-3).
Measured: 4 min 45 s wall on 2 CPU cores shared with other jobs (load average 6-7), 3 min of CPU in all.
"""

import math
import shutil
from pathlib import Path

import pytest
import torch

from hf_vit_scaling.models.presets import build_model_from_preset, image_processor_for, preset_config
from tests.helpers.builders import one_image_folder
from tests.helpers.launchers import (
    DS_CONFIGS,
    REPO,
    TINY_ARGS,
    WORKERS,
    error_lines,
    launcher_cmd,
    losses_by_step,
    printed_json,
    read_json,
    run,
    run_recipe,
    run_script,
    sample_trace,
    steps_trained_since,
)


def test_recipe_refuses_sequence_parallel_without_deepspeed(tmp_path):
    out = tmp_path / "out"
    proc = run_recipe(out, "--sequence_parallel_size", "2", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "--sequence_parallel_size" in errors[0] and "--ds_config" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not out.exists()


# --------------------------------------------------------------------------- 2 processes: the worker


def launch_worker(tmp_path, nproc: int, stages: str) -> list[dict]:
    out = tmp_path / "worker.json"
    cmd = [*launcher_cmd("torchrun", nproc), WORKERS / "sp_worker.py", out]
    proc = run(cmd, timeout=300, SP_WORKER_STAGES=stages)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return read_json(out)["ranks"]


def check_against_plain_model(ranks: list[dict], stages: list[str]) -> None:
    for r in ranks:
        for check in r["forward_backward"]:  # 17 tokens (padded to 18), 10 (even split), 17 recomputed in backward
            assert check["logits_max_rel"] <= 1e-6, check
            assert check["grad_max_rel"] <= 1e-6, check  # observed ~4e-7 relative
            assert check["grad_tensors_compared"] >= check["grad_tensors"] - 2, check  # only k_proj biases left out
            assert check["grad_max_abs_diff_zero_grads"] <= 1e-6 * check["grad_largest"], check
            assert check["eval_logits_max_rel"] <= 1e-6, check
        assert [(c["tokens"], c["padded"], c["gradient_checkpointing"]) for c in r["forward_backward"]] == [
            (17, True, False),
            (10, False, False),
            (17, True, True),
        ]
        for zero in r["zero"]:
            # A half- or double-size update would leave diff_over_update near 0.5 or 1 (observed ~2e-7).
            assert zero["diff_over_update"] <= 1e-5, zero
            assert zero["losses"] == pytest.approx(zero["reference_losses"], rel=1e-5), zero
        assert [z["stage"] for z in r["zero"]] == stages


@pytest.mark.distributed
def test_four_processes_two_data_parallel_groups_of_two(tmp_path):
    """dp 2 x sp 2, under every ZeRO stage and offload: each SP group trains on its half of the global batch; the
    updates must equal plain SGD on the whole batch (gradients summed over the SP group, averaged over the groups).
    One launch for what a 2-process group (sp 2) and the 4 processes each checked: a group of 2 is a group here."""
    stages = ["0", "1", "2", "3", "2o", "3o"]  # o: offload (optimizer; ZeRO-3 parameters too)
    ranks = launch_worker(tmp_path, 4, ",".join(stages))
    assert [(r["dp_rank"], r["sp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    check_against_plain_model(ranks, stages)
    with_sp = [r["trainer_batches"]["with_sp"] for r in ranks]
    without = [r["trainer_batches"]["without_sp"] for r in ranks]
    assert with_sp[0] == with_sp[1] and with_sp[2] == with_sp[3]  # within a group: the same batches
    assert without[0] != without[1]  # without the sharding fix the ranks of a group get different batches
    assert len(with_sp[0]) == len(with_sp[2]) == 5  # 40 images / (4 per batch x 2 groups)
    group_images = [sorted(i for b in with_sp[k] for i in b) for k in (0, 2)]
    assert sorted(group_images[0] + group_images[1]) == list(range(40))  # the groups split the epoch


# --------------------------------------------------------------------------- 2 processes: the recipe

SHORT = ["--eval_strategy", "no", "--max_eval_samples", "32", "--logging_steps", "1"]
# Every random transform, at 64 px with 16 px patches (17 tokens, as vit-tiny-cpu at 16 px): the crop is a real one.
AUGMENTED_64PX = (
    "--image_size 64 --patch_size 16 --random_resized_crop true --horizontal_flip true "
    "--rand_augment rand-m9-mstd0.5-inc1 --random_erasing 0.25 --mixup_alpha 0.8 --cutmix_alpha 1.0 "
    "--drop_path_rate 0.1"
).split()

RELOAD_PLAIN = """
import json, sys
import torch
from transformers import AutoImageProcessor, ViTConfig, ViTForImageClassification
model = ViTForImageClassification.from_pretrained(sys.argv[1]).eval()
config = json.load(open(sys.argv[1] + "/config.json"))
size = model.config.image_size
with torch.no_grad():
    logits = model(pixel_values=torch.zeros(1, 3, size, size)).logits
print(json.dumps({"keys": sorted(config), "image_size": size, "finite": bool(torch.isfinite(logits).all()),
                  "processor_size": AutoImageProcessor.from_pretrained(sys.argv[1]).size["height"],
                  "positions": model.vit.embeddings.position_embeddings.shape[1]}))
"""


def reload_plain(tmp_path, output_dir) -> dict:
    return printed_json(run_script(tmp_path, "reload.py", RELOAD_PLAIN, output_dir, timeout=120))


def log_history(output_dir) -> list[dict]:
    return [e for e in read_json(Path(output_dir) / "trainer_state.json")["log_history"] if "loss" in e]


@pytest.mark.distributed
def test_recipe_sequence_parallel_zero2_equals_one_process_and_reloads_as_plain_vit(tmp_path):
    """SP over 2 ranks (one data-parallel group) sees exactly the batches of a one-process run, so the two must train
    identically: same losses and same gradient norms (AdamW hides a gradient scale error, the norm does not)."""
    # Label smoothing: the Trainer computes the loss from the logits itself, outside the model. Every augmentation
    # on, at 64 px: both ranks of the group must draw the same crops, mixes and drop-path masks as the one process,
    # or the losses part.
    args = ["--ds_config", str(DS_CONFIGS / "zero2.json"), "--max_steps", "6", "--label_smoothing_factor", "0.1",
            *SHORT, *AUGMENTED_64PX]  # fmt: skip
    run_recipe(tmp_path / "sp", *args, "--sequence_parallel_size", "2", "--trace_samples", "true",
               launcher="torchrun", nproc=2)  # fmt: skip
    run_recipe(tmp_path / "one", *args, launcher="python")
    # The two ranks of one SP group are one data-parallel rank: the same images, the same random draws.
    trace = sample_trace(tmp_path / "sp")
    assert all(trace[(0, step)]["pixels"] == trace[(1, step)]["pixels"] for step in range(1, 7)), trace
    sp, one = log_history(tmp_path / "sp"), log_history(tmp_path / "one")
    assert len(sp) == len(one) == 6
    assert [e["loss"] for e in sp] == pytest.approx([e["loss"] for e in one], rel=1e-5)
    assert [e["grad_norm"] for e in sp] == pytest.approx([e["grad_norm"] for e in one], rel=1e-5)

    report = read_json(tmp_path / "sp" / "throughput.json")
    setup, throughput = report["setup"], report["throughput"]
    assert (setup["sequence_parallel_size"], setup["tokens_per_image"], setup["tokens_per_rank"]) == (2, 17, 9)
    assert setup["global_batch_size"] == throughput["nominal_images_per_step"] == 16  # not 32: 2 ranks, 1 image set
    assert throughput["images_measured"] == 16 * throughput["steps_measured"]
    assert all(r["images"] == throughput["images_measured"] for r in report["ranks"]["per_rank"])

    reloaded = reload_plain(tmp_path, tmp_path / "sp")
    assert reloaded["finite"] and reloaded["image_size"] == 64
    assert not [k for k in reloaded["keys"] if "parallel" in k or "key_value" in k], reloaded["keys"]


@pytest.mark.distributed
def test_recipe_high_resolution_finetune_under_zero3(tmp_path):
    """A 16 px checkpoint fine-tuned at 32 px (17 -> 65 tokens, 33 per rank) with SP under ZeRO-3."""
    torch.manual_seed(0)
    config = preset_config("vit-tiny-cpu", [str(i) for i in range(10)], image_size=16)
    build_model_from_preset(config).save_pretrained(tmp_path / "ckpt")
    image_processor_for(config).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "hires"
    # TINY_ARGS without its preset and image size (flag/value pairs): a checkpoint replaces the preset.
    pairs = zip(TINY_ARGS[0::2], TINY_ARGS[1::2], strict=True)
    tiny = [x for flag, value in pairs if flag not in ("--model_preset", "--image_size") for x in (flag, value)]
    cmd = [
        *launcher_cmd("torchrun", 2),
        REPO / "recipes" / "train_vit.py",
        "--output_dir",
        out,
        *tiny,
        "--model_name_or_path",
        tmp_path / "ckpt",
        "--image_size",
        "32",
        "--sequence_parallel_size",
        "2",
        "--ds_config",
        DS_CONFIGS / "zero3.json",
        "--max_steps",
        "2",
        *SHORT,
    ]
    proc = run(cmd)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    setup = read_json(out / "throughput.json")["setup"]
    assert (setup["zero_stage"], setup["tokens_per_image"], setup["tokens_per_rank"]) == (3, 65, 33)
    assert all(math.isfinite(e["loss"]) for e in log_history(out))
    reloaded = reload_plain(tmp_path, out)
    assert (reloaded["image_size"], reloaded["processor_size"], reloaded["positions"]) == (32, 32, 65)


@pytest.mark.distributed
def test_four_processes_groups_draw_alike_within_apart_across_and_resume_exactly(tmp_path):
    """dp 2 x sp 2 with every augmentation: the two ranks of a group see the same pixels at every step, the two
    groups different ones; resumed from checkpoint-3 the run trains only steps 4-6, on the same images and pixels, to
    the same losses. The data is one image copied (64 per class, images of one size: the device input path, every
    draw from the default generator), so the groups' pixels differ only if their draws do: fails if every group
    keeps data-parallel rank 0's stream (`PerRankRandomness` with `seed = None` whenever sequence_parallel_size > 1),
    which different images would hide."""
    args = [
        "--train_dir",
        str(one_image_folder(tmp_path / "images", copies=64)),
        "--ds_config",
        str(DS_CONFIGS / "zero2.json"),
        "--sequence_parallel_size",
        "2",
        "--max_steps",
        "6",
        "--save_strategy",
        "steps",
        "--save_steps",
        "3",
        "--trace_samples",
        "true",
        *SHORT,
        *AUGMENTED_64PX,
    ]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    run_recipe(reference, *args, launcher="torchrun", nproc=4)
    trace = sample_trace(reference)
    for step in range(1, 7):
        group0, group1 = {trace[(r, step)]["pixels"] for r in (0, 1)}, {trace[(r, step)]["pixels"] for r in (2, 3)}
        assert len(group0) == len(group1) == 1, f"step {step}: a group's ranks drew apart: {group0} {group1}"
        assert group0 != group1, f"step {step}: both groups augmented their identical images identically: {group0}"

    resumed.mkdir()
    shutil.copytree(reference / "checkpoint-3", resumed / "checkpoint-3")
    run_recipe(resumed, *args, "--resume_from_checkpoint", "latest", launcher="torchrun", nproc=4)
    assert steps_trained_since(resumed, {}) == {f"rank{r}.jsonl": [4, 5, 6] for r in range(4)}
    again = sample_trace(resumed)
    for field in ("indices", "pixels"):  # the images (on copies of one image, only the indices tell them apart)
        assert all(again[(r, s)][field] == trace[(r, s)][field] for r in range(4) for s in (4, 5, 6)), field
    ref_losses, got_losses = losses_by_step(reference), losses_by_step(resumed)
    assert [got_losses[s] for s in (4, 5, 6)] == pytest.approx([ref_losses[s] for s in (4, 5, 6)], rel=1e-6)
