"""Random draws that differ across data-parallel ranks, reproducible from `--seed`, exact across a resume.

The Trainer seeds every process with the same `--seed`, so without this every rank draws the same random numbers at
a given step: rank 0's i-th image and rank 7's i-th image get the same crop, flip, RandAugment ops, erasing box,
Mixup/CutMix lambda and drop-path mask. Across 8 ranks that is 8 times fewer distinct augmentations per step than
the data-parallel batch promises.

What this does, at the start of training (after the model is built, so every rank starts from the same weights):
- data-parallel rank 0 keeps the stream `--seed` gave it (a one-process run draws exactly as before);
- data-parallel rank d > 0 reseeds torch's generators (CPU and every device) with a seed derived from (seed, d) by
  numpy's `SeedSequence`, which hashes the pair so that no (seed, rank) collides with another seed's rank 0
  (seed + d would: seed 1 rank 1 = seed 2 rank 0).
- The ranks of one sequence-parallel group are one data-parallel rank (`rank // sequence_parallel_size`): they see
  the same images and must draw the same drop-path masks.

Every device-side augmentation (`data.device_transforms`, `regularization.batch_augmenter`, `mixing`,
`rand_augment`) and drop path draw from the default generators, so all of these follow. The host transforms (crop,
flip, shift on the per_sample and host_crop paths) do not: each training row draws from its own seed, (seed, epoch,
row) (`data.sample_randomness`), so ranks differ because they read different rows, and the draws do not depend on
the DataLoader's workers or on where a resume restores the default generators.

A resume stays exact: the Trainer saves each process's generator states in every checkpoint (`rng_state_{rank}.pth`)
and restores them after `on_train_begin`. The training sampler's order does not
follow the reseeded generator: `data_seed` is set to `--seed` when not given (`pin_data_order_seed`), so every rank
shuffles the data set the same way and takes its own shard, as before.
"""

import numpy as np
import torch
from transformers import TrainerCallback


def data_parallel_rank(rank: int, sequence_parallel_size: int = 1) -> int:
    """Ranks [k N, (k+1) N) form sequence-parallel group k (`parallel.sequence_parallel`): one data-parallel rank."""
    return rank // sequence_parallel_size


def rank_seed(seed: int, dp_rank: int) -> int | None:
    """The seed of data-parallel rank `dp_rank`'s draws; None for rank 0, which keeps `seed`'s own stream."""
    if dp_rank == 0:
        return None
    return int(np.random.SeedSequence([seed, dp_rank]).generate_state(1, dtype=np.uint64)[0] >> 1)


def pin_data_order_seed(training_args) -> None:
    """The sampler seeds its shuffle from `data_seed`, else from torch's initial seed, which the per-rank reseed
    changes: pin it to `--seed` so every rank shuffles alike (the order is the one `--seed` gave before)."""
    if training_args.data_seed is None:
        training_args.data_seed = training_args.seed


class PerRankRandomness(TrainerCallback):
    """Reseeds this process's generators at train begin when its data-parallel rank is not 0 (module docstring)."""

    def __init__(self, sequence_parallel_size: int = 1):
        self.sequence_parallel_size = sequence_parallel_size
        self.seed = None  # the seed this rank drew with, None when it kept `--seed`'s stream

    def on_train_begin(self, args, state, control, **kwargs):
        self.seed = rank_seed(args.seed, data_parallel_rank(args.process_index, self.sequence_parallel_size))
        if self.seed is not None:
            torch.manual_seed(self.seed)  # seeds the CPU generator and every device's
