#!/usr/bin/env python
"""Trainer + DeepSpeed overhead: the recipe's step rate against a minimal hand-written PyTorch loop.

    python benchmarks/trainer_overhead.py --steps 60 --warmup 10

Setup: one process, same model (vit-tiny-cpu at 32 px = 65 tokens by default), batch, threads, data (the built-in
digits through the package's input path), AdamW with the same lr / weight decay, gradient clipping 1.0.
Method: every arm runs in its own fresh process, one after another: the hand loop (model, DataLoader, AdamW,
clip, step; nothing else), then `recipes/train_vit.py` with no DeepSpeed and with ds_configs/zero0|2|3.json.
Step time = time between consecutive optimizer-step ends; the first `--warmup` steps are dropped; the figure is the
median (for the recipe: `step_time_s.median` of its throughput.json, which measures exactly that).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

from hf_vit_scaling.throughput.schema import load_throughput_report

REPO = Path(__file__).resolve().parents[1]

HAND_LOOP = r"""
import json, sys, time, torch
from hf_vit_scaling import DataArguments, load_image_classification_data
from hf_vit_scaling.data import DevicePreprocessor, attach_uint8_transforms, collate_uint8_batch
from hf_vit_scaling.models.presets import build_model_from_preset, image_processor_for, preset_config
cfg = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(cfg["threads"])
data = load_image_classification_data(DataArguments(), seed=0)
config = preset_config(cfg["preset"], data.label_names, image_size=cfg["image_size"])
model = build_model_from_preset(config).train()
proc = image_processor_for(config)
DevicePreprocessor(config.image_size, proc.image_mean, proc.image_std, crop_scale_min=0.5,
                   horizontal_flip=False).attach(model)
loader = torch.utils.data.DataLoader(attach_uint8_transforms(data)["train"], batch_size=cfg["batch"], shuffle=True,
                                     collate_fn=collate_uint8_batch, drop_last=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
ends, step = [], 0
while step < cfg["steps"]:
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
        step += 1
        if step == cfg["steps"]:
            break
deltas = [b - a for a, b in zip(ends, ends[1:])][cfg["warmup"]:]
print("RESULT", json.dumps({"median_step_s": sorted(deltas)[len(deltas) // 2]}))
"""


def env(threads: int) -> dict:
    e = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        e.pop(key, None)
    return e


def hand_loop(args) -> float:
    cfg = dict(
        preset=args.model_preset,
        image_size=args.image_size,
        batch=args.batch_size,
        steps=args.steps,
        warmup=args.warmup,
        threads=args.threads,
    )
    out = subprocess.run(
        [sys.executable, "-c", HAND_LOOP, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=env(args.threads),
        check=True,
    ).stdout
    return json.loads(out.split("RESULT", 1)[1])["median_step_s"]


def recipe(args, ds_config: str | None) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            str(REPO / "recipes" / "train_vit.py"),
            "--output_dir",
            out,
            "--model_preset",
            args.model_preset,
            "--image_size",
            str(args.image_size),
            "--per_device_train_batch_size",
            str(args.batch_size),
            "--max_steps",
            str(args.steps),
            "--throughput_warmup_steps",
            str(args.warmup),
            "--learning_rate",
            "1e-3",
            "--weight_decay",
            "0.05",
            "--crop_scale_min",
            "0.5",
            "--horizontal_flip",
            "false",
            "--input_path",
            "device",
            *"--eval_strategy no --save_strategy no --report_to none --disable_tqdm true".split(),
            "--logging_steps",
            str(args.steps),
            "--seed",
            "0",
        ]
        if ds_config:
            cmd += ["--ds_config", str(REPO / "ds_configs" / ds_config)]
        subprocess.run(cmd, capture_output=True, text=True, env=env(args.threads), check=True)
        return load_throughput_report(os.path.join(out, "throughput.json"))["step_time_s"]["median"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", default="vit-tiny-cpu", help="Preset to time.")
    parser.add_argument("--image_size", type=int, default=32, help="Input resolution.")
    parser.add_argument("--batch_size", type=int, default=64, help="Per-device batch size.")
    parser.add_argument("--steps", type=int, default=60, help="Optimizer steps per arm.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps dropped at the start of each arm.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_NUM_THREADS) in every arm.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = parser.parse_args()
    start = time.time()
    arms = {"hand_loop": hand_loop(args)}
    for name, config in (
        ("trainer_no_deepspeed", None),
        ("zero0", "zero0.json"),
        ("zero2", "zero2.json"),
        ("zero3", "zero3.json"),
    ):
        arms[name] = recipe(args, config)
    result = {
        "setup": {
            "cpu": platform.processor() or platform.machine(),
            "threads": args.threads,
            "model_preset": args.model_preset,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "steps": args.steps,
            "warmup_dropped": args.warmup,
            "processes": 1,
        },
        "median_step_s": arms,
        "step_rate_ratio_vs_hand_loop": {k: arms["hand_loop"] / v for k, v in arms.items() if k != "hand_loop"},
        "wall_s": time.time() - start,
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
