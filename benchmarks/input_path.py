#!/usr/bin/env python
"""Input path benchmark: host-side images/s per core and host->device bytes per image, fast path vs per-sample path.

    python benchmarks/input_path.py --size 224 --images 2000 --output benchmarks/results/input_path.json

Setup: CIFAR-sized 32x32 RGB images (random pixels, PNG-decoded PIL images as a Hub dataset yields them), target
224 px, batch 64, one thread (`torch.set_num_threads(1)`), so the figure is per core.
Method: what the DataLoader worker does per batch is timed over `--images` images after one warm-up batch:
- both paths decode the PNG bytes (fresh PIL images per batch);
- per-sample path: PIL -> RGB -> tensor -> random resized crop -> antialiased bilinear resize to 224 -> flip ->
  normalise (hf_vit_scaling.data.host_transforms.ImageTransform), then stack: float32 (64, 3, 224, 224);
- fast path: PIL -> RGB -> uint8 tensor, then stack: uint8 (64, 3, 32, 32); resize/augment run later on the device.
Bytes per image = the collated batch's bytes / batch size (what crosses host->device).
"""

import argparse
import io
import time

import numpy as np
import torch
from _common import cpu_model, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)
from PIL import Image

from hf_vit_scaling.data.decoding import pil_to_uint8_tensor
from hf_vit_scaling.data.device_transforms import DevicePreprocessor, collate_uint8_batch
from hf_vit_scaling.data.host_transforms import ImageTransform


def make_png_bytes(n: int, side: int = 32) -> list[bytes]:
    rng = np.random.default_rng(0)
    encoded = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, format="PNG")
        encoded.append(buf.getvalue())
    return encoded


def decode(batch: list[bytes]) -> list[Image.Image]:
    """Fresh PIL images (decoded on first use), as a datasets Image feature yields them."""
    return [Image.open(io.BytesIO(b)) for b in batch]


def time_path(batches, make_batch) -> tuple[float, int]:
    make_batch(batches[0])  # warm-up
    start, nbytes, count = time.perf_counter(), 0, 0
    for batch in batches:
        out = make_batch(batch)
        nbytes += out.numel() * out.element_size()
        count += len(batch)
    return count / (time.perf_counter() - start), nbytes // count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=224, help="Model input size in pixels.")
    parser.add_argument("--images", type=int, default=2000, help="Images timed per path.")
    parser.add_argument("--batch_size", type=int, default=64, help="Images per batch.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here (with its provenance).")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images = make_png_bytes(args.images)
    batches = [images[i : i + args.batch_size] for i in range(0, len(images), args.batch_size)]
    mean = std = [0.5, 0.5, 0.5]
    per_sample = ImageTransform(args.size, mean, std, train=True)

    def per_sample_batch(batch):
        return torch.stack([per_sample(img) for img in decode(batch)])

    def fast_batch(batch):
        return collate_uint8_batch([{"pixel_values": pil_to_uint8_tensor(img), "labels": 0} for img in decode(batch)])[
            "pixel_values"
        ]

    slow_rate, slow_bytes = time_path(batches, per_sample_batch)
    fast_rate, fast_bytes = time_path(batches, fast_batch)
    # The device half of the fast path, timed here on the CPU for reference (on a GPU it is a few ms per batch).
    device_side = DevicePreprocessor(args.size, mean, std)
    uint8_batch = fast_batch(batches[0])
    start = time.perf_counter()
    for _ in range(3):
        device_side(uint8_batch, train=True)
    device_side_rate = 3 * len(batches[0]) / (time.perf_counter() - start)
    result = {
        "setup": {
            "cpu": cpu_model(),
            "threads": 1,
            "torch": torch.__version__,
            "source_images": "32x32 RGB PNG",
            "target_size": args.size,
            "batch_size": args.batch_size,
            "images_timed": args.images,
        },
        "per_sample": {"images_per_s_per_core": slow_rate, "bytes_per_image": slow_bytes},
        "fast": {"images_per_s_per_core": fast_rate, "bytes_per_image": fast_bytes},
        "speedup_host": fast_rate / slow_rate,
        "bytes_ratio": fast_bytes / slow_bytes,
        "fast_device_side_on_this_cpu_images_per_s": device_side_rate,
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
