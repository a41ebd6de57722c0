#!/usr/bin/env python
"""Every GPU measurement of this project in one run of at most 9 minutes on one H200; with --dry_run, the same code
path on the CPU with a tiny model in a few steps (CI runs it, so the script cannot rot). docs/gpu.md has the how-to.

    make gpu-check OUT=outputs/gpu-check               # the GPU machine (its python3; no `make install` needed)
    make gpu-check OUT=outputs/gpu-check-dry DRY_RUN=1  # anywhere: vit-tiny-cpu at 16 px, fp32, DS_ACCELERATOR=cpu

What runs, in this order. Each item is its own process with its own time limit, all under one total budget: an item
that no longer fits is skipped and named, and a failed item never stops the next.

  setup   deepspeed, datasets and evaluate installed from .whl/ (../shared/tools/device-wheels) into /tmp/site when
          they are missing (never downloaded);
  b       prepared shards: the built-in digits, repeated until every run's steps fit in one epoch (an epoch boundary
          restarts the loader and would count as data wait), written by recipes/prepare_shards.py as uint8 RGB shards
          at 256 px (16 in the dry run);
  a       recipes/train_vit.py (benchmarks/gpu_vit_b16.py's cell command) on those shards with loader workers,
          ViT-B/16 at 224 px in bf16: the plain Trainer (1 process, no DDP wrapper), ZeRO-2, ZeRO-3, ZeRO-1 with the
          project's resolved DeepSpeed values, FSDP2 (2+ processes: not applicable on one GPU), ZeRO-2 and ZeRO-3
          "auto" (transformers' fill written as numbers: benchmarks/engine_overhead.py's auto_config), eager and
          (the resolved ones) with --torch_compile true, and the plain Trainer with --torch_compile_mode
          max-autotune-no-cudagraphs (GPU only). Figures from each run's throughput.json, peak memory beside the
          planner's prediction (benchmarks/planner_memory_gpu.py's);
  c       the synthetic floor: the same model and precision in a plain torch loop (forward, backward, clipping, AdamW
          step) on one batch already on the device, eager and compiled; every run's step time / the floor's;
  d       benchmarks/planner_memory_gpu.py's grid (GPU only, when time is left);
  e       torch.profiler over 5 steps of the floor, the plain Trainer and ZeRO-2 (benchmarks/gpu_check_profile.py):
          per run the top 10 kernels by device self time and the device-busy fraction (CPU ops in the dry run).
  Part b's figure is the compiled plain-Trainer run of part a: data wait below 5% of the step at the compiled step
  rate, the fastest the loader must keep up with.

Order of the items (gpu_check_settings.item_order): setup, shards, plain Trainer eager, floor, plain Trainer compiled
(a and b), the other engines eager with the resolved values, the profile (e), the "auto" arms eager, the engines
compiled, d, and the max-autotune arm last: the figures that matter most come first, and what the budget cannot fit
is skipped and named.

Writes OUT/gpu_check.json (after every item, so a killed run leaves what it had), OUT/gpu_check.md (the table for
benchmarks/README.md), OUT/runs/<item>/ (each run's output folder and its log, weights deleted) and OUT/runs.tar.gz
(the same folders packed: on the GPU machine the folders are removed after packing, since at most 8 files come back
from it). Exit code 0 when every item that should run ran (a missed target such as the data wait is a finding, not
a failure), 1 when one failed or ran out of time, 2 for a bad command line; always after every item had its turn.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

# The parts of this check live beside it (benchmarks/gpu_check_*.py); loaded by path (the tests), this folder is not
# on sys.path yet.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_floor import synthetic_floor  # noqa: E402
from gpu_check_items import Check  # noqa: E402
from gpu_check_processes import ensure_packages, prepend_pythonpath, set_child_env  # noqa: E402, F401
from gpu_check_report import markdown, pack_runs  # noqa: E402
from gpu_check_settings import BENCHMARKS, DIGITS_LABELS, DRY_RUN, GPU, REPO, Settings, item_order  # noqa: E402


def floor_inputs(settings: Settings):
    """The floor's model (the recipe's preset, on the device) and one batch on the device: (model, (pixels, labels)).
    Also the profiler item's floor (benchmarks/gpu_check_profile.py)."""
    from planner_memory_gpu import load_planner

    models = load_planner()[2]  # the presets, without the package's loader (which imports deepspeed)
    device = torch.device("cpu" if settings.dry_run else "cuda")
    config = models.preset_config(settings.model_preset, DIGITS_LABELS, image_size=settings.image_size)
    torch.manual_seed(0)
    model = models.build_model_from_preset(config).to(device)
    pixels = torch.randn(settings.batch_size, 3, settings.image_size, settings.image_size, device=device)
    labels = torch.randint(0, len(DIGITS_LABELS), (settings.batch_size,), device=device)
    return model, (pixels, labels)


