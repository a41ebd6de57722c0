#!/usr/bin/env python
"""The recipe's steady-state step time against a synthetic-data floor, on this machine's CPU.

    python benchmarks/synthetic_floor.py --rounds 3 --output benchmarks/results/synthetic_floor.json

The floor runs the same model, engine and precision on one batch already on the device: no loader, no callbacks,
no Trainer; the optimizer step included.
  - plain Trainer: `gpu_check_floor.plain_step`, the Trainer's step without DeepSpeed (forward, backward, clipping at
    1.0, fused AdamW, zero_grad);
  - ZeRO-0/2/3: the same model and fused AdamW in a DeepSpeed engine built from the same ds_configs/ file, its
    "auto" values filled by transformers' own `HfTrainerDeepSpeedConfig` (as the Trainer fills them), then
    engine(batch), engine.backward(loss), engine.step().
The recipe arm is `recipes/train_vit.py` with that engine on the built-in digits (the device input path, the
throughput report on). Both arms time the same thing: the median time between consecutive step ends, the first
`--warmup` steps dropped (for the recipe: `step_time_s.median` of its throughput.json). Every arm runs in its own
fresh process; per round each engine runs floor then recipe, and the engines take turns; the ratio reported is the
median over rounds of floor step / recipe step (1.0 = the recipe is as fast as its engine allows).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import child_env, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's package, also when another copy is installed

from hf_vit_scaling.throughput.schema import load_throughput_report  # noqa: E402

ENGINES = {"plain": None, "zero0": "zero0.json", "zero2": "zero2.json", "zero3": "zero3.json"}
DIGITS_LABELS = [str(digit) for digit in range(10)]
LR = 1e-3


def deepspeed_step(model: torch.nn.Module, ds_config: Path, batch_size: int, steps: int, scratch: str):
    """The DeepSpeed engine the Trainer builds for `ds_config`, stepped by hand. transformers fills the config's
    "auto" values from TrainingArguments and the model (`trainer_config_finalize`), as in the recipe."""
    import deepspeed
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=scratch,
        per_device_train_batch_size=batch_size,
        learning_rate=LR,
        max_grad_norm=1.0,
        deepspeed=str(ds_config),
        report_to="none",
    )
    hf_config = args.hf_deepspeed_config
    hf_config.trainer_config_finalize(args, model, steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=hf_config.config)

    def step(pixels: torch.Tensor, labels: torch.Tensor) -> None:
        loss = engine(pixel_values=pixels, labels=labels).loss
        engine.backward(loss)
        engine.step()

    return step


def floor_worker(args) -> None:
    """The floor arm's own process: prints one JSON line with `time_steps`'s figures."""
    from gpu_check_floor import plain_step, time_steps

    from hf_vit_scaling.models.presets import build_model_from_preset, preset_config

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = preset_config(args.model_preset, DIGITS_LABELS, image_size=args.image_size)
    model = build_model_from_preset(config)
    batch = (
        torch.randn(args.batch_size, 3, args.image_size, args.image_size),
        torch.randint(0, len(DIGITS_LABELS), (args.batch_size,)),
    )
    with tempfile.TemporaryDirectory() as scratch:
        if ENGINES[args.floor_worker] is None:
            step = plain_step(model, "fp32", lr=LR)
        else:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK="0", LOCAL_RANK="0")
            os.environ.update(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
            ds_config = REPO / "ds_configs" / ENGINES[args.floor_worker]
            step = deepspeed_step(model, ds_config, args.batch_size, args.steps + args.warmup, scratch)
        result = time_steps(step, batch, args.steps, args.warmup)
    print("RESULT", json.dumps(result), flush=True)


def floor(args, engine: str, port: int) -> float:
    cmd = [sys.executable, __file__, "--floor_worker", engine, "--port", str(port), *shared_flags(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(args.threads))
    if proc.returncode != 0:
        raise RuntimeError(f"floor {engine} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.split("RESULT", 1)[1])["step_s_median"]


def recipe(args, engine: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, str(REPO / "recipes" / "train_vit.py"), "--output_dir", out,
            "--model_preset", args.model_preset, "--image_size", str(args.image_size),
            "--per_device_train_batch_size", str(args.batch_size), "--max_steps", str(args.steps + args.warmup),
            "--throughput_warmup_steps", str(args.warmup), "--learning_rate", str(LR),
            "--crop_scale_min", "0.5", "--horizontal_flip", "false", "--input_path", "device",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
            "--logging_steps", str(args.steps + args.warmup), "--seed", "0", "--dataloader_num_workers", "0",
        ]  # fmt: skip
        if ENGINES[engine]:
            cmd += ["--ds_config", str(REPO / "ds_configs" / ENGINES[engine])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(args.threads))
        if proc.returncode != 0:
            raise RuntimeError(f"recipe {engine} failed:\n{proc.stderr[-3000:]}")
        return load_throughput_report(os.path.join(out, "throughput.json"))["step_time_s"]["median"]


def shared_flags(args) -> list[str]:
    return [
        "--model_preset", args.model_preset, "--image_size", str(args.image_size),
        "--batch_size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads),
    ]  # fmt: skip


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", default="vit-tiny-cpu", help="Preset of both arms.")
    parser.add_argument("--image_size", type=int, default=32, help="Input resolution (32 px: 65 tokens).")
    parser.add_argument("--batch_size", type=int, default=128, help="Per-device batch size of both arms.")
    parser.add_argument("--steps", type=int, default=50, help="Timed optimizer steps per arm.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps before the timed ones, dropped.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_NUM_THREADS) in every arm.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; every engine's two arms run once per round.")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES), help="Engines to run.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    parser.add_argument("--floor_worker", default=None, choices=list(ENGINES), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29533, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    if args.floor_worker:
        floor_worker(args)
        return
    start = time.time()
    rounds = []
    for index in range(args.rounds):
        record = {}
        for engine in args.engines:
            floor_s = floor(args, engine, 29533 + index)
            recipe_s = recipe(args, engine)
            record[engine] = {"floor_step_s": floor_s, "recipe_step_s": recipe_s, "ratio": floor_s / recipe_s}
            print(f"round {index + 1} {engine}: {json.dumps(record[engine])}", file=sys.stderr, flush=True)
        rounds.append(record)
    summary = {
        engine: {
            key: statistics.median(r[engine][key] for r in rounds)
            for key in ("floor_step_s", "recipe_step_s", "ratio")
        }
        for engine in args.engines
    }
    import deepspeed
    import transformers

    result = {
        "setup": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "threads": args.threads,
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "deepspeed": deepspeed.__version__,
            },  # fmt: skip
            "model_preset": args.model_preset,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "precision": "fp32",
            "processes": 1,
            "timed_steps": args.steps,
            "warmup_dropped": args.warmup,
            "rounds": args.rounds,
        },
        "median_over_rounds": summary,
        "rounds": rounds,
        "wall_s": round(time.time() - start, 1),
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
