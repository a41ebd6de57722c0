"""The transforms of each input path (`input_path`), and what one costs on a CPU-only run.

`build_input_transforms` sets a path's host transforms on the splits and returns its collate and device
preprocessor (the path's own `InputPath.attach_map_style`). `cpu_seconds_per_image` runs a path end to end on a few
training images, host and "device" halves both: on a CPU-only run the device preprocessor runs on the same cores as
the loader, so the path with the least CPU time in total is the fastest one (`input_path.resolve_input_path` uses it
to choose for variable-size images).
"""

import dataclasses
import random
import statistics
import time

import numpy as np
import torch
from datasets import DatasetDict

from hf_vit_scaling.data.input_path import input_path_named

PROBE_BATCH = 16  # images per timed batch
PROBE_ROUNDS = 3  # timed batches per path, the paths taking turns; the median is kept


def build_input_transforms(data, path, size: int, mean, std, data_args, eval_crop_pct: float | None = None):
    """(splits, collate, device preprocessor or None) of input path `path` (an `InputPath`, or a resolved name: not
    "auto"), its host transforms set on map-style `data` (`InputPath.attach_map_style`)."""
    return input_path_named(path).attach_map_style(data, size, mean, std, data_args, eval_crop_pct)


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
