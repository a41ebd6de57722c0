#!/usr/bin/env python
"""Plan a ViT training run before launching it: memory per GPU, the largest batch and a step-time estimate for DDP,
ZeRO-1/2/3 (and their offload variants) and FSDP2, with a recommendation. Nothing is launched; no GPU needed.

    python recipes/plan.py --model_preset vit-l-16 --image_size 224 --per_device_train_batch_size 64 \
        --gpus 8 --gpu_memory 40GB --nodes 4 --interconnect nvlink3 --network ib-hdr --precision bf16

With a distillation teacher (`--teacher_model`: a folder saved by the recipe, or a preset name such as
resnet-tiny-cpu) every rank also holds the whole teacher in --precision and its forward's tensors for one micro-batch,
and computes its forward.

MAE pretraining (recipes/pretrain_mae.py, `--mae`): the encoder runs on the visible tokens only, a decoder on all:

    python recipes/plan.py --mae --model_preset vit-l-16 --mask_ratio 0.75 --per_device_train_batch_size 256 --gpus 8

`--json` prints the same plan as JSON. Bandwidths and the achievable TFLOP/s are assumptions unless you pass your
own measured numbers (nccl-tests' bus bandwidth, a throughput.json from recipes/train_vit.py); docs/planner.md
explains every formula and shows how the estimates compare with measurements.
"""

import json
import sys
from pathlib import Path

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.planning.plan import plan
from hf_vit_scaling.planning.plan_arguments import parse_plan_flags
from hf_vit_scaling.planning.plan_report import format_plan, plan_json

DS_CONFIGS = Path(__file__).resolve().parents[1] / "ds_configs"


def main(argv: list[str] | None = None) -> int:
    # Parse and check everything before any work: one `error: ... Fix: ...` line and exit status 2 on bad input.
    try:
        args, settings = parse_plan_flags(argv, DS_CONFIGS)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    result = plan(settings)
    if args.json:
        print(json.dumps(plan_json(args, result), indent=2))
    else:
        print(format_plan(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
