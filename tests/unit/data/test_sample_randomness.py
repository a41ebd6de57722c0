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
from hf_vit_scaling.data.sample_randomness import EpochOfDraws, PerSampleRandomness, sample_seed

ROWS = 12


def augmented_split(seed: int = 3) -> SampleIndexDataset:
    """12 different 16x16 RGB images; the training transform crops (from 30% of the area) and flips."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(ROWS)]
    transform = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=True, crop_scale_min=0.3, horizontal_flip=True)
    split = Dataset.from_dict({"image": images, "label": [i % 3 for i in range(ROWS)]}).with_format("numpy")

    def apply(batch):
        pixels = [transform(torch.as_tensor(np.asarray(img)).permute(2, 0, 1)) for img in batch["image"]]
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
