"""DeiT distillation through recipes/train_vit.py: a CNN teacher trained by the recipe itself (resnet-tiny-cpu, one
python process), then students distilled from it on 2 processes:

- ZeRO-2 (torchrun), a DeiT student with a distillation token, soft distillation through Mixup (the teacher must see
  the mixed batch), 8 steps, a checkpoint every 4;
- ZeRO-3 (accelerate launch, as the README), a plain ViT student, hard distillation, 6 steps, a checkpoint at 6;
- the ZeRO-2 run again, rank 1 SIGKILLed when step 7 begins, then resumed from checkpoint-4.

Tiny on purpose (16 px digits, 16 images per process and step, 64 evaluation images): it checks the plumbing, not
the accuracy. Five recipe runs and one scoring process share the checks: the teacher's file is byte-equal after
each student (frozen), every rank holds it whole (never partitioned) and the ZeRO optimizer's saved state holds the
student's parameters and nothing else; the resumed run logs the uninterrupted run's losses; each saved student
reloads in a fresh process through `pipeline("image-classification")` and scores the accuracy its run reported;
the card names the teacher and its accuracy; throughput.json counts the teacher's forward FLOPs.
"""

import json
import math
import re
import shutil

import pytest
import torch
from safetensors import safe_open

from tests.helpers.launchers import (
    DS_CONFIGS,
    TINY_ARGS,
    logged_losses,
    printed_json,
    read_json,
    run_recipe,
    run_script,
    steps_trained_since,
)

pytestmark = pytest.mark.distributed

TEACHER_ARGS = ["--model_preset", "resnet-tiny-cpu", "--max_steps", "6", "--logging_steps", "1",
                "--max_eval_samples", "64"]  # fmt: skip
EVAL = ["--max_eval_samples", "64", "--logging_steps", "1", "--save_strategy", "steps"]
ZERO2_TOKEN = ["--ds_config", str(DS_CONFIGS / "zero2.json"), "--distillation_token", "--mixup_alpha", "0.8",
               "--max_steps", "8", "--save_steps", "4", *EVAL]  # fmt: skip
ZERO3_PLAIN = ["--ds_config", str(DS_CONFIGS / "zero3.json"), "--distillation_type", "hard", "--max_steps", "6",
               "--save_steps", "6", *EVAL]  # fmt: skip
KILL_AT = 7  # rank 1 dies as step 7 begins: checkpoint-4 is the newest, steps 5 and 6 are lost


def stdout_and_stderr(proc) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    out = tmp_path_factory.mktemp("distil") / "teacher"
    run_recipe(out, *TEACHER_ARGS)
    return out


def student(teacher, name: str, args: list, launcher: str):
    out = teacher.parent / name
    before = (teacher / "model.safetensors").read_bytes()
    proc = run_recipe(out, "--teacher_model", str(teacher), *args, launcher=launcher, nproc=2)
    return {"out": out, "log": stdout_and_stderr(proc), "teacher_unchanged": (teacher / "model.safetensors")
            .read_bytes() == before, "args": ["--teacher_model", str(teacher), *args]}  # fmt: skip


@pytest.fixture(scope="module")
def zero2_token(teacher):
    return student(teacher, "zero2_token", ZERO2_TOKEN, "torchrun")


@pytest.fixture(scope="module")
def zero3_plain(teacher):
    return student(teacher, "zero3_plain", ZERO3_PLAIN, "accelerate")


@pytest.fixture(params=["zero2_token", "zero3_plain"])
def run(request):
    return request.getfixturevalue(request.param)


# --------------------------------------------------------------------------- what the files say


def safetensors_numel(path) -> dict[str, int]:
    with safe_open(str(path), framework="pt") as f:
        return {key: math.prod(f.get_slice(key).get_shape()) for key in f.keys()}


