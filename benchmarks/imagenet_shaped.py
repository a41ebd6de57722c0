#!/usr/bin/env python
"""ImageNet-shaped input benchmark: host-side images/s per core to a 224 px training batch, for variable-size JPEGs
through (a) the per-sample path, (b) the host-crop path, (c) prepared uint8 shards.

    python benchmarks/imagenet_shaped.py --images 2000 --output_dir benchmarks/results

Setup: the script writes `--images` JPEGs itself (quality 90, sizes drawn from 400-600 x 300-450 like ImageNet's
typical 500 x 375, content that compresses like photos: smooth colour gradients, noise at three scales and grain;
their mean size in benchmarks/README.md) as an image folder, and prepares them as uint8 shards at 256 px
(recipes/prepare_shards.py's code, 1 process). One process, `torch.set_num_threads(1)`: figures are per core.
Method: what a DataLoader worker does per batch of 64, through the recipe's own loaders and transforms
(`load_image_classification_data`, the split's `__getitems__` with the input path's transform and each row's host
draws from its own stream as in the recipe (`with_sample_index(..., seed=0)`), its collate), over
the same shuffled training rows for every path, after one warm-up batch per path:
- (a) per_sample: full decode, random resized crop, antialiased bilinear resize to 224 and flip in float32, normalise;
  float32 (64, 3, 224, 224);
- (b) host_crop: crop box from the header, JPEG decoded at reduced size when the box allows, box resized to 224 in
  uint8 by PIL; uint8 (64, 3, 224, 224) (flip and normalisation on the device);
- (c) shards, device: raw 256 x 256 rows read from datasets' Arrow cache of the shards, stacked; uint8
  (64, 3, 256, 256) (random resized crop, flip and normalisation on the device);
- (c') shards, host slice: as (c) plus a random 224 x 224 window sliced on the host; uint8 (64, 3, 224, 224).
Rates are images per CPU second of this (single-threaded) process, `time.process_time()`, so that other jobs on
the machine do not count as ours; wall-clock rates are reported beside them. The paths take turns, `--rounds`
times; each path's figure is the median of its rounds, each ratio the median of the per-round ratios. Files are in
the page cache (written just before; dropping it needs root): the read bandwidth each path would need from disk
at its rate is reported instead. Draft: plain decode against `Image.draft` at 1/2 and 1/4 on the same JPEGs, and
how often (b) decoded at reduced size. Host draws: what a row's own randomness costs per sample, seeding torch's
generator per row (the code before) against the counter-based stream, from a shallow and a Trainer-deep stack.
The JSON result goes to `--output_dir`/imagenet_shaped.json.
"""

import argparse
import glob
import io
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import PIL
import torch
from PIL import Image, features

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import report_result  # noqa: E402

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data import (  # noqa: E402
    attach_host_crop_transforms,
    attach_transforms,
    attach_uint8_transforms,
    collate_image_batch,
    collate_uint8_batch,
    load_image_classification_data,
    with_sample_index,
)
from hf_vit_scaling.data.crop_decode import jpeg_reduction  # noqa: E402
from hf_vit_scaling.data.decoding import decode_then, set_pixel_transforms  # noqa: E402
from hf_vit_scaling.data.host_transforms import random_resized_crop_box  # noqa: E402
from hf_vit_scaling.data.prepare import SourceSpec, prepare_shards  # noqa: E402
from hf_vit_scaling.data.sample_randomness import SampleDraws, host_randint, sample_seed  # noqa: E402

MEAN = STD = [0.5, 0.5, 0.5]
SIZE, STORED = 224, 256


