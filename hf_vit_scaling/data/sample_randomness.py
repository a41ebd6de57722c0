"""Host-side random draws seeded per sample: the same crop, flip and shift for a given (seed, epoch, row), however the
batches were loaded and whether or not the run was resumed.

The host transforms (`host_transforms.ImageTransform`: random resized crop, flip, shift; `crop_decode.CropDecoder`:
the random resized crop box) draw through `host_uniform` / `host_randint`. Drawn from one shared stream, what image
N gets would depend on everything drawn before it in that process, and on a resume that order changes:

- the Trainer fetches the first batches after the checkpoint (through accelerate's `skip_first_batches`, and
  `get_batch_samples` prefetches a step's batches) before it restores the checkpoint's generator states
  (`Trainer._run_epoch` calls `get_batch_samples` before `_load_rng_state`; the version read: docs/fast_input.md,
  "Exact resume without losing the gain");
- accelerate's `DataLoaderShard` fetches one batch ahead of the one it yields, so the state saved at step k already
  holds batch k + 1's host draws;
- DataLoader workers seed themselves from a base seed drawn when the iterator is created, which a resumed run does
  at another point of the stream, and each worker's stream depends on which batches it was handed.

So each training sample draws from its own counter-based stream instead: draw n of row r in epoch e is
SplitMix64(row_key + (n + 1) * GAMMA), row_key = SplitMix64(epoch_key + (r + 1) * GAMMA), epoch_key = numpy's
`SeedSequence([seed, epoch])` (which mixes the two words so that nearby epochs do not give related keys). SplitMix64
(Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014; constants from Vigna's
splitmix64.c) is a bijective 64-bit mix of a Weyl sequence: the n-th output of a stream needs no state but n, so a
draw is a few integer operations and a sample needs no generator object. The shared generators (which the
device-side augmentations, drop path and Mixup/CutMix use, and which the checkpoint saves and restores) never see a
host draw. A sample's draws are the same with 0 or N workers, with or without prefetching, before and after a
resume, on any number of processes. Data-parallel ranks differ because they read different rows; the ranks of one
sequence-parallel group read the same rows and so draw the same crops, as they must.

Where the time went before: each sample used to seed torch's CPU generator (`torch.manual_seed` inside
`torch.random.fork_rng`). `torch.manual_seed` also queues the seed for every lazily initialised accelerator, and each
queued call records `traceback.format_stack()` (torch/cuda/__init__.py `_lazy_call`), whose cost grows with the
Python stack: inside the Trainer's DataLoader more than the host-crop path's whole per-image work (measured:
docs/fast_input.md, "Exact resume without losing the gain"). And the dataset was read one row at a time (one Arrow
read and one transform call per row) so that each row could be seeded; now the batch is read at once and the rows
take their draws in order (`drawing_rows`, `each_sample`).

The epoch lives in a shared-memory tensor, so DataLoader workers (persistent ones included) read the value the
trainer set at the start of the epoch (`EpochOfDraws`).
"""

import contextlib
import functools
import math
import threading

import numpy as np
import torch
from transformers import TrainerCallback

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's Weyl increment: 2**64 / the golden ratio, odd
UNIT = 2.0**-53  # a 53-bit integer times this is a double in [0, 1)


def splitmix64(state: int) -> int:
    """SplitMix64's output function (Vigna's splitmix64.c): a bijective mix of a 64-bit state."""
    z = state & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def sample_seed(seed: int, epoch: int, row: int) -> int:
    """A 63-bit seed for (seed, epoch, row) (numpy's `SeedSequence`): seeds a whole DataLoader's generator."""
    return int(np.random.SeedSequence([seed, epoch, row]).generate_state(1, dtype=np.uint64)[0] >> 1)