def floor_main(settings: Settings, out_json: str) -> int:
    """The floor item's own process: the recipe's model from its preset, eager then compiled, each on a fresh model
    and optimizer (so each peak is its own), with MFU against the same peak the recipe's report uses."""
    from planner_memory_gpu import load_planner, predict

    planner = load_planner()
    models = planner[2]
    flops = importlib.import_module("hf_vit_scaling.models.flops")
    device = torch.device("cpu" if settings.dry_run else "cuda")
    config = models.preset_config(settings.model_preset, DIGITS_LABELS, image_size=settings.image_size)
    peak_tflops, peak_source = flops.device_peak_tflops(device, settings.precision)
    train_flops = flops.vit_train_flops_per_image(config)
    predicted = predict(planner, settings.model_preset, settings.image_size, settings.batch_size, settings.precision)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "peak_tflops": peak_tflops,
        "peak_source": peak_source,
        "train_flops_per_image": train_flops,
        "predicted_peak_bytes": predicted["peak"],
    }
    failed = False
    for compiled in (False, True):
        variant = "compiled" if compiled else "eager"
        try:
            model, batch = floor_inputs(settings)
            run = synthetic_floor(model, batch, settings.floor_steps, settings.floor_warmup, settings.precision,
                                  compiled, backend=settings.compile_backend)  # fmt: skip
            achieved = run["images_per_s"] * train_flops / 1e12
            run["mfu"] = achieved / peak_tflops if peak_tflops else None
        except Exception as err:  # a failed compile must not lose the eager figures: recorded, the item fails
            failed, run = True, {"error": repr(err)[-2000:]}
        result[variant] = run
        print(f"floor {variant}: {json.dumps(run)}", flush=True)
        # Written after each variant: if the compile outlasts the item's limit, the eager figures are kept.
        Path(out_json).write_text(json.dumps(result, indent=2))
        model = batch = None  # free the device memory before the next variant
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed else 0


def source_main(folder: str, copies: int) -> int:
    """The shards item's first process: the built-in digits repeated `copies` times as a save_to_disk folder, the
    source recipes/prepare_shards.py then reads (--dataset_name)."""
    from datasets import DatasetDict, concatenate_datasets

    from hf_vit_scaling.data.sources import builtin_digits

    train = builtin_digits()["train"]
    DatasetDict(train=concatenate_datasets([train] * copies)).save_to_disk(folder)
    print(f"source: {copies} x {len(train)} digits rows in {folder}", flush=True)
    return 0


# --------------------------------------------------------------------------- main


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="OUT: gpu_check.json, gpu_check.md, runs/ go here.")
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="The same items on the CPU: vit-tiny-cpu at 16 px, fp32, a few steps (CI's check).",
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        default=None,
        help="Total seconds for every item (default 515 on the GPU; 1200 dry, a cap for slow machines: docs/gpu.md).",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="Comma-separated items to run (e.g. floor,ddp-compiled; names in gpu_check.json's "
        "items); the rest are skipped. For a rerun of what failed.",
    )
    parser.add_argument(
        "--wheels",
        default=str(REPO / ".whl"),
        help="Wheels installed when deepspeed, datasets or evaluate are missing (default .whl/).",
    )
    parser.add_argument("--site", default="/tmp/site", help="Where those wheels are installed (pip --target).")
    parser.add_argument(
        "--scratch_dir",
        default=None,
        help="Where the prepared shards go (3 GB on the GPU; default a temporary folder, removed at the end).",
    )
    parser.add_argument(
        "--keep_run_folders",
        action="store_true",
        help="Keep OUT/runs/ beside runs.tar.gz on the GPU too (the dry run always keeps it).",
    )
    parser.add_argument(
        "--floor_json",
        default=None,
        help="Internal: run only the floor, in this process, and write its figures to this file "
        "(the main run starts each item in its own process).",
    )
    parser.add_argument(
        "--source_dir",
        default=None,
        help="Internal: write only the repeated digits source (save_to_disk) to this folder.",
    )
    parser.add_argument("--source_copies", type=int, default=1, help="Internal: copies of the digits in --source_dir.")
    args = parser.parse_args(argv)
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error("--budget_s must be positive")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    settings = DRY_RUN if args.dry_run else GPU
    if args.budget_s:
        settings = replace(settings, budget_s=args.budget_s)
    # This checkout's package for this process and its children; benchmarks/ (planner_memory_gpu, gpu_vit_b16) is
    # already first on sys.path when this file runs as a script.
    prepend_pythonpath(REPO)
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(1, str(BENCHMARKS))
    if args.floor_json:
        return floor_main(settings, args.floor_json)
    if args.source_dir:
        return source_main(args.source_dir, args.source_copies)
    if not settings.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device. Fix: run this on the GPU machine, or add --dry_run (make gpu-check DRY_RUN=1).",
              file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.output_dir).resolve()
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")  # a previous check's runs would mix with this one's
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("gpu_check.json", "gpu_check.md", "runs.tar.gz", "planner_memory_gpu.json"):
        (out / stale).unlink(missing_ok=True)
    set_child_env(settings)
    only = set(args.only.split(",")) if args.only else None
    check = Check(settings, out, only)
    scratch = Path(args.scratch_dir) if args.scratch_dir else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    print(f"gpu_check: {'dry run on the CPU' if settings.dry_run else 'GPU'}, budget {settings.budget_s:.0f} s, "
          f"results in {out}", flush=True)  # fmt: skip
    try:
        check.run_setup(Path(args.wheels), Path(args.site))
        for name in item_order():
            check.run_item(name, scratch)
    finally:
        if not args.scratch_dir:
            shutil.rmtree(scratch, ignore_errors=True)
        result = check.write()
        table = markdown(result)
        (out / "gpu_check.md").write_text(table)
        pack_runs(out, remove=not settings.dry_run and not args.keep_run_folders)
    print(table, flush=True)
    print(f"gpu_check: {out / 'gpu_check.json'}, exit code {result['exit_code']}", flush=True)
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
