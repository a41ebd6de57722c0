"""Helpers for tests that launch the recipe as real processes (never a faked world size inside pytest)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "train_vit.py"
DS_CONFIGS = REPO / "ds_configs"
BIN = Path(sys.executable).parent

# A model small enough for seconds-long CPU runs: vit-tiny-cpu at 16 px (4x4 patches of 4 px -> 17 tokens).
TINY_ARGS = [
    "--model_preset", "vit-tiny-cpu", "--image_size", "16", "--per_device_train_batch_size", "16",
    "--learning_rate", "2e-3", "--warmup_steps", "0", "--crop_scale_min", "0.5", "--horizontal_flip", "false",
    "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
    "--throughput_warmup_steps", "2", "--dataloader_num_workers", "0",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_env(**extra) -> dict:
    env = dict(os.environ)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore::FutureWarning")
    env.update(extra)
    return env


def launcher_cmd(launcher: str, nproc: int) -> list[str]:
    port = str(free_port())
    if launcher == "python":
        return [sys.executable]
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), "--nproc_per_node", str(nproc), "--master_port", port]
    if launcher == "accelerate":
        multi = ["--multi_gpu"] if nproc > 1 else []
        return [str(BIN / "accelerate"), "launch", *multi, "--num_processes", str(nproc), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", port]
    if launcher == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_accelerators", str(nproc), "--master_port", port]
    raise ValueError(launcher)


def run(cmd: list, timeout: int = 600, cwd=None, **env) -> subprocess.CompletedProcess:
    """Run a command (no retries: an abort at exit, fixed by `shutdown_distributed`, must fail the test again)."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=test_env(**env), cwd=cwd or REPO)


def run_recipe(output_dir, *args, launcher: str = "python", nproc: int = 1, script=RECIPE, check=True, **env):
    cmd = [*launcher_cmd(launcher, nproc), str(script), "--output_dir", str(output_dir), *TINY_ARGS, *args]
    proc = run(cmd, **env)
    if check and proc.returncode != 0:
        raise AssertionError(f"recipe failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def logged_losses(output_dir) -> list[float]:
    state = read_json(Path(output_dir) / "trainer_state.json")
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]