@functools.lru_cache(maxsize=64)
def epoch_key(seed: int, epoch: int) -> int:
    """The 64-bit key of an epoch's draws (numpy's `SeedSequence([seed, epoch])`), computed once per epoch."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1, dtype=np.uint64)[0])


class SampleDraws:
    """One sample's stream of uniform draws: the n-th is SplitMix64(row_key + (n + 1) * GAMMA)."""

    __slots__ = ("_state",)

    def __init__(self, seed: int, epoch: int, row: int):
        self._state = splitmix64(epoch_key(seed, epoch) + (int(row) + 1) * GAMMA)

    def uniform(self) -> float:
        """The next draw, a double in [0, 1) (the top 53 bits of the 64-bit output)."""
        self._state = (self._state + GAMMA) & MASK64
        return (splitmix64(self._state) >> 11) * UNIT


_active = threading.local()  # .rows: the pending batch's SampleDraws in order; .sample: the one drawing now


def current_draws() -> SampleDraws | None:
    return getattr(_active, "sample", None)


def host_uniform(low: float = 0.0, high: float = 1.0) -> float:
    """A uniform draw in [low, high): from the current sample's stream, or torch's default generator outside one
    (evaluation draws nothing; tests and the input-path probe draw from the shared stream)."""
    draws = current_draws()
    u = draws.uniform() if draws is not None else torch.rand(()).item()
    return low + (high - low) * u


def host_randint(low: int, high: int) -> int:
    """An integer in [low, high), as `torch.randint(low, high, ())` draws it outside a sample's stream."""
    draws = current_draws()
    if draws is None:
        return int(torch.randint(low, high, ()).item())
    return low + min(int(draws.uniform() * (high - low)), high - low - 1)


@contextlib.contextmanager
def drawing_for_row(seed: int, epoch: int, row: int):
    """Inside the block the host draws come from `row`'s stream (one example at a time: the streamed loader)."""
    previous = current_draws()
    _active.sample = SampleDraws(seed, epoch, row)
    try:
        yield
    finally:
        _active.sample = previous


@contextlib.contextmanager
def drawing_rows(seed: int, epoch: int, rows):
    """A batch of `rows` is about to be transformed in that order (datasets' batched `__getitems__`): `each_sample`
    hands each row its own stream. Raises if the transform handled another number of samples than `rows`."""
    pending = [SampleDraws(seed, epoch, row) for row in rows]
    outer = getattr(_active, "rows", None), current_draws()
    _active.rows = pending
    try:
        yield
        if pending:
            raise RuntimeError(f"{len(pending)} of {len(rows)} rows were not transformed: host draws out of step")
    finally:
        _active.rows, _active.sample = outer


def each_sample(values):
    """Iterate a batch's stored images; while each is transformed, the host draws come from its row's stream (when
    the batch was fetched under `drawing_rows`; otherwise the draws are left as they are)."""
    pending = getattr(_active, "rows", None)
    for value in values:
        if pending is not None:
            if not pending:
                raise RuntimeError("more samples were transformed than rows fetched: host draws out of step")
            _active.sample = pending.pop(0)
        yield value


class PerSampleRandomness:
    """(seed, current epoch) of a training split; `drawing_rows(rows)` is the context of a batch's host draws."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # seen by the DataLoader's workers

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def drawing_rows(self, rows):
        """The context in which the batch of `rows` is fetched and transformed (`drawing_rows`)."""
        return drawing_rows(self.seed, self.epoch, rows)


class EpochOfDraws(TrainerCallback):
    """Sets the training split's epoch at the start of each epoch, before the Trainer creates the epoch's iterator
    (and so before workers copy the dataset). `state.epoch` is then the epoch about to run, or the fraction reached
    for a resumed run (5.6 = 6 of 10 steps into epoch 5): its floor is the epoch either way (epoch + steps / steps is
    exactly epoch + 1.0 at an epoch's end, and epoch + k / n < epoch + 1 for k < n)."""

    def __init__(self, randomness: PerSampleRandomness):
        self.randomness = randomness

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.randomness.set_epoch(math.floor(state.epoch or 0.0))
