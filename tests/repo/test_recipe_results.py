"""benchmarks/recipe_results.py, which the recipe scripts (medical run.sh, fashion_mnist/distil.sh, mae/run.sh) call
at their end with RESULTS set: a run of several models keeps each model's metrics and config under its name; bad
input is one error line and writes nothing. (The medical evaluation's file and its rendered tables:
tests/repo/test_medical_evaluate.py.)"""

import json
import sys

import pytest

from tests.helpers.launchers import REPO, error_lines, run

SCRIPT = REPO / "benchmarks" / "recipe_results.py"


def inputs(tmp_path) -> dict:
    """Two models' metrics and configs, as distil.sh passes them."""
    for name, accuracy in (("teacher", 0.9), ("student", 0.8)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"eval_accuracy": accuracy}))
        (tmp_path / f"{name}.yaml").write_text(f"output_dir: outputs/{name}\n")
    return {"--run_command": "make fashion-distil", "--output": str(tmp_path / "results.json"),
            "--metrics": [f"teacher={tmp_path / 'teacher.json'}", f"student={tmp_path / 'student.json'}"],
            "--config": [f"teacher={tmp_path / 'teacher.yaml'}", f"student={tmp_path / 'student.yaml'}"],
            "--seconds": ["teacher=60", "student=120", "total=180"]}  # fmt: skip


def command(args: dict) -> list[str]:
    flat = [sys.executable, str(SCRIPT)]
    for flag, value in args.items():
        flat += [flag, *(value if isinstance(value, list) else [value])]
    return flat


def test_each_model_s_metrics_and_config_under_its_name(tmp_path):
    args = inputs(tmp_path)
    proc = run(command(args))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["metrics"] == {"teacher": {"eval_accuracy": 0.9}, "student": {"eval_accuracy": 0.8}}
    assert result["config"] == {
        "teacher": {"output_dir": "outputs/teacher"},
        "student": {"output_dir": "outputs/student"},
    }
    assert result["seconds"] == {"teacher": 60, "student": 120, "total": 180}
    assert result["run_command"] == "make fashion-distil" and "commit" in result["provenance"]


@pytest.mark.parametrize(
    ("change", "words"),
    [({"--seconds": ["train=5.5"]}, "is not name=seconds"),
     ({"--metrics": ["missing.json"]}, "cannot read the run's files"),
     ({"--config": ["student=missing.yaml"]}, "cannot read the run's files")],
    ids=["fractional-seconds", "missing-metrics", "missing-config"],
)  # fmt: skip
def test_a_bad_input_is_one_error_line_and_writes_nothing(tmp_path, change, words):
    args = {**inputs(tmp_path), **change}
    proc = run(command(args))
    assert proc.returncode != 0 and not (tmp_path / "results.json").exists()
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_a_classification_run_renders_its_top1_ema_loss_and_train_time():
    """recipe_top1 (recipes/fashion_mnist/README.md's generated tables): the run's own numbers in their columns, the
    top-1 in bold, `n/a` for a run that kept no EMA."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import table_renderers

    result = {
        "run_command": "make x",
        "seconds": {"train": 649.4},
        "metrics": {"epoch": 60.0, "eval_accuracy": 0.85094, "eval_ema_accuracy": 0.8494, "train_loss": 0.82291},
    }
    row = table_renderers.recipe_top1(result).splitlines()[-1]
    assert row == "| `make x` | 60 | **0.8509** | 0.8494 | 0.8229 | 649 s (10 min 49 s) |"
    del result["metrics"]["eval_ema_accuracy"]
    assert "| **0.8509** | n/a |" in table_renderers.recipe_top1(result)


def test_an_mae_run_renders_each_step_s_own_evaluation_and_time():
    """mae_two_steps (recipes/mae/README.md's generated table): the pretraining's reconstruction loss and k-NN
    accuracy on its row, the fine-tune's top-1 (bold) and EMA on its own, each step's seconds from the script; fails
    if the steps' metrics are swapped or a step's time is taken from the other."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import table_renderers

    result = {
        "run_command": "bash recipes/mae/run.sh",
        "seconds": {"pretraining": 1116, "fine-tuning": 700, "total": 1816},
        "metrics": {
            "pretraining": {"epoch": 21.2766, "eval_loss": 0.44293, "eval_knn_accuracy": 0.729, "train_loss": 0.53649},
            "fine-tuning": {"epoch": 60.0, "eval_accuracy": 0.87471, "eval_ema_accuracy": 0.8751, "train_loss": 0.9},
        },
    }
    rows = table_renderers.mae_two_steps(result).splitlines()
    pretraining = "reconstruction loss 0.443, k-NN accuracy 0.729"
    assert rows[4] == f"| pretraining (labels unused) | 21.3 | {pretraining} | 0.5365 | 1116 s (18 min 36 s) |"
    assert rows[5] == "| fine-tuning | 60 | top-1 **0.8747** (EMA 0.8751) | 0.9000 | 700 s (11 min 40 s) |"
    assert rows[-1] == "Both steps: 1816 s (30 min 16 s)."
    del result["metrics"]["fine-tuning"]["eval_ema_accuracy"]
    assert "| top-1 **0.8747** | 0.9000 |" in table_renderers.mae_two_steps(result)