def zero_optimizer_contents(checkpoint) -> tuple[dict[str, int], int]:
    """What DeepSpeed's ZeRO optimizer held when it saved `checkpoint`: {name: elements} of every parameter in its
    groups (`param_shapes`, which DeepSpeed writes from the optimizer's own groups for zero_to_fp32), and the
    elements of the fp32 master partitions of every rank (the optimizer's flat groups, padded for alignment)."""
    (step,) = checkpoint.glob("global_step*")
    model_states = sorted(step.glob("*model_states.pt"))[0]
    shapes = torch.load(model_states, map_location="cpu", weights_only=False)["param_shapes"]
    held = {name: math.prod(shape) for group in shapes for name, shape in group.items()}
    master = 0
    for path in sorted(step.glob("*optim_states.pt")):
        state = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        flat = state.get("single_partition_of_fp32_groups") or state["fp32_flat_groups"]  # ZeRO-1/2, ZeRO-3
        master += sum(t.numel() for t in flat)
    return held, master


# --------------------------------------------------------------------------- the checks


def test_teacher_is_whole_on_every_rank_frozen_and_outside_the_optimizer(teacher, run):
    out, log = run["out"], run["log"]
    assert run["teacher_unchanged"]  # model.safetensors byte-equal after the student trained
    losses = logged_losses(out)
    assert len(losses) == int(run["args"][run["args"].index("--max_steps") + 1]) and all(map(math.isfinite, losses))
    batch_norm_statistics = ("running_mean", "running_var", "num_batches_tracked")
    teacher_numel = sum(n for key, n in safetensors_numel(teacher / "model.safetensors").items()
                        if not key.endswith(batch_norm_statistics))  # its parameters: 312,490  # fmt: skip
    held = re.findall(r"Distillation: \w+ from .*\(([\d,]+) held whole on this rank\)", log)
    assert held == [f"{teacher_numel:,}"]  # logged once, by the main process: its own elements, not a partition

    student_numel = safetensors_numel(out / "model.safetensors")
    checkpoint = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    in_optimizer, master = zero_optimizer_contents(checkpoint)
    assert len(in_optimizer) == len(student_numel) and sum(in_optimizer.values()) == sum(student_numel.values())
    # The fp32 master partitions of both ranks: the student's elements + at most a few of alignment padding per
    # group, far below the teacher's 313,834.
    assert sum(student_numel.values()) <= master < sum(student_numel.values()) + 64, master


def test_resume_from_checkpoint_logs_the_uninterrupted_losses(teacher, zero2_token, tmp_path):
    """The uninterrupted run's checkpoint-4, copied to a new folder and resumed: the resumed processes train steps
    5-8 on both ranks and no other (their own --trace_samples lines), to the uninterrupted run's losses, and the
    teacher's file is untouched. Fails if the resume is a restart (steps 1-8 again). The SIGKILL before a resume is
    test_reliability.py's (ZeRO-2, core): the checkpoint it leaves is the one saved before the kill."""
    out = tmp_path / "resumed"
    shutil.copytree(zero2_token["out"] / "checkpoint-4", out / "checkpoint-4")
    args = ["--teacher_model", str(teacher), *ZERO2_TOKEN, "--trace_samples", "true"]
    before = (teacher / "model.safetensors").read_bytes()
    resumed = run_recipe(out, *args, "--resume_from_checkpoint", str(out / "checkpoint-4"), launcher="torchrun",
                         nproc=2)  # fmt: skip
    assert steps_trained_since(out, {}) == {f"rank{r}.jsonl": [5, 6, 7, 8] for r in (0, 1)}  # not from step 1
    assert f"resuming from {out / 'checkpoint-4'}" in resumed.stdout
    assert (teacher / "model.safetensors").read_bytes() == before
    assert logged_losses(out) == logged_losses(zero2_token["out"])  # all 8 steps, 5-8 retrained, bit for bit
    assert len(logged_losses(out)) == 8


