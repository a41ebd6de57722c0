"""Host-side random draws seeded per sample: the same crop, flip and shift for a given (seed, epoch, row), however the
batches were loaded and whether or not the run was resumed.

The host transforms (`host_transforms.ImageTransform`: random resized crop, flip, shift; `crop_decode.CropDecoder`:
the random resized crop box) draw from torch's default CPU generator. Drawn from one shared stream, what image N gets
depends on everything drawn before it in that process, and on a resume that order changes:

- the Trainer fetches the first batches after the checkpoint (through accelerate's `skip_first_batches`, and
  `get_batch_samples` prefetches a step's batches) before it restores the checkpoint's generator states
  (transformers 5.24 `Trainer._run_epoch`: `get_batch_samples` comes before `_load_rng_state`);
- accelerate's `DataLoaderShard` fetches one batch ahead of the one it yields, so the state saved at step k already
  holds batch k + 1's host draws;
- DataLoader workers seed themselves from a base seed drawn when the iterator is created, which a resumed run does
  at another point of the stream, and each worker's stream depends on which batches it was handed.

Measured before this module (one process, `--input_path per_sample`, crop and flip on): 12 uninterrupted steps
against 6 + resume + 6 differed at every step after the resume (step 7: 2.401 against 2.302).

Here each training sample draws inside its own generator state: torch's CPU generator is seeded with a hash of
(seed, epoch, row) for that sample and restored afterwards (`torch.random.fork_rng`), so the shared stream (which
the device-side augmentations, drop path and Mixup/CutMix use, and which the checkpoint saves and restores) never
sees a host draw. The hash is numpy's `SeedSequence`, which mixes the three words so that nearby (epoch, row) pairs
do not give related streams. The sample's draws are then the same with 0 or N workers, with or without prefetching,
before and after a resume, on any number of processes. Data-parallel ranks differ because they read different rows;
the ranks of one sequence-parallel group read the same rows and so draw the same crops, as they must.

The epoch lives in a shared-memory tensor, so DataLoader workers (persistent ones included) read the value the
trainer set at the start of the epoch (`EpochOfDraws`).
"""

import contextlib
import math

import numpy as np
import torch
from transformers import TrainerCallback


def sample_seed(seed: int, epoch: int, row: int) -> int:
    """The seed of one sample's host draws: a 63-bit hash of (seed, epoch, row) (numpy's `SeedSequence`)."""
    return int(np.random.SeedSequence([seed, epoch, row]).generate_state(1, dtype=np.uint64)[0] >> 1)


@contextlib.contextmanager
def seeded_draws(seed: int, epoch: int, row: int):
    """torch's CPU generator seeded for (seed, epoch, row) inside the block, restored after it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sample_seed(seed, epoch, int(row)))
        yield


class PerSampleRandomness:
    """(seed, current epoch) of a training split; `drawing_for(row)` is the context of one sample's host draws."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # seen by the DataLoader's workers

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def drawing_for(self, row: int):
        """The context of `row`'s host draws in the current epoch (`seeded_draws`)."""
        return seeded_draws(self.seed, self.epoch, row)


class EpochOfDraws(TrainerCallback):
    """Sets the training split's epoch at the start of each epoch, before the Trainer creates the epoch's iterator
    (and so before workers copy the dataset). `state.epoch` is then the epoch about to run, or the fraction reached
    for a resumed run (5.6 = 6 of 10 steps into epoch 5): its floor is the epoch either way (epoch + steps / steps is
    exactly epoch + 1.0 at an epoch's end, and epoch + k / n < epoch + 1 for k < n)."""

    def __init__(self, randomness: PerSampleRandomness):
        self.randomness = randomness

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.randomness.set_epoch(math.floor(state.epoch or 0.0))
