"""recipes/mae/run.sh: one command pretrains the MAE encoder, then fine-tunes it, each through `accelerate launch` on
2 processes; with RESULTS set it ends by writing both steps' metrics (as each run saved them), configs and times
with provenance (benchmarks/recipe_results.py). Tiny configs on a 2-class save_to_disk folder stand in for
Fashion-MNIST."""

import subprocess
import sys

import pytest
import yaml
from datasets import ClassLabel

from tests.helpers.builders import make_saved_dataset
from tests.helpers.launchers import DS_CONFIGS, REPO, launch_env, read_json

pytestmark = pytest.mark.distributed

SCRIPT = REPO / "recipes" / "mae" / "run.sh"
COMMON = {"image_size": 16, "max_steps": 2, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4,
          "max_eval_samples": 4, "save_strategy": "no", "report_to": "none", "disable_tqdm": True,
          "dataloader_num_workers": 0, "peak_tflops": 0.1, "ds_config": str(DS_CONFIGS / "zero2.json")}  # fmt: skip


def write_configs(tmp_path, data) -> dict:
    pretrain = {"dataset_name": str(data), "model_preset": "vit-tiny-cpu", "patch_size": 4, "mask_ratio": 0.75,
                "knn_train_samples": 8, "knn_eval_samples": 4, "knn_eval_steps": 2,
                "output_dir": str(tmp_path / "pretrain"), **COMMON}  # fmt: skip
    finetune = {"dataset_name": str(data), "model_name_or_path": str(tmp_path / "pretrain"), "eval_strategy": "no",
                "output_dir": str(tmp_path / "finetune"), **COMMON}  # fmt: skip
    paths = {"PRETRAIN_CONFIG": tmp_path / "pretrain.yaml", "FINETUNE_CONFIG": tmp_path / "finetune.yaml"}
    paths["PRETRAIN_CONFIG"].write_text(yaml.safe_dump(pretrain))
    paths["FINETUNE_CONFIG"].write_text(yaml.safe_dump(finetune))
    return {name: str(path) for name, path in paths.items()}


def test_one_command_pretrains_fine_tunes_and_writes_its_results(tmp_path):
    data = make_saved_dataset(tmp_path / "data", [0, 1] * 6, ClassLabel(names=["shirt", "shoe"]), test_rows=4)
    configs = write_configs(tmp_path, data)
    env = launch_env(PYTHON=sys.executable, RESULTS=str(tmp_path / "results" / "mae.json"), **configs)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = read_json(tmp_path / "results" / "mae.json")
    assert results["metrics"] == {"pretraining": read_json(tmp_path / "pretrain" / "all_results.json"),
                                  "fine-tuning": read_json(tmp_path / "finetune" / "all_results.json")}  # fmt: skip
    assert results["config"]["fine-tuning"]["model_name_or_path"] == str(tmp_path / "pretrain")
    assert list(results["seconds"]) == ["pretraining", "fine-tuning", "total"] and "commit" in results["provenance"]


def test_missing_data_is_refused_before_training(tmp_path):
    configs = write_configs(tmp_path, tmp_path / "no_data")
    proc = subprocess.run(["bash", str(SCRIPT)], env=launch_env(PYTHON=sys.executable, **configs),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "dataset_name in" in errors[0] and "Fix:" in errors[0]
    assert not (tmp_path / "pretrain").exists()