# Top-1 accuracy of saved models over the run's own evaluation images, through `transformers.pipeline` in a fresh
# process: argv[1] is a JSON list of [output_dir, recipe args]; the recipe's data flags pick the same 64 images.
SCORE_WITH_PIPELINE = """
import json
import math
import sys

import datasets
import transformers
from transformers import HfArgumentParser

from hf_vit_scaling import DataArguments, load_image_classification_data


def score(output_dir, recipe_args):
    (data_args,) = HfArgumentParser(DataArguments, allow_abbrev=False).parse_args_into_dataclasses(
        recipe_args, return_remaining_strings=True)[:1]
    data = load_image_classification_data(data_args, seed=int(recipe_args[recipe_args.index("--seed") + 1]))
    validation = data.splits["validation"].cast_column(data.image_column, datasets.Image())  # stored: decode here
    classifier = transformers.pipeline("image-classification", model=output_dir)
    every_class = classifier(list(validation[data.image_column]), top_k=len(data.label_names))  # best first
    truth = [data.label_names[label] for label in validation[data.label_column]]
    correct = sum(scores[0]["label"] == t for scores, t in zip(every_class, truth))
    loss = -sum(math.log(next(s["score"] for s in scores if s["label"] == t)) for scores, t in zip(every_class, truth))
    return {"accuracy": correct / len(truth), "loss": loss / len(truth), "n": len(truth),
            "class": type(classifier.model).__name__}


print(json.dumps([score(output_dir, args) for output_dir, args in json.loads(sys.argv[1])]))
"""


def test_saved_students_reload_through_a_pipeline_and_score_the_run_accuracy(tmp_path, zero2_token, zero3_plain):
    runs = [zero2_token, zero3_plain]
    models = json.dumps([[str(r["out"]), [*TINY_ARGS, *r["args"]]] for r in runs])
    scored = printed_json(run_script(tmp_path, "score.py", SCORE_WITH_PIPELINE, models))
    assert [s["class"] for s in scored] == ["DeiTForImageClassificationWithTeacher", "ViTForImageClassification"]
    for run, score in zip(runs, scored):
        results = read_json(run["out"] / "all_results.json")
        assert score["n"] == results["eval_samples"] == 64
        assert score["accuracy"] == results["eval_accuracy"], (run["out"].name, score, results["eval_accuracy"])
        # Per image, not only the argmax (a student this short may predict one class for all): the mean
        # cross-entropy of the pipeline's softmax scores is the run's eval loss, to float rounding.
        assert score["loss"] == pytest.approx(results["eval_loss"], rel=1e-5), (run["out"].name, score, results)


def test_card_and_throughput_report_name_the_teacher(teacher, zero2_token, zero3_plain):
    from transformers import AutoConfig

    from hf_vit_scaling.models.flops import forward_flops_per_image

    accuracy = read_json(teacher / "eval_results.json")["eval_accuracy"]
    teacher_flops = forward_flops_per_image(AutoConfig.from_pretrained(teacher), image_size=16)
    assert teacher_flops == 2_112_000  # resnet-tiny-cpu at the students' 16 px (its config says 32)
    for run, tokens in ((zero2_token, 4 * 4 + 2), (zero3_plain, 4 * 4 + 1)):
        card = (run["out"] / "README.md").read_text(encoding="utf-8")
        assert f"| teacher | {teacher} (" in card
        assert f"| teacher accuracy | {accuracy:.4f} on 64 images (its eval_results.json) |" in card
        report = read_json(run["out"] / "throughput.json")
        flops, setup = report["flops"], report["setup"]
        assert setup["tokens_per_image"] == tokens  # the DeiT student's distillation token counted
        assert flops["teacher_forward_flops_per_image"] == teacher_flops
        counted = flops["train_flops_per_image"] + teacher_flops
        assert flops["teacher_flops_fraction"] == pytest.approx(teacher_flops / counted)
        assert flops["achieved_tflops_total"] == pytest.approx(report["throughput"]["images_per_s"] * counted / 1e12)
