"""The transforms of each input path (`input_path`), and what one costs on a CPU-only run.

`build_input_transforms` sets a path's host transforms on the splits and returns its collate and device
preprocessor. `cpu_seconds_per_image` runs a path end to end on a few training images, host and "device" halves
both: on a CPU-only run the device preprocessor runs on the same cores as the loader, so the path with the least
CPU time in total is the fastest one (`input_path.resolve_input_path` uses it to choose for variable-size images).
"""

import dataclasses
import random
import statistics
import time

import numpy as np
import torch
from datasets import DatasetDict

from hf_vit_scaling.data.crop_decode import attach_host_crop_transforms
from hf_vit_scaling.data.decoding import stack_batch
from hf_vit_scaling.data.device_transforms import DevicePreprocessor, attach_uint8_transforms, collate_uint8_batch
from hf_vit_scaling.data.host_transforms import attach_transforms

PROBE_BATCH = 16  # images per timed batch
PROBE_ROUNDS = 3  # timed batches per path, the paths taking turns; the median is kept


def build_input_transforms(data, path: str, size: int, mean, std, data_args, eval_crop_pct: float | None = None):
    """(splits, collate, device preprocessor or None) of input path `path` (resolved: not "auto")."""
    if path == "device":
        # uint8 batches cross to the device; resize, augmentation and normalisation run there, batched.
        preprocessor = DevicePreprocessor.from_data_args(size, mean, std, data_args)
        return attach_uint8_transforms(data), collate_uint8_batch, preprocessor
    if path == "host_crop":
        # Variable sizes: uint8 crops at the model's size are cut on the host (the random resized crop, or the
        # --eval_crop_pct centre crop); the flip, shifts and normalisation run on the device.
        preprocessor = DevicePreprocessor.from_data_args(size, mean, std, data_args, crop_on_device=False)
        return attach_host_crop_transforms(data, size, data_args, eval_crop_pct), collate_uint8_batch, preprocessor
    return attach_transforms(data, size, mean, std, data_args), stack_batch, None


def training_sample(data, images: int):
    """`data` with its first `images` training images and one validation image, in new split objects (setting
    their transforms leaves `data`'s alone)."""
    train, validation = data.splits["train"], data.splits["validation"]
    splits = DatasetDict(
        train=train.select(range(min(images, len(train)))),
        validation=validation.select(range(min(1, len(validation)))),
    )
    return dataclasses.replace(data, splits=splits)


def cpu_seconds_per_image(data, paths, build, batch: int = PROBE_BATCH, rounds: int = PROBE_ROUNDS) -> dict:
    """{path: CPU seconds per training image}, end to end: decode, host transforms and collate, then the device
    preprocessor in training mode, on the first `batch` * (`rounds` + 1) training images. Each path first runs one
    untimed batch; then the paths take turns, one batch each per round, and each keeps its median. CPU time of this
    process (`time.process_time`: every thread), so other jobs on the machine do not count. `build(data, path)` is
    `build_input_transforms` with the run's settings. The random generators (Python, NumPy, torch) are left as
    they were, so the run draws what it would have drawn without the probe."""
    sample = training_sample(data, batch * (rounds + 1))
    if len(sample.splits["train"]) < batch:
        return {}
    pipelines = {}
    for path in paths:
        copy = training_sample(sample, len(sample.splits["train"]))
        splits, collate, preprocessor = build(copy, path)
        pipelines[path] = (splits["train"], collate, preprocessor)
    states = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            times = {path: [] for path in paths}
            for index in range(rounds + 1):
                rows = list(range(index * batch, (index + 1) * batch))
                if rows[-1] >= len(sample.splits["train"]):
                    rows = list(range(batch))
                for path, (split, collate, preprocessor) in pipelines.items():
                    start = time.process_time()
                    pixels = collate([split[row] for row in rows])["pixel_values"]
                    if preprocessor is not None:
                        preprocessor(pixels, train=True)
                    if index:  # the first batch of each path warms up
                        times[path].append((time.process_time() - start) / batch)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
    return {path: statistics.median(values) for path, values in times.items()}