def photo_jpeg(rng, width: int, height: int, quality: int = 90) -> bytes:
    """Colour gradients + value noise at 48, 12 and 3 px + grain: compresses like a photo (not like flat colour)."""
    y, x = np.mgrid[:height, :width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 50 * np.sin(x / width * a * 6 + y / height * b * 5 + p * 6)

    def noise(cell: int, amplitude: float):
        small = rng.integers(0, 255, (max(1, height // cell), max(1, width // cell), 3), dtype=np.uint8)
        smooth = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
        return (np.asarray(smooth, np.float32) - 128) * amplitude

    img += noise(48, 0.5) + noise(12, 0.35) + noise(3, 0.45) + rng.normal(0, 7, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def make_folder(root: str, n: int, classes: int = 10) -> dict:
    rng = np.random.default_rng(0)
    sizes, nbytes = [], []
    for i in range(n):
        w, h = int(rng.integers(400, 601)), int(rng.integers(300, 451))
        data = photo_jpeg(rng, w, h)
        folder = os.path.join(root, f"class{i % classes}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:05d}.jpg"), "wb") as f:
            f.write(data)
        sizes.append((w, h))
        nbytes.append(len(data))
    return {
        "count": n,
        "classes": classes,
        "width_range": [min(s[0] for s in sizes), max(s[0] for s in sizes)],
        "height_range": [min(s[1] for s in sizes), max(s[1] for s in sizes)],
        "mean_size": [round(float(np.mean([s[0] for s in sizes]))), round(float(np.mean([s[1] for s in sizes])))],
        "mean_kb": round(float(np.mean(nbytes)) / 1024, 1),
        "quality": 90,
    }


def host_slice(pixels: torch.Tensor) -> torch.Tensor:
    """(c'): a random SIZE x SIZE window of a stored STORED x STORED image, sliced on the host."""
    top, left = host_randint(0, STORED - SIZE + 1), host_randint(0, STORED - SIZE + 1)
    return pixels[:, top : top + SIZE, left : left + SIZE]


def build_paths(jpeg_dir: str, shard_dir: str, cache_dir: str) -> dict:
    """Each path's training split (with the recipe's transform and sample index) and collate."""
    data_args = DataArguments(train_dir=jpeg_dir, train_val_split=0.05, crop_scale_min=0.08)
    paths = {}
    data = load_image_classification_data(data_args, seed=0)
    paths["a_per_sample"] = (attach_transforms(data, SIZE, MEAN, STD, data_args)["train"], collate_image_batch)
    data = load_image_classification_data(data_args, seed=0)
    paths["b_host_crop"] = (attach_host_crop_transforms(data, SIZE, data_args)["train"], collate_uint8_batch)
    shard_args = DataArguments(dataset_name=shard_dir, train_val_split=0.05)
    data = load_image_classification_data(shard_args, seed=0, cache_dir=cache_dir)
    paths["c_shards_device"] = (attach_uint8_transforms(data)["train"], collate_uint8_batch)
    data = load_image_classification_data(shard_args, seed=0, cache_dir=cache_dir)
    splits = set_pixel_transforms(data, lambda train: decode_then(host_slice, data.raw_shape))
    paths["c_shards_host_slice"] = (splits["train"], collate_uint8_batch)
    # As in the recipe: each training row's host draws from its own stream (seed 0), read a batch at a time.
    indexed = {
        name: (with_sample_index({"train": split}, seed=0)["train"], collate)
        for name, (split, collate) in paths.items()
    }
    return indexed


def time_batches(split, collate, batches) -> tuple[float, float, int]:
    """(images per CPU second of this process, images per wall second, bytes per image of the collated batch)."""
    cpu, wall, count, nbytes = time.process_time(), time.perf_counter(), 0, 0
    for indices in batches:
        pixels = collate(split.__getitems__(indices))["pixel_values"]
        count += pixels.shape[0]
        nbytes += pixels.numel() * pixels.element_size()
    return count / (time.process_time() - cpu), count / (time.perf_counter() - wall), nbytes // count


def draft_decode_rates(jpegs: list[bytes], repeats: int = 3) -> dict:
    """Decode-only images/s: full size, and PIL's draft at 1/2 and 1/4 (libjpeg's DCT scaling), interleaved."""

    def decode(reduction: int):
        for data in jpegs:
            image = Image.open(io.BytesIO(data))
            if reduction > 1:
                image.draft("RGB", (image.width // reduction, image.height // reduction))
            image.load()

    rates = {1: [], 2: [], 4: []}
    for _ in range(repeats):
        for reduction in rates:
            start = time.process_time()
            decode(reduction)
            rates[reduction].append(len(jpegs) / (time.process_time() - start))
    full = statistics.median(rates[1])
    return {
        "full_images_per_s": round(full, 1),
        "draft_half_images_per_s": round(statistics.median(rates[2]), 1),
        "draft_quarter_images_per_s": round(statistics.median(rates[4]), 1),
        "draft_half_speedup": round(statistics.median(rates[2]) / full, 2),
        "draft_quarter_speedup": round(statistics.median(rates[4]) / full, 2),
    }


def draft_fired(sizes: list[tuple[int, int]], scale_min: float = 0.08) -> dict:
    """How often (b) decodes at reduced size at 224 px: training boxes (random resized crops) and whole-image eval."""
    torch.manual_seed(0)
    train = []
    for w, h in sizes:
        top, left, bh, bw = random_resized_crop_box(h, w, scale_min)
        train.append(jpeg_reduction((w, h), (left, top, left + bw, top + bh), (SIZE, SIZE)))
    evals = [jpeg_reduction((w, h), (0, 0, w, h), (SIZE, SIZE)) for w, h in sizes]
    return {
        "train_crops_reduced_fraction": round(float(np.mean([r > 1 for r in train])), 4),
        "eval_whole_image_reduced_fraction": round(float(np.mean([r > 1 for r in evals])), 4),
    }


def at_depth(depth: int, call):
    """`call()` run `depth` Python frames down: a DataLoader fetch inside the Trainer runs about 40-60 deep."""
    return call() if depth <= 0 else at_depth(depth - 1, call)


def host_draw_cost(samples: int = 2000, draws: int = 5, depths=(0, 50)) -> dict:
    """Microseconds per training sample of its host draws (`draws` uniforms: a crop box and a flip), the two ways
    a row has had its own randomness, at each stack depth:
    - seeded_generator: torch's CPU generator seeded per row inside `fork_rng` (the code before the counter-based
      streams). `torch.manual_seed` also queues the seed for each lazily initialised accelerator with
      `traceback.format_stack()`, whose cost grows with the stack's depth;
    - counter_stream: `sample_randomness.SampleDraws`, the n-th draw a SplitMix64 of (seed, epoch, row, n)."""

    def seeded_generator():
        for row in range(samples):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(sample_seed(0, 0, row))
                for _ in range(draws):
                    torch.rand(()).item()

    def counter_stream():
        for row in range(samples):
            stream = SampleDraws(0, 0, row)
            for _ in range(draws):
                stream.uniform()

    result = {}
    for depth in depths:
        for name, run in (("seeded_generator", seeded_generator), ("counter_stream", counter_stream)):
            start = time.process_time()
            at_depth(depth, run)
            result[f"{name}_us_at_depth_{depth}"] = round((time.process_time() - start) / samples * 1e6, 1)
    return result


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000, help="JPEGs written and timed (at least 2,000).")
    parser.add_argument("--batch_size", type=int, default=64, help="Images per batch.")
    parser.add_argument("--rounds", type=int, default=3, help="Warm rounds; each path times every batch per round.")
    parser.add_argument("--work_dir", help="Where the JPEGs and shards go (default: a temporary folder, removed).")
    parser.add_argument("--output_dir", default="benchmarks/results", help="Writes imagenet_shaped.json here.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    work = args.work_dir or tempfile.mkdtemp(prefix="imagenet_shaped_")
    try:
        jpeg_dir, shard_dir = os.path.join(work, "jpegs"), os.path.join(work, "shards")
        if not os.path.isdir(jpeg_dir):
            images = make_folder(jpeg_dir, args.images)
        else:
            images = {"count": args.images, "note": f"reused {jpeg_dir}"}
        cpu = time.process_time()
        prepared = prepare_shards(SourceSpec(train_dir=jpeg_dir), shard_dir, size=STORED, num_proc=1)
        prepared["images_per_cpu_s"] = round(args.images / (time.process_time() - cpu), 1)
        shard_bytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(shard_dir, "*", "*.parquet")))

        paths = build_paths(jpeg_dir, shard_dir, os.path.join(work, "arrow_cache"))  # (c)'s Arrow copy, removed
        n_train = min(len(split) for split, _ in paths.values())
        order = np.random.default_rng(0).permutation(n_train).tolist()
        batches = [order[i : i + args.batch_size] for i in range(0, n_train, args.batch_size)]
        torch.manual_seed(0)
        for split, collate in paths.values():  # warm-up: one batch each
            collate(split.__getitems__(batches[0]))

        rates, wall_rates, bytes_per_image = {name: [] for name in paths}, {name: [] for name in paths}, {}
        for _ in range(args.rounds):
            for name, (split, collate) in paths.items():
                rate, wall_rate, bytes_per_image[name] = time_batches(split, collate, batches)
                rates[name].append(rate)
                wall_rates[name].append(wall_rate)
        jpeg_files = [os.path.join(r, f) for r, _, fs in os.walk(jpeg_dir) for f in fs]
        stored_bytes = {  # what one image costs to read from disk, per path
            "a_per_sample": images.get("mean_kb", 0) * 1024,
            "b_host_crop": images.get("mean_kb", 0) * 1024,
            "c_shards_device": shard_bytes / prepared["rows"]["train"],
            "c_shards_host_slice": shard_bytes / prepared["rows"]["train"],
        }

        per_round = {name: [r / a for r, a in zip(rates[name], rates["a_per_sample"])] for name in paths}
        sample = [open(p, "rb").read() for p in sorted(jpeg_files)[:300]]
        sizes = [Image.open(p).size for p in jpeg_files]
        result = {
            "setup": {
                "cpu": cpu_model(),
                "cores_on_machine": os.cpu_count(),
                "threads": 1,
                "processes": 1,
                "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                "python": platform.python_version(),
                "torch": torch.__version__,
                "pillow": PIL.__version__,
                "libjpeg_turbo": features.version_feature("libjpeg_turbo"),
                "numpy": np.__version__,
                "images": images,
                "timed_images_per_round": n_train,
                "batch_size": args.batch_size,
                "rounds": args.rounds,
                "target_size": SIZE,
                "stored_size": STORED,
                "page_cache": "all files in the page cache (written just before; not dropped: needs root)",
            },
            "prepare": {**prepared, "shard_bytes": shard_bytes},
            "images_per_s_per_core": {name: round(statistics.median(r), 1) for name, r in rates.items()},
            "images_per_s_per_core_rounds": {name: [round(x, 1) for x in r] for name, r in rates.items()},
            "images_per_wall_s": {name: round(statistics.median(r), 1) for name, r in wall_rates.items()},
            "disk_read_mb_per_s_needed_per_core": {
                name: round(statistics.median(r) * stored_bytes[name] / 1e6, 1) for name, r in rates.items()
            },
            "ratio_to_per_sample": {name: round(statistics.median(r), 2) for name, r in per_round.items()},
            "bytes_per_image_host_to_device": bytes_per_image,
            "draft_decode": draft_decode_rates(sample),
            "draft_fired_at_224": draft_fired(sizes),
            "host_draws_per_sample": host_draw_cost(),
        }
        report_result(result, os.path.join(args.output_dir, "imagenet_shaped.json") if args.output_dir else None)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
