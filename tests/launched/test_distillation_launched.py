"""DeiT distillation through recipes/train_vit.py: a CNN teacher trained by the recipe itself (resnet-tiny-cpu, one
python process), then a student with a distillation token distilled from it on 2 processes under ZeRO-2 (accelerate
launch, as the README), with Mixup so the teacher must see the mixed batch.

Tiny on purpose (16 px digits, 6 + 6 steps of 16 images per process, 64 evaluation images): it checks the plumbing,
not the accuracy. The student must finish with finite losses, leave the teacher's file byte-equal (the teacher is
frozen and outside DeepSpeed), name the teacher in its card and reload through `pipeline("image-classification")`
as transformers' DeiTForImageClassificationWithTeacher.
"""

import math

import pytest

from tests.helpers.launchers import (
    CLASSIFY_WITH_PIPELINE,
    DS_CONFIGS,
    logged_losses,
    printed_json,
    read_json,
    run_recipe,
    run_script,
)

pytestmark = pytest.mark.distributed

SHORT = ["--max_steps", "6", "--logging_steps", "1", "--max_eval_samples", "64"]


def test_cnn_teacher_then_distilled_student_under_zero2(tmp_path):
    teacher = tmp_path / "teacher"
    run_recipe(teacher, "--model_preset", "resnet-tiny-cpu", *SHORT)
    assert read_json(teacher / "config.json")["architectures"] == ["ResNetForImageClassification"]
    assert read_json(teacher / "throughput.json")["setup"]["patch_size"] is None  # FLOPs counted, not the formula
    teacher_bytes = (teacher / "model.safetensors").read_bytes()

    student = tmp_path / "student"
    proc = run_recipe(
        student, "--ds_config", str(DS_CONFIGS / "zero2.json"), "--teacher_model", str(teacher),
        "--distillation_token", "--mixup_alpha", "0.8", *SHORT, launcher="accelerate", nproc=2,
    )  # fmt: skip
    losses = logged_losses(student)
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses), losses
    assert proc.stdout.count("Distillation: soft from") + proc.stderr.count("Distillation: soft from") == 1
    assert (teacher / "model.safetensors").read_bytes() == teacher_bytes
    assert read_json(student / "config.json")["architectures"] == ["DeiTForImageClassificationWithTeacher"]
    assert str(teacher) in (student / "README.md").read_text(encoding="utf-8")  # the card names its teacher

    result = printed_json(run_script(tmp_path, "classify.py", CLASSIFY_WITH_PIPELINE, student))
    assert len(result["id2label"]) == 10
    assert {p["label"] for p in result["predictions"]} <= set(result["id2label"].values())
    assert sum(p["score"] for p in result["predictions"]) <= 1.0 + 1e-6  # the top 5 of 10 classes
