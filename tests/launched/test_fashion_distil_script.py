"""recipes/fashion_mnist/distil.sh (`make fashion-distil`): one command trains a teacher on the seed's subset, then
the student distilled from it, each run by the recipe through `accelerate launch`; bad settings are refused before
any training. Tiny configs on a 2-class save_to_disk folder stand in for Fashion-MNIST and the MAE start."""

import os
import subprocess
import sys

import pytest
import yaml
from datasets import ClassLabel

from tests.helpers.builders import make_saved_dataset
from tests.helpers.launchers import REPO, launch_env, read_json

SCRIPT = REPO / "recipes" / "fashion_mnist" / "distil.sh"
COMMON = {
    "max_train_samples": 6, "image_size": 16, "max_steps": 2, "per_device_eval_batch_size": 8, "save_strategy": "no",
    "eval_strategy": "no", "report_to": "none", "disable_tqdm": True, "dataloader_num_workers": 0,
    "peak_tflops": 0.1, "ds_config": str(REPO / "ds_configs" / "zero2.json"),
}  # fmt: skip


def write_configs(tmp_path, data, student_extra=None) -> dict:
    """The teacher's and the student's config files; `student_extra` replaces student keys (None drops one)."""
    teacher = {"dataset_name": str(data), "model_preset": "resnet-tiny-cpu", **COMMON}
    student = {"dataset_name": str(data), "model_preset": "vit-tiny-cpu", "patch_size": 4,
               "distillation_type": "hard", **COMMON, **(student_extra or {})}  # fmt: skip
    student = {key: value for key, value in student.items() if value is not None}
    paths = {"TEACHER_CONFIG": tmp_path / "teacher.yaml", "STUDENT_CONFIG": tmp_path / "student.yaml"}
    paths["TEACHER_CONFIG"].write_text(yaml.safe_dump(teacher))
    paths["STUDENT_CONFIG"].write_text(yaml.safe_dump(student))
    return {name: str(path) for name, path in paths.items()}


def run_script(tmp_path, configs, **env) -> subprocess.CompletedProcess:
    env = launch_env(PYTHON=sys.executable, OUTPUT_ROOT=str(tmp_path / "out"), **configs, **env)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def data(tmp_path):
    labels = [0, 1] * 6
    return make_saved_dataset(tmp_path / "data", labels, ClassLabel(names=["shirt", "shoe"]), test_rows=4)


def test_one_command_trains_the_seed_s_teacher_then_its_student(tmp_path, data):
    configs = write_configs(tmp_path, data)
    proc = run_script(tmp_path, configs, SEED="7", RESULTS=str(tmp_path / "results" / "distil.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    teacher, student = tmp_path / "out" / "fm-5k-teacher-s7", tmp_path / "out" / "fm-5k-distil-s7"
    # RESULTS: both models' metrics as each run saved them, their configs and the step times, with provenance
    results = read_json(tmp_path / "results" / "distil.json")
    assert results["metrics"] == {"teacher": read_json(teacher / "all_results.json"),
                                  "student": read_json(student / "all_results.json")}  # fmt: skip
    assert results["config"]["student"] == yaml.safe_load(open(configs["STUDENT_CONFIG"]))
    assert list(results["seconds"]) == ["teacher", "student", "total"] and "commit" in results["provenance"]
    teacher_card, student_card = read_json(teacher / "model_card.json"), read_json(student / "model_card.json")
    assert teacher_card["setup"]["model"] == "resnet-tiny-cpu" and teacher_card["setup"]["seed"] == 7
    assert student_card["setup"]["teacher"].startswith(f"{teacher} (hard")  # distilled from this seed's teacher
    # the same 6 of the 12 rows, drawn by seed 7 for both (the recipe refuses a teacher trained on others)
    assert teacher_card["train_selection"] == student_card["train_selection"]
    assert student_card["train_selection"]["rows"] == 6 and student_card["train_selection"]["seed"] == 7
    assert "Time: teacher" in proc.stdout


@pytest.mark.parametrize(
    "env, student_extra, message",
    [
        ({"NUM_PROCESSES": "3"}, None, "NUM_PROCESSES=3 does not divide the global batch of 64"),
        ({}, {"dataset_name": "no/such/folder"}, "no/such/folder (dataset_name in"),
        (
            {},
            {"model_name_or_path": "no/mae/run", "model_preset": None, "patch_size": None},
            "no/mae/run (model_name_or_path in",
        ),
    ],
    ids=["processes", "data", "mae-start"],
)
def test_bad_settings_are_refused_before_training(tmp_path, data, env, student_extra, message):
    proc = run_script(tmp_path, write_configs(tmp_path, data, student_extra), **env)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Fix:" in errors[0]
    assert not (tmp_path / "out").exists()  # nothing trained


def test_a_one_process_launch_gets_every_core_and_two_processes_one_each(tmp_path):
    """recipes/common.sh's `launch`: accelerate gives even a single process OMP_NUM_THREADS=1, so without the
    script's own setting a `NUM_PROCESSES=1` run would use one core; two processes keep one thread each."""
    probe = tmp_path / "threads.py"
    probe.write_text("import torch\nprint('threads', torch.get_num_threads())\n")
    env = launch_env()
    env.pop("OMP_NUM_THREADS", None)
    command = f"set -euo pipefail; source recipes/common.sh; launch 1 {probe}; launch 2 {probe}"
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("threads ")]
    assert counts == [len(os.sched_getaffinity(0)), 1, 1], proc.stdout[-2000:] + proc.stderr[-3000:]
