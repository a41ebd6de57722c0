"""Predicted vs measured peak memory on one CUDA GPU: the planner's activation and optimizer model under the
kernels GPUs use (FlashAttention/memory-efficient SDPA, cuBLAS, autocast), where allocator statistics are exact.

One process, no DeepSpeed: the Trainer's plain training step written out (forward with labels, backward, gradient
clipping at 1.0, fused AdamW, zero_grad(set_to_none=True); bf16 = autocast over fp32 weights, as the Trainer runs it
without DeepSpeed). The prediction is the planner's DDP estimate for one GPU minus DDP's gradient buckets (4Ψ),
which a single process does not build. Measured: `torch.cuda.max_memory_allocated()` over steps 2 and 3.

    python benchmarks/planner_memory_gpu.py --output benchmarks/results/planner_memory_gpu.json

It loads only `hf_vit_scaling.planning.shapes`, `hf_vit_scaling.planning.memory` and the model presets (and what
they import), so it also runs where the project's other dependencies (datasets, deepspeed) are not installed.
"""

import argparse
import importlib
import json
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

# (preset, image size, batch, precision, gradient checkpointing)
CONFIGS = [
    ("vit-b-16", 224, 64, "fp32", False),
    ("vit-b-16", 224, 64, "bf16", False),
    ("vit-b-16", 224, 64, "bf16", True),
    ("vit-b-16", 448, 16, "bf16", False),
    ("vit-l-16", 224, 32, "bf16", False),
    ("vit-h-14", 224, 16, "bf16", True),
]


def load_planner():
    """hf_vit_scaling.planning.shapes, .planning.memory and .models.presets without running the package's __init__
    (which imports everything)."""
    package = types.ModuleType("hf_vit_scaling")
    package.__path__ = [str(REPO / "hf_vit_scaling")]
    sys.modules.setdefault("hf_vit_scaling", package)
    return (
        importlib.import_module("hf_vit_scaling.planning.shapes"),
        importlib.import_module("hf_vit_scaling.planning.memory"),
        importlib.import_module("hf_vit_scaling.models.presets"),
    )


def predict(
    planner,
    name: str,
    image_size: int,
    batch: int,
    precision: str,
    checkpointing: bool = False,
    engine: str = "ddp",
    world_size: int = 1,
    ds_configs: dict | None = None,
    num_labels: int = 10,
) -> dict:
    """The planner's peak and static bytes per rank for `engine` (`planning.shapes.ENGINES`) on `world_size` ranks;
    `planner` is what `load_planner` returns, `ds_configs` the ZeRO engines' JSON (`shapes.read_ds_configs`).

    One process without DeepSpeed or FSDP (engine "ddp", world 1) is not wrapped in DDP at all (the Trainer wraps only
    a distributed run), so DDP's gradient buckets (4Ψ), which the planner's DDP estimate holds, are taken off."""
    shapes, memory, models = planner
    shape = shapes.vit_shape(models.MODEL_PRESETS[name], image_size=image_size, num_labels=num_labels)
    settings = memory.PlanSettings(
        shape=shape,
        per_device_batch=batch,
        gpus_per_node=world_size,
        precision=precision,
        gradient_checkpointing=checkpointing,
        gpu_memory_bytes=141 * shapes.GiB,
        ds_configs=ds_configs or {},
    )
    estimate = memory.engine_memory(engine, settings)
    buckets = 4 * shape.num_parameters if engine == "ddp" and world_size == 1 else 0
    return {"peak": estimate.peak - buckets, "static": estimate.phases["static"] - buckets}


def measure(preset: dict, image_size: int, batch: int, precision: str, checkpointing: bool, device) -> dict:
    from transformers import ViTConfig, ViTForImageClassification

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    config = ViTConfig(**dict(preset, image_size=image_size), num_labels=10)
    config._attn_implementation = "sdpa"
    model = ViTForImageClassification(config).to(device).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    pixels = torch.randn(batch, 3, image_size, image_size, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    peaks, times = [], []
    for step in range(3):
        torch.cuda.synchronize(device)
        if step >= 1:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(pixel_values=pixels, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        peaks.append(torch.cuda.max_memory_allocated(device))
    static = torch.cuda.memory_allocated(device) - pixels.nbytes - labels.nbytes
    del model, optimizer, pixels, labels, loss
    return {"peak": max(peaks[1:]), "static": static, "step_s": min(times[1:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None, help="Also write the JSON printed at the end to this file.")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device. Fix: run this on a machine with a GPU.", file=sys.stderr)
        return 2
    shapes, memory, models = load_planner()
    device = torch.device("cuda")
    rows = []
    for name, image_size, batch, precision, checkpointing in CONFIGS:
        predicted = predict((shapes, memory, models), name, image_size, batch, precision, checkpointing)
        measured = measure(models.MODEL_PRESETS[name], image_size, batch, precision, checkpointing, device)
        row = {
            "preset": name,
            "image_size": image_size,
            "batch": batch,
            "precision": precision,
            "gradient_checkpointing": checkpointing,
            "predicted_peak": predicted["peak"],
            "predicted_static": predicted["static"],
            **{f"measured_{k}": v for k, v in measured.items()},
        }
        row["peak_error"] = round(row["predicted_peak"] / row["measured_peak"] - 1, 4)
        rows.append(row)
        print(
            f"{name} {image_size}px b{batch} {precision}{' gc' if checkpointing else ''}: predicted "
            f"{row['predicted_peak'] / 2**30:.2f} GiB, measured {row['measured_peak'] / 2**30:.2f} GiB "
            f"({row['peak_error']:+.1%}); static {row['predicted_static'] / 2**30:.2f} vs "
            f"{row['measured_static'] / 2**30:.2f} GiB; {measured['step_s'] * 1000:.0f} ms/step",
            flush=True,
        )
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": rows}
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
