"""Real processes for the tests (never a faked world size inside pytest): the recipe, the study or a script started
in fresh processes through `run_recipe` / `run_script` / `run`, with each launcher (python, torchrun, accelerate,
deepspeed), and readers of what they leave (logged losses, printed JSON, `error:` lines, sample traces)."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torch.distributed.elastic.utils.distributed import get_free_port as free_port  # noqa: F401 (the tests import it from here)

from hf_vit_scaling.parallel.launch import launch_command
from hf_vit_scaling.utils import OFFLINE, child_env

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "train_vit.py"
PREPARE = REPO / "recipes" / "prepare_shards.py"
STUDY = REPO / "recipes" / "scaling_study.py"
DS_CONFIGS = REPO / "ds_configs"
FSDP_CONFIGS = REPO / "fsdp_configs"
WORKERS = REPO / "tests" / "launched" / "workers"
BIN = Path(sys.executable).parent

# A model small enough for seconds-long CPU runs: vit-tiny-cpu at 16 px (4x4 patches of 4 px -> 17 tokens).
# --peak_tflops: MFU against a given peak, which skips the 0.3 s CPU matmul probe at the start of every run (the probe
# has its own tests: tests/unit/models/test_flops.py, and the GPU check's dry run reports its MFU from it).
TINY_ARGS = (
    "--model_preset vit-tiny-cpu --image_size 16 --per_device_train_batch_size 16 --learning_rate 2e-3 "
    "--warmup_steps 0 --crop_scale_min 0.5 --horizontal_flip false --report_to none --save_strategy no "
    "--disable_tqdm true --seed 0 --throughput_warmup_steps 2 --dataloader_num_workers 0 --peak_tflops 0.1"
).split()


# --------------------------------------------------------------------------- what a run printed and wrote


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def error_lines(stderr: str, prefix: str = "error:") -> list[str]:
    """The user-facing error lines of a run's stderr (lines starting with `prefix`): tests require exactly one."""
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def printed_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON a script printed as its last line."""
    return json.loads(proc.stdout.strip().splitlines()[-1])


def logged_losses(output_dir) -> list[float]:
    state = read_json(Path(output_dir) / "trainer_state.json")
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def losses_by_step(output_dir, key: str = "loss") -> dict[int, float]:
    """{step: logged `key`} of a run's trainer_state.json (a resumed run's history holds the checkpoint's steps)."""
    history = read_json(Path(output_dir) / "trainer_state.json")["log_history"]
    return {entry["step"]: entry[key] for entry in history if key in entry}


def sample_trace(output_dir) -> dict:
    """{(rank, step): record} from a run's --trace_samples files (output_dir/sample_trace/rank{R}.jsonl); a resumed
    run's record for a step replaces the interrupted run's."""
    steps = {}
    folder = os.path.join(output_dir, "sample_trace")
    for name in sorted(os.listdir(folder)):
        rank = int(name.removeprefix("rank").removesuffix(".jsonl"))
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                steps[(rank, record["step"])] = record
    return steps


def traced_lines(output_dir) -> dict[str, int]:
    """{trace file: lines} of a run's --trace_samples files so far."""
    folder = os.path.join(output_dir, "sample_trace")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    with_lines = {}
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            with_lines[name] = sum(1 for _ in f)
    return with_lines


def steps_trained_since(output_dir, before: dict[str, int]) -> dict[str, list[int]]:
    """{trace file: the steps trained since `before` (`traced_lines`)}: what the process(es) that ran in between
    trained, counted from their own records, not from a log line."""
    steps = {}
    for name in sorted(os.listdir(os.path.join(output_dir, "sample_trace"))):
        with open(os.path.join(output_dir, "sample_trace", name), encoding="utf-8") as f:
            lines = f.readlines()[before.get(name, 0) :]
        steps[name] = [json.loads(line)["step"] for line in lines]
    return steps


# --------------------------------------------------------------------------- fresh processes


def launch_env(**extra) -> dict:
    """This environment, cleaned of a launcher's rank variables, for CPU runs that never reach the Hub (unless
    `extra` says otherwise), with this checkout first on PYTHONPATH (`utils.child_env`)."""
    settings = dict(OFFLINE, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                    PYTHONWARNINGS="ignore::FutureWarning")  # fmt: skip
    return child_env(REPO, **{**settings, **extra})


def launcher_cmd(launcher: str, nproc: int) -> list[str]:
    """`nproc` processes on this machine through `launcher` (parallel/launch.py), on a free port."""
    return launch_command(launcher, nproc, free_port())


def run(cmd: list, timeout: int = 600, cwd=None, **env) -> subprocess.CompletedProcess:
    """Run a command (no retries: an abort at exit, fixed by `shutdown_distributed`, must fail the test again)."""
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=launch_env(**env), cwd=cwd or REPO
    )


def side_by_side(*calls, at_once: int = 2):
    """Call `calls` (functions of no argument that start one single-process run and wait for it) `at_once` at a
    time, and return their results in order. Two one-thread runs use the 2 cores a sequence of them leaves half idle;
    the first failure is raised after all have ended."""
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def run_recipe(output_dir, *args, launcher: str = "python", nproc: int = 1, script=RECIPE, check=True, **env):
    cmd = [*launcher_cmd(launcher, nproc), str(script), "--output_dir", str(output_dir), *TINY_ARGS, *args]
    proc = run(cmd, **env)
    if check and proc.returncode != 0:
        raise AssertionError(f"recipe failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_script(
    tmp_path, name: str, code: str, *args, launcher: str = "python", nproc: int = 1, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Write `code` to tmp_path/name and run it in fresh process(es) started by `launcher`, from tmp_path; fail
    with the tails of its logs unless it exits 0."""
    script = Path(tmp_path) / name
    script.write_text(code, encoding="utf-8")
    proc = run([*launcher_cmd(launcher, nproc), script, *args], timeout=timeout, cwd=tmp_path)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def fsdp_args(name: str = "fsdp2") -> list[str]:
    """The recipe's flags for FSDP2 with fsdp_configs/<name>.json."""
    return ["--fsdp", "--fsdp_config", str(FSDP_CONFIGS / f"{name}.json")]


# Classify one 8x8 grayscale image with the saved model through `transformers.pipeline` (a fresh process).
CLASSIFY_WITH_PIPELINE = """
import json
import sys

import numpy as np
import transformers
from PIL import Image

classifier = transformers.pipeline("image-classification", model=sys.argv[1])
image = Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), mode="L")  # 8x8 grayscale
predictions = classifier(image)
print(json.dumps({"predictions": predictions, "id2label": classifier.model.config.id2label,
                  "dtype": str(classifier.model.dtype)}))
"""
