#!/usr/bin/env python
"""The planner against this project's own GPU runs: every run of `benchmarks/results/gpu_check_h200.json` whose setup
the planner models (ViT-B/16 at 224 px, 128 images per GPU, bf16, one H200: the synthetic-data floor and the plain
Trainer), planned with `recipes/plan.py`'s functions, once with the planner's default assumptions (the GEMMs at 40% of
the dense peak, the layers' element-wise work at the datasheet's memory bandwidth) and once with the floor's
measured TFLOP/s (`--achievable_tflops`, as docs/planner.md tells users to pass). Nothing is measured here: the GPU
check's figures are the measurements.

    python benchmarks/planner_gpu_check.py --output benchmarks/results/planner_gpu_check.json

The ZeRO runs of that file are left out: they ran before the project resolved DeepSpeed's model-sized values and
installed its fast paths, which the planner's ZeRO rows assume (docs/planner.md).
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's package

from hf_vit_scaling.planning.plan import plan  # noqa: E402
from hf_vit_scaling.planning.plan_arguments import parse_plan_flags  # noqa: E402

GPU_CHECK = REPO / "benchmarks" / "results" / "gpu_check_h200.json"
PLAN = "--model_preset vit-b-16 --image_size 224 --per_device_train_batch_size 128 --gpus 1 --gpu_name H200 " + (
    "--precision bf16"
)


def planned_ddp_images_per_s(flags: str) -> float:
    _, settings = parse_plan_flags(shlex.split(flags), str(REPO / "ds_configs"))
    return next(option.speed.images_per_s for option in plan(settings, ("ddp",)).options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = parser.parse_args()
    run = json.loads(GPU_CHECK.read_text(encoding="utf-8"))["runs"][0]
    settings, items = run["settings"], run["items"]
    assert (settings["model_preset"], settings["image_size"], settings["batch_size"], settings["precision"]) == (
        "vit-b-16",
        224,
        128,
        "bf16",
    ), "the GPU check's setup is not the one planned here"
    floor = items["floor"]["figures"]
    measured = {
        "floor": floor["eager"]["images_per_s"],
        "plain_trainer": items["ddp-eager"]["figures"]["images_per_s"],
    }
    floor_tflops = floor["eager"]["mfu"] * floor["peak_tflops"]
    commands = {"default": PLAN, "floor_tflops": f"{PLAN} --achievable_tflops {floor_tflops:.1f}"}
    planned = {name: planned_ddp_images_per_s(flags) for name, flags in commands.items()}
    result = {
        "source": str(GPU_CHECK.relative_to(REPO)),
        "measured_images_per_s": measured,
        "floor_mfu": floor["eager"]["mfu"],
        "floor_tflops": floor_tflops,
        "planner_commands": {name: f"python recipes/plan.py {flags}" for name, flags in commands.items()},
        "planned_ddp_images_per_s": planned,
        "ratio": {
            f"{assumption}_to_{run_name}": planned[assumption] / images
            for assumption in planned
            for run_name, images in measured.items()
        },
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
