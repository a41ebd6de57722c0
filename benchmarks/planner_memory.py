"""Predicted vs measured peak memory per rank: the planner (`hf_vit_scaling.planning.memory`) against real
2-process runs, every engine in fp32 and bf16.

Each configuration is a few Trainer steps of `planner_memory_worker.py` under `torchrun --nproc_per_node 2` on the
CPU over gloo, each engine run as the recipe runs it (DeepSpeed from ds_configs/, FSDP2 from fsdp_configs/fsdp2.json,
`--bf16` as the Trainer's bf16), with every CPU tensor allocation tracked (see the worker's docstring for how). The
measured figure is the highest live-tensor total inside steps 2 and later (step 1 has no optimizer states yet when its
forward runs), over both ranks. The predicted one is the planner's peak without its margin (the margin is for what a
GPU adds: the CUDA context, NCCL buffers, allocator fragmentation), plus what a CPU run holds in the same memory that a
GPU run keeps on the host (`cpu_only_bytes`; the offload variants' host memory). "static" is the same pair for what
lives when a step starts.

Groups: "table" (the configurations the planner was first checked on), "bf16" (bf16 for every engine at those
configurations), "new" (other presets, image sizes and batches, fp32 and bf16; measured with the earlier planner
first, which showed what it got wrong), "held-out" (measured only after the planner was fixed).

    python benchmarks/planner_memory.py                     # every configuration below (its time: docs/planner.md)
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
# "table": the configurations the planner was first checked on (fp32, plus three bf16 rows).
TABLE = {
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
# bf16 for every engine (ZeRO-2 + checkpointing and FSDP2 were once underestimated in bf16), at the table's
# configurations.
BF16 = {
    "ddp-s16-gc-bf16": ("ddp", "vit-s-16", 224, 4, True, "bf16"),
    "zero1-s16-bf16": ("zero1", "vit-s-16", 224, 4, False, "bf16"),
    "zero2-s16-gc-bf16": ("zero2", "vit-s-16", 224, 8, True, "bf16"),
    "zero3-s16-gc-bf16": ("zero3", "vit-s-16", 224, 4, True, "bf16"),
    "fsdp2-s16-bf16": ("fsdp2", "vit-s-16", 224, 4, False, "bf16"),
    "fsdp2-ti16-gc-bf16": ("fsdp2", "vit-ti-16", 224, 8, True, "bf16"),
}


def named(engine, preset, image_size, batch, checkpointing, precision) -> tuple[str, tuple]:
    """The name of a configuration tuple, e.g. "zero2-offload-s16-160px-b8-gc-bf16"."""
    model = preset.removeprefix("vit-").replace("-", "")
    name = f"{engine}-{model}-{image_size}px-b{batch}{'-gc' if checkpointing else ''}-{precision}".replace("_", "-")
    return name, (engine, preset, image_size, batch, checkpointing, precision)


# Other presets, image sizes and batches than the table, every engine, fp32 and bf16; the offload variants are
# measured here only (on a CPU their host and device memory are one: the prediction adds them).
NEW = dict(
    named(*config, precision)
    for config in (
        ("ddp", "vit-ti-16", 160, 16, False),
        ("zero1", "vit-ti-16", 96, 32, True),
        ("zero2", "vit-ti-16", 192, 12, False),
        ("zero2", "vit-s-16", 128, 16, True),
        ("zero2_offload", "vit-s-16", 160, 8, False),
        ("zero3", "vit-s-16", 160, 12, False),
        ("zero3_offload", "vit-ti-16", 224, 8, True),
        ("fsdp2", "vit-s-16", 128, 16, False),
        ("fsdp2", "vit-tiny-cpu", 64, 32, True),
    )
    for precision in ("fp32", "bf16")
)
# Chosen and first measured after the planner was fixed on the rows above: a check that the fix is not a fit.
HELD_OUT = dict(
    named(*config)
    for config in (
        ("ddp", "vit-s-16", 96, 24, True, "bf16"),
        ("zero2", "vit-tiny-cpu", 32, 64, False, "bf16"),
        ("zero2_offload", "vit-ti-16", 128, 16, True, "bf16"),
        ("zero3", "vit-ti-16", 128, 24, True, "bf16"),
        ("zero3_offload", "vit-s-16", 96, 16, False, "fp32"),
        ("fsdp2", "vit-s-16", 192, 6, True, "bf16"),
    )
)
CONFIGS = {**TABLE, **BF16, **NEW, **HELD_OUT}
GROUPS = {
    **dict.fromkeys(TABLE, "table"),
    **dict.fromkeys(BF16, "bf16"),
    **dict.fromkeys(NEW, "new"),
    **dict.fromkeys(HELD_OUT, "held-out"),
}


def cpu_only_bytes(engine, image_size, batch, precision) -> dict[str, int]:
    """Bytes a CPU run holds in the same memory that a GPU run holds on the host or not at all, by the planner's
    phase, all fp32 pixels of the input batch (read from the worker's allocation trace):
    * the next batch, fetched by accelerate's DataLoaderShard one step ahead (data_loader.py `__iter__`): in host
      memory on a GPU; here at every moment;
    * the Trainer's `_prepare_input` `.to(device)`: on a CPU `.to("cpu:0")` copies the batch, on a GPU the batch is
      already there and `.to` returns it. In fp32 the patch convolution keeps the copy until its backward; in bf16
      it keeps its own bf16 cast and the copy goes with the Trainer's `del inputs` before backward. Under DeepSpeed
      bf16 this `.to` also casts to bf16, which is the copy the planner counts: nothing more."""
    pixels = batch * 3 * image_size**2 * 4
    prepared = 0 if engine.startswith("zero") and precision == "bf16" else pixels
    through_backward = prepared if precision == "fp32" else 0
    return {
        "static": pixels,
        "forward": prepared,
        "backward_start": through_backward,
        "backward_end": through_backward,
        "step": 0,
    }


def predict(engine, preset, image_size, batch, checkpointing, precision) -> dict:
    """The planner's peak for a GPU, plus what a CPU run holds on top (`cpu_only_bytes`, and the offload variants'
    host memory, which on a CPU is the same memory as their "device")."""
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
    cpu_only = cpu_only_bytes(engine, image_size, batch, precision)
    host = memory.host_bytes_per_rank
    phases = {phase: size + cpu_only[phase] for phase, size in memory.phases.items()}
    phases["static"] += host
    peak = phases["static"] + max(size for phase, size in phases.items() if phase != "static")
    return {
        "peak": peak,
        # what lives when a step starts: the measured "static" also holds the step's batch, fetched by then
        "static": phases["static"] + batch * 3 * image_size**2 * 4,
        "phases": phases,
        "planner_peak": memory.peak,
        "host": host,
        "cpu_only": cpu_only,
        "parameters": shape.num_parameters,
    }


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
        "trained": ranks[0]["trained"],
        "wall_s": round(time.time() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), help="Run these configurations only.")
    parser.add_argument("--steps", type=int, default=3, help="Training steps per run (peaks from step 2 on).")
    parser.add_argument("--timeout", type=int, default=300, help="Seconds per run.")
    parser.add_argument("--output", default=None, help="Also write the result JSON here.")
    args = parser.parse_args()

    started = time.time()
    rows = []
    for name in args.only or list(CONFIGS):
        engine, preset, image_size, batch, checkpointing, precision = CONFIGS[name]
        predicted = predict(engine, preset, image_size, batch, checkpointing, precision)
        measured = measure(name, *CONFIGS[name], steps=args.steps, timeout=args.timeout)
        error = predicted["peak"] / measured["peak"] - 1
        rows.append(
            {
                "name": name,
                "group": GROUPS[name],
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
            f"{name:36s} predicted {predicted['peak'] / 2**20:8.1f} MiB  measured {measured['peak'] / 2**20:8.1f} "
            f"MiB  error {error:+.1%}  (static {predicted['static'] / 2**20:.1f} vs "
            f"{measured['static'] / 2**20:.1f} MiB, {measured['wall_s']} s)",
            file=sys.stderr,
            flush=True,
        )
    errors = [row["peak_error"] for row in rows]
    summary = {"rows": len(rows), "largest_over": max(errors), "largest_under": min(errors)}
    print(f"{summary}, {time.time() - started:.0f} s", file=sys.stderr)
    report_result(
        {
            "world_size": WORLD,
            "num_labels": NUM_LABELS,
            "versions": versions(),
            "wall_s": round(time.time() - started),
            "summary": summary,
            "rows": rows,
        },
        args.output,
    )
    return 0


def versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "transformers", "deepspeed", "accelerate")}


if __name__ == "__main__":
    sys.exit(main())
