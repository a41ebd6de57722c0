#!/usr/bin/env python
"""Held-out accuracy of the per-sample path against the host-crop path, on Fashion-MNIST re-encoded as variable-size
JPEGs: the acceptance check that the fast path for variable-size images trains as well.

    python benchmarks/variable_size_accuracy.py --fashion_mnist data/fashion_mnist --work_dir /tmp/fm_jpegs \
        --output_dir benchmarks/results

Data: the first `--train_images` of Fashion-MNIST's training set after a seed-0 shuffle and the first `--test_images`
of its test set, each 28 x 28 image upscaled (bicubic) to a random size from 56 to 112 px per side (so the aspect
ratio varies too) and written as a grayscale JPEG of quality 90: an image folder per split. At the model's 28 px every
image is at least twice the input, so the host-crop path decodes it at 1/2 or 1/4 (Image.draft) in training and
evaluation, where the per-sample path decodes it in full.
Runs: recipes/train_vit.py, 1 process, no DeepSpeed, `vit-tiny-cpu` at 28 px with 4 px patches, batch 64 (the
5,000-image configs' 2 x 32), AdamW lr 1e-3, weight decay 0.05, linear decay after a 5% warmup, `--epochs` epochs,
the recipe's default augmentation at 28 px (no random resized crop, horizontal flip; `--random_resized_crop` turns
the crop on), evaluated once at the end on the test images. Each of `--input_paths` x `--seeds` is one run; the
result is each run's `eval_accuracy` and wall time, and per path the mean over seeds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from _common import report_result  # noqa: E402


def write_jpegs(split, folder: str, names: list[str], rng) -> None:
    for i, row in enumerate(split):
        image = row["image"].convert("L")
        w, h = (int(v) for v in rng.integers(56, 113, 2))
        target = os.path.join(folder, names[row["label"]])
        os.makedirs(target, exist_ok=True)
        image.resize((w, h), Image.Resampling.BICUBIC).save(os.path.join(target, f"{i:05d}.jpg"), quality=90)


def make_data(source: str, work: str, n_train: int, n_test: int) -> tuple[str, str]:
    from datasets import load_from_disk

    train_dir, test_dir = os.path.join(work, "train"), os.path.join(work, "test")
    if os.path.isdir(train_dir) and os.path.isdir(test_dir):
        return train_dir, test_dir  # written by an earlier run with the same work_dir
    data = load_from_disk(source)
    names = [name.replace("/", "or") for name in data["train"].features["label"].names]  # "T - shirt / top": a path
    rng = np.random.default_rng(0)
    write_jpegs(data["train"].shuffle(seed=0).select(range(n_train)), train_dir, names, rng)
    write_jpegs(data["test"].select(range(min(n_test, len(data["test"])))), test_dir, names, rng)
    return train_dir, test_dir


def run(args, train_dir: str, test_dir: str, input_path: str, seed: int) -> dict:
    out = os.path.join(args.work_dir, "runs", f"{input_path}-s{seed}")
    cmd = [
        sys.executable, os.path.join(REPO, "recipes", "train_vit.py"),
        "--train_dir", train_dir, "--validation_dir", test_dir, "--input_path", input_path, "--seed", str(seed),
        "--model_preset", "vit-tiny-cpu", "--image_size", "28", "--patch_size", "4",
        "--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "256",
        "--learning_rate", "1e-3", "--weight_decay", "0.05", "--lr_scheduler_type", "linear", "--warmup_steps", "0.05",
        "--num_train_epochs", str(args.epochs), "--eval_strategy", "no", "--save_strategy", "no",
        "--logging_steps", "200", "--report_to", "none", "--disable_tqdm", "true",
        "--dataloader_num_workers", str(args.dataloader_num_workers), "--output_dir", out,
    ]  # fmt: skip
    if args.random_resized_crop:
        cmd += ["--random_resized_crop", "true", "--crop_scale_min", "0.35"]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"input_path": input_path, "seed": seed, "status": "failed", "error": proc.stderr[-2000:]}
    with open(os.path.join(out, "all_results.json")) as f:
        results = json.load(f)
    chosen = [line for line in proc.stdout.splitlines() if line.startswith("Input path:")]
    return {"input_path": input_path, "seed": seed, "status": "ok", "eval_accuracy": results["eval_accuracy"],
            "wall_s": round(wall, 1), "logged": chosen[0] if chosen else None}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fashion_mnist", default="data/fashion_mnist", help="save_to_disk folder (prepare.py).")
    parser.add_argument("--work_dir", required=True, help="Where the JPEGs and the runs go (kept: reruns reuse).")
    parser.add_argument("--output_dir", default="benchmarks/results", help="Writes variable_size_accuracy.json.")
    parser.add_argument("--train_images", type=int, default=5000)
    parser.add_argument("--test_images", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    parser.add_argument("--input_paths", nargs="+", default=["per_sample", "host_crop"])
    parser.add_argument("--random_resized_crop", action="store_true", help="Train with crops from 35%% of the area.")
    parser.add_argument("--dataloader_num_workers", type=int, default=0)
    args = parser.parse_args()
    train_dir, test_dir = make_data(args.fashion_mnist, args.work_dir, args.train_images, args.test_images)
    runs = [run(args, train_dir, test_dir, path, seed) for seed in args.seeds for path in args.input_paths]
    summary = {}
    for path in args.input_paths:
        accs = [r["eval_accuracy"] for r in runs if r["input_path"] == path and r["status"] == "ok"]
        if accs:
            summary[path] = {"mean_accuracy": round(statistics.mean(accs), 4), "runs": len(accs)}
    result = {
        "setup": {k: v for k, v in vars(args).items() if k not in ("output_dir",)},
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "runs": runs,
        "mean_by_path": summary,
    }
    report_result(result, os.path.join(args.output_dir, "variable_size_accuracy.json") if args.output_dir else None)


if __name__ == "__main__":
    main()
