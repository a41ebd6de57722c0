"""Predicted vs measured peak memory per rank: the planner (`hf_vit_scaling.planning.memory`) against real
2-process runs.

Each configuration is a few Trainer steps of `planner_memory_worker.py` under `torchrun --nproc_per_node 2` on the
CPU over gloo, with every CPU tensor allocation tracked (see the worker's docstring for how). The measured figure is
the highest live-tensor total inside steps 2 and later (step 1 has no optimizer states yet when its forward runs),
over both ranks; the predicted one is the planner's peak without its margin (the margin is for what a GPU adds:
the CUDA context, NCCL buffers, allocator fragmentation). "static" is the same pair for what lives between steps.

    python benchmarks/planner_memory.py                     # every configuration below, about 10 minutes on 2 cores
    python benchmarks/planner_memory.py --only ddp-s16 zero3-b16 --output benchmarks/results/planner_memory.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's package, also when another copy is installed

from hf_vit_scaling.models.presets import MODEL_PRESETS  # noqa: E402
from hf_vit_scaling.planning.memory import PlanSettings, engine_memory  # noqa: E402
from hf_vit_scaling.planning.shapes import read_ds_configs, vit_shape  # noqa: E402

WORKER = Path(__file__).resolve().parent / "planner_memory_worker.py"
NUM_LABELS = 10
WORLD = 2

# name: (engine, preset, image size, per-device batch, gradient checkpointing, precision)
CONFIGS = {
    "ddp-s16": ("ddp", "vit-s-16", 224, 4, False, "fp32"),
    "ddp-s16-gc": ("ddp", "vit-s-16", 224, 4, True, "fp32"),
    "zero1-b16": ("zero1", "vit-b-16", 128, 2, False, "fp32"),
    "zero2-b16": ("zero2", "vit-b-16", 128, 2, False, "fp32"),
    "zero2-s16-gc": ("zero2", "vit-s-16", 224, 8, True, "fp32"),
    "zero3-b16": ("zero3", "vit-b-16", 128, 2, False, "fp32"),
    "zero3-s16-gc": ("zero3", "vit-s-16", 224, 4, True, "fp32"),
    "fsdp2-s16": ("fsdp2", "vit-s-16", 224, 4, False, "fp32"),
    "fsdp2-ti16-gc": ("fsdp2", "vit-ti-16", 224, 8, True, "fp32"),
    "ddp-s16-bf16": ("ddp", "vit-s-16", 224, 4, False, "bf16"),
    "zero2-s16-bf16": ("zero2", "vit-s-16", 224, 4, False, "bf16"),
    "zero3-s16-bf16": ("zero3", "vit-s-16", 224, 4, False, "bf16"),
}


def predict(engine, preset, image_size, batch, checkpointing, precision) -> dict:
    shape = vit_shape(MODEL_PRESETS[preset], image_size=image_size, num_labels=NUM_LABELS)
    settings = PlanSettings(
        shape=shape,
        per_device_batch=batch,
        gpus_per_node=WORLD,
        precision=precision,
        gradient_checkpointing=checkpointing,
        ds_configs=read_ds_configs(REPO / "ds_configs"),
    )
    memory = engine_memory(engine, settings)
    return {"peak": memory.peak, **memory.phases, "parameters": shape.num_parameters}


def measure(name, engine, preset, image_size, batch, checkpointing, precision, steps, timeout) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"planner-{name}-") as out:
        env = dict(
            os.environ,
            DS_ACCELERATOR="cpu",
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
            PYTHONWARNINGS="ignore",
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        cmd = [
            str(Path(sys.executable).parent / "torchrun"),
            "--nproc_per_node",
            str(WORLD),
            "--master_port",
            str(29500 + os.getpid() % 1000),
            str(WORKER),
            "--engine",
            engine,
            "--model_preset",
            preset,
            "--image_size",
            str(image_size),
            "--batch",
            str(batch),
            "--steps",
            str(steps),
            "--num_labels",
            str(NUM_LABELS),
            "--precision",
            precision,
            "--output_dir",
            out,
        ]
        if checkpointing:
            cmd.append("--gradient_checkpointing")
        started = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    steady = [s for r in ranks for k, s in r["steps"].items() if int(k) >= 2]
    return {
        "peak": max(s["peak"] for s in steady),
        "static": max(s["live_at_start"] for s in steady),
        "peak_step1": max(r["steps"]["1"]["peak"] for r in ranks),
        "peak_overall": max(r["peak_overall"] for r in ranks),
        "max_rss": max(r["max_rss_bytes"] for r in ranks),
        "wall_s": round(time.time() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), help="Run these configurations only.")
    parser.add_argument("--steps", type=int, default=3, help="Training steps per run (peaks from step 2 on).")
    parser.add_argument("--timeout", type=int, default=300, help="Seconds per run.")
    parser.add_argument("--output", default=None, help="Also write the result JSON here.")
    args = parser.parse_args()

    rows = []
    for name in args.only or list(CONFIGS):
        engine, preset, image_size, batch, checkpointing, precision = CONFIGS[name]
        predicted = predict(engine, preset, image_size, batch, checkpointing, precision)
        measured = measure(name, *CONFIGS[name], steps=args.steps, timeout=args.timeout)
        error = predicted["peak"] / measured["peak"] - 1
        rows.append(
            {
                "name": name,
                "engine": engine,
                "preset": preset,
                "image_size": image_size,
                "batch": batch,
                "gradient_checkpointing": checkpointing,
                "precision": precision,
                "predicted": predicted,
                "measured": measured,
                "peak_error": round(error, 4),
            }
        )
        print(
            f"{name:16s} predicted {predicted['peak'] / 2**20:8.1f} MiB  measured {measured['peak'] / 2**20:8.1f} "
            f"MiB  error {error:+.1%}  (static {predicted['static'] / 2**20:.1f} vs "
            f"{measured['static'] / 2**20:.1f} MiB, {measured['wall_s']} s)",
            file=sys.stderr,
            flush=True,
        )
    report_result({"world_size": WORLD, "num_labels": NUM_LABELS, "rows": rows}, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
