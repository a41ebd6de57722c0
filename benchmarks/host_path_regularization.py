#!/usr/bin/env python
"""Host-side images/s per core of the recipe's input path with every regularization flag on vs all off, and what
the device side then costs per image.

    python benchmarks/host_path_regularization.py --output benchmarks/results/host_path_regularization.json

Setup: synthetic RGB images stored PNG-encoded in a `datasets` Image column (as a Hub or save_to_disk dataset holds
them), 32,768 at 32 px (batch 256) and 1,024 at 224 px (batch 32); one process, one thread (`torch.set_num_threads(1)`,
so figures are per core). The two flag sets are parsed by the recipe's own `parse_args`:
  off: --random_resized_crop false --horizontal_flip false (and no regularization flag);
  on:  --random_resized_crop true --horizontal_flip true --mixup_alpha 0.8 --cutmix_alpha 1.0
       --rand_augment rand-m9-mstd0.5-inc1 --random_erasing 0.25 --label_smoothing_factor 0.1 --drop_path_rate 0.1
       --ema_decay 0.9999 (DeiT's set).
Method: the host side is what a DataLoader worker does, built by the recipe's `attach_map_style_transforms`
(data/input_pipeline.py): decode, uint8 tensor, collate into a batch; timed over whole passes of the data, the two flag
sets taking turns in alternating order (one warm-up pass each, excluded), median images/s of `--repeats` passes. The
device side is the recipe's model hooks in order on those batches: the DevicePreprocessor (crop, flip, normalise) then
the BatchAugmenter (RandAugment, erasing, Mixup/CutMix); median µs per image. Drop path and EMA act inside the model
and the optimizer step: their cost is in `regularization_cost.py` (EMA) and in the training step, not in the input
path.
"""

import argparse
import io
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from _common import report_result
from datasets import Dataset, DatasetDict, Features, Image, Value
from PIL import Image as PILImage
from torch.utils.data import DataLoader

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.data.input_pipeline import attach_map_style_transforms
from hf_vit_scaling.data.types import ImageClassificationData
from hf_vit_scaling.regularization.batch_augmenter import BatchAugmenter

MEAN = STD = (0.5, 0.5, 0.5)
FLAG_SETS = {
    "off": ["--random_resized_crop", "false", "--horizontal_flip", "false"],
    "on": ["--random_resized_crop", "true", "--horizontal_flip", "true", "--mixup_alpha", "0.8", "--cutmix_alpha",
           "1.0", "--rand_augment", "rand-m9-mstd0.5-inc1", "--random_erasing", "0.25", "--label_smoothing_factor",
           "0.1", "--drop_path_rate", "0.1", "--ema_decay", "0.9999"],
}  # fmt: skip


def synthetic_images(count: int, size: int, seed: int = 0) -> ImageClassificationData:
    """PNG-encoded RGB images (smooth gradients plus noise, so PNG does real work) with 10 labels."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    rows = []
    for i in range(count):
        base = (ramp[None, :, None] * rng.uniform(0.2, 1.0) + ramp[:, None, None] * rng.uniform(0.0, 0.8)) / 2
        pixels = np.clip(base + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        PILImage.fromarray(pixels).save(buffer, format="PNG")
        rows.append({"image": {"bytes": buffer.getvalue(), "path": None}, "label": i % 10})
    features = Features({"image": Image(), "label": Value("int64")})
    split = Dataset.from_list(rows, features=features)
    return ImageClassificationData(DatasetDict(train=split, validation=split), "image", "label",
                                   [str(i) for i in range(10)], "synthetic")  # fmt: skip


def recipe_arguments(flags: list[str], output_dir: str):
    return parse_args(["--output_dir", output_dir, "--report_to", "none", *flags])


def host_pass_seconds(loader: DataLoader) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    batches = list(loader)
    return time.perf_counter() - start, batches


def device_us_per_image(preprocessor, augmenter, batches: list[dict]) -> float:
    images, start = 0, time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            pixels = preprocessor(batch["pixel_values"], True)
            if augmenter.active:
                pixels, _ = augmenter(pixels, batch["labels"])
            images += pixels.shape[0]
    return 1e6 * (time.perf_counter() - start) / images


def measure(size: int, count: int, batch: int, repeats: int, workdir: str) -> dict:
    sides = {}
    for name, flags in FLAG_SETS.items():
        data = synthetic_images(count, size)  # the same images for both; the transforms are set on the splits
        args = recipe_arguments(flags, os.path.join(workdir, name))
        smoothing = args.training.label_smoothing_factor
        augmenter = BatchAugmenter.from_arguments(args.regularization, 10, MEAN, STD, smoothing)
        splits, collate, preprocessor, _ = attach_map_style_transforms(data, args.data, size, MEAN, STD)
        loader = DataLoader(splits["train"], batch_size=batch, collate_fn=collate, num_workers=0)
        sides[name] = {"loader": loader, "preprocessor": preprocessor, "augmenter": augmenter, "host": [], "dev": []}
    for rep in range(repeats + 1):  # pass 0 of each side is the warm-up
        for side in list(sides.values())[:: 1 if rep % 2 else -1]:  # the order alternates, so neither goes first
            seconds, batches = host_pass_seconds(side["loader"])
            device_us = device_us_per_image(side["preprocessor"], side["augmenter"], batches)
            if rep:
                side["host"].append(count / seconds)
                side["dev"].append(device_us)
    row = {"size": size, "images": count, "batch": batch}
    for name, side in sides.items():
        row[f"host_images_per_s_{name}"] = round(statistics.median(side["host"]), 1)
        row[f"device_us_per_image_{name}"] = round(statistics.median(side["dev"]), 1)
    row["host_on_over_off"] = round(row["host_images_per_s_on"] / row["host_images_per_s_off"], 3)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9, help="Timed passes per flag set (median reported).")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sys.argv = sys.argv[:1]  # parse_args below reads only the flag lists given to it
    result = {
        "setup": {
            "cpu": platform.processor() or platform.machine(),
            "threads": 1,
            "torch": torch.__version__,
            "repeats": args.repeats,
            "flag_sets": FLAG_SETS,
        },  # fmt: skip
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as workdir:
        for size, count, batch in ((32, 32768, 256), (224, 1024, 32)):
            row = measure(size, count, batch, args.repeats, workdir)
            result["rows"].append(row)
            host = f"host images/s off {row['host_images_per_s_off']:.1f} on {row['host_images_per_s_on']:.1f}"
            device = f"device us/image off {row['device_us_per_image_off']:.1f} on {row['device_us_per_image_on']:.1f}"
            print(f"{size:4d} px  {host} (on/off {row['host_on_over_off']:.3f});  {device}", flush=True)
    result["setup"]["load_average_1min_at_end"] = os.getloadavg()[0]  # other processes sharing the cores
    report_result(result, args.output)


if __name__ == "__main__":
    main()
