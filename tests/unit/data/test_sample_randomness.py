"""Host draws seeded per sample: a training row's crop and flip depend on (seed, epoch, row) only, never on the
shared generator, the fetch order or the DataLoader's workers."""

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import TrainerState

from hf_vit_scaling.data.decoding import SampleIndexDataset, with_sample_index
from hf_vit_scaling.data.host_transforms import ImageTransform
from hf_vit_scaling.data.sample_randomness import (
    EpochOfDraws,
    PerSampleRandomness,
    SampleDraws,
    drawing_rows,
    each_sample,
    host_uniform,
    sample_seed,
)

ROWS = 12


def augmented_split(seed: int = 3) -> SampleIndexDataset:
    """12 different 16x16 RGB images; the training transform crops (from 30% of the area) and flips."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(ROWS)]
    transform = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=True, crop_scale_min=0.3, horizontal_flip=True)
    split = Dataset.from_dict({"image": images, "label": [i % 3 for i in range(ROWS)]}).with_format("numpy")

    def apply(batch):
        images = each_sample(batch["image"])  # what `decoding.set_pixel_transforms` does: a row's own draws
        pixels = [transform(torch.as_tensor(np.asarray(img)).permute(2, 0, 1)) for img in images]
        return {"pixel_values": pixels, "labels": batch["label"]}

    split.set_transform(apply)
    return with_sample_index({"train": split}, seed=seed)["train"]


def pixels(items) -> list[torch.Tensor]:
    return [item["pixel_values"] for item in items]


def test_a_row_draws_the_same_whatever_the_shared_generator_and_order():
    split = augmented_split()
    torch.manual_seed(0)
    forward = pixels(split.__getitems__(list(range(ROWS))))
    torch.manual_seed(12345)
    backward = pixels(split.__getitems__(list(reversed(range(ROWS)))))[::-1]
    assert all(torch.equal(a, b) for a, b in zip(forward, backward))


def test_the_shared_generator_never_sees_a_host_draw():
    split = augmented_split()
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    split.__getitems__(list(range(ROWS)))
    assert torch.equal(torch.rand(4), expected)


def test_each_epoch_and_each_seed_draws_anew():
    split = augmented_split()
    epoch0 = pixels(split.__getitems__(list(range(ROWS))))
    split.randomness.set_epoch(1)
    epoch1 = pixels(split.__getitems__(list(range(ROWS))))
    other_seed = pixels(augmented_split(seed=4).__getitems__(list(range(ROWS))))
    assert sum(not torch.equal(a, b) for a, b in zip(epoch0, epoch1)) >= ROWS - 1
    assert sum(not torch.equal(a, b) for a, b in zip(epoch0, other_seed)) >= ROWS - 1


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_draw_what_the_main_process_draws(workers):
    """Persistent workers too: they read the epoch set after they started (shared memory)."""
    split = augmented_split()
    expected = {}
    for epoch in (0, 1):
        split.randomness.set_epoch(epoch)
        expected[epoch] = torch.stack(pixels(split.__getitems__(list(range(ROWS)))))
    split.randomness.set_epoch(0)
    loader = torch.utils.data.DataLoader(split, batch_size=4, num_workers=workers, collate_fn=pixels,
                                         persistent_workers=workers > 0)  # fmt: skip
    for epoch in (0, 1):
        split.randomness.set_epoch(epoch)
        got = torch.stack([p for batch in loader for p in batch])
        assert torch.equal(got, expected[epoch]), f"epoch {epoch}"


def test_the_eval_split_keeps_the_shared_generator():
    splits = with_sample_index({"train": [1], "validation": [2]}, seed=0)
    assert splits["train"].randomness is not None and splits["validation"].randomness is None


@pytest.mark.parametrize("state_epoch, epoch", [(0.0, 0), (None, 0), (3.0, 3), (5.6, 5), (7 + 9 / 10, 7)])
def test_the_epoch_is_the_floor_of_the_trainer_s_epoch(state_epoch, epoch):
    """At an epoch's start the Trainer's epoch is whole; resumed mid-epoch it is the fraction reached."""
    randomness = PerSampleRandomness(0)
    EpochOfDraws(randomness).on_epoch_begin(None, TrainerState(epoch=state_epoch), None)
    assert randomness.epoch == epoch == math.floor(state_epoch or 0)


def test_sample_seeds_are_distinct_and_non_negative():
    seeds = {sample_seed(seed, epoch, row) for seed in (0, 1) for epoch in range(3) for row in range(100)}
    assert len(seeds) == 600 and min(seeds) >= 0 and max(seeds) < 2**63


def test_a_row_draws_the_same_fetched_alone_or_in_any_batch():
    """Fails if a row's draws depended on its place in the batch (e.g. one stream per batch, not per row)."""
    split = augmented_split()
    alone = [split[row]["pixel_values"] for row in range(ROWS)]
    halves = pixels(split.__getitems__([7, 3, 11, 0, 5, 9])) + pixels(split.__getitems__([1, 2, 4, 6, 8, 10]))
    by_row = dict(zip([7, 3, 11, 0, 5, 9, 1, 2, 4, 6, 8, 10], halves))
    assert all(torch.equal(alone[row], by_row[row]) for row in range(ROWS))


def test_draws_are_uniform_and_rows_independent():
    """Each row's stream is uniform on [0, 1) (mean 1/2, variance 1/12) and uncorrelated with the next row's.
    Fails if rows shared a stream offset by one (row r + 1's draws = row r's shifted) or the mixing were dropped."""

    def stream(row: int) -> list[float]:
        draws = SampleDraws(42, 0, row)
        return [draws.uniform() for _ in range(8)]

    streams = np.array([stream(row) for row in range(4000)])
    assert len(set(streams[0])) == 8
    assert streams.min() >= 0.0 and streams.max() < 1.0
    assert abs(streams.mean() - 0.5) < 0.01 and abs(streams.var() - 1 / 12) < 0.005
    next_row = np.corrcoef(streams[:-1].ravel(), streams[1:].ravel())[0, 1]
    shifted = np.corrcoef(streams[:-1, 1:].ravel(), streams[1:, :-1].ravel())[0, 1]
    assert abs(next_row) < 0.02 and abs(shifted) < 0.02


def test_a_batch_whose_transform_skips_rows_is_refused():
    """The rows of a batch take their streams in order: a transform that handled fewer samples than were fetched
    would hand later rows the wrong draws, so it stops. Fails if the check in `drawing_rows` were removed."""
    with pytest.raises(RuntimeError, match="not transformed"):
        with drawing_rows(0, 0, [0, 1, 2]):
            for _ in zip(range(2), each_sample(["a", "b", "c"])):
                pass


def test_outside_a_training_batch_the_shared_generator_draws():
    torch.manual_seed(3)
    expected = torch.rand(()).item()
    torch.manual_seed(3)
    assert host_uniform() == expected
