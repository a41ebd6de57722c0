"""Heterogeneous clusters: simulate slow ranks, and balance per-rank micro-batches to each rank's speed.

Balancing (heterogeneity-aware data parallelism). With world size W and global batch B (per optimizer micro-step),
rank r gets b_r samples, b_r proportional to its speed s_r, sum_r b_r = B. Data parallel engines (DDP, DeepSpeed
ZeRO 0-3) average gradients over ranks: g = (1/W) sum_r g_r. Rank r's loss is its mean loss times
w_r = b_r * W / B, so g = (1/W) sum_r (b_r W / B) mean_r = (1/B) sum_i grad loss_i: the gradient of the global
batch's mean loss, exactly what a homogeneous run with B/W per rank computes. (transformers 5 already does this
for models that take loss kwargs, ViT included: each rank's summed loss is divided by the global batch's item count
and multiplied by W. `VitTrainer` applies w_r itself only when the Trainer does not.)

Samples: each epoch is one permutation (seeded by seed + epoch); global batch k is permutation[k*B:(k+1)*B],
and rank r takes the contiguous slice [offset_r, offset_r + b_r) of it, offset_r = sum_{q<r} b_q. So every sample
of the epoch is seen exactly once, by exactly one rank. The last, short global batch is split in the same proportions.
"""

import math
import time

import torch

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import gather_object, global_batch_size


class SlowRankSimulator:
    """SIMULATION: stretch this rank's compute by `factor` (sleep for (factor-1) x the forward time after forward,
    and 2 x that after the backward reaches the logits: backward ~ 2x forward)."""

    def __init__(self, factor: float):
        self.factor = factor
        self._start = 0.0

    def attach(self, model: torch.nn.Module):
        def pre(module, args, kwargs):
            if module.training:
                self._start = time.perf_counter()

        def post(module, args, kwargs, output):
            if not module.training:
                return output
            extra = (self.factor - 1.0) * (time.perf_counter() - self._start)
            time.sleep(extra)
            logits = getattr(output, "logits", None)
            if logits is not None and logits.requires_grad:
                logits.register_hook(lambda grad: (time.sleep(2.0 * extra), grad)[1])
            return output

        return [
            model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True),
        ]


def split_batch(global_batch: int, shares: list[float]) -> list[int]:
    """Integer per-rank batches proportional to `shares`, summing to `global_batch`, each >= 1.

    Largest-remainder rounding: e.g. 64 over shares (2, 1) -> exact 42.67 / 21.33 -> 42 / 21 + 1 leftover to the
    largest remainder -> [43, 21].
    """
    if global_batch < len(shares):
        raise UserInputError(f"A global batch of {global_batch} cannot give each of {len(shares)} ranks a sample.")
    total = float(sum(shares))
    exact = [global_batch * s / total for s in shares]
    sizes = [max(1, int(e)) for e in exact]
    order = sorted(range(len(shares)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(sizes) < global_batch:
        sizes[order[i % len(order)]] += 1
        i += 1
    while sum(sizes) > global_batch:
        j = max(range(len(sizes)), key=lambda k: sizes[k])
        sizes[j] -= 1
    return sizes


class UnevenBatchSampler(torch.utils.data.Sampler):
    """Batches of this rank's slice of each global batch (see the module docstring)."""

    def __init__(
        self,
        dataset_size: int,
        sizes: list[int],
        rank: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ):
        self.n, self.sizes, self.rank = dataset_size, sizes, rank
        self.global_batch = sum(sizes)
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.n, self.global_batch)
        return full + (1 if rest >= len(self.sizes) and not self.drop_last else 0)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=generator).tolist()

    def __iter__(self):
        order = self._order()
        for k in range(len(self)):
            chunk = order[k * self.global_batch : (k + 1) * self.global_batch]
            sizes = self.sizes if len(chunk) == self.global_batch else split_batch(len(chunk), self.sizes)
            start = sum(sizes[: self.rank])
            yield chunk[start : start + sizes[self.rank]]


class _EpochAwareLoader(torch.utils.data.DataLoader):
    """The Trainer calls `set_epoch` on its dataloader: pass it on to our batch sampler (new permutation per epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


def uneven_batch_loader(
    dataset,
    sizes: list[int],
    collate_fn,
    rank: int,
    seed: int,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> torch.utils.data.DataLoader:
    """This rank's loader of `sizes[rank]`-image slices of each global batch (the rest: the Trainer's dataloader
    settings). Not to be passed through accelerate's prepare() (that would shard the batches again): the Trainer
    moves each batch to the device itself."""
    sampler = UnevenBatchSampler(len(dataset), sizes, rank, seed=seed, drop_last=drop_last)
    return _EpochAwareLoader(
        dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=num_workers, pin_memory=pin_memory
    )


def loss_weight(sizes: list[int], rank: int) -> float:
    """w_r = b_r x W / B: makes the engines' gradient average equal the global batch's mean-loss gradient."""
    return sizes[rank] * len(sizes) / sum(sizes)


def calibrate_speeds(model: torch.nn.Module, sample_batch: dict, steps: int = 3) -> list[float]:
    """Each rank times forward + backward on the same-sized batch (no collectives, gradients discarded) and the
    images/s of every rank are all-gathered. A short calibration at start; slow-rank simulation hooks apply."""
    model.train()
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in sample_batch.items()}
    model(**batch).loss.backward()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        model(**batch).loss.backward()
    speed = steps * batch["labels"].shape[0] / (time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return [float(s) for s in gather_object(speed)]


SLOW_RANKS_FIX = "Fix: write RANK:FACTOR pairs, e.g. '1:2.0' or '1:2.0,3:1.5' (rank >= 0, factor >= 1.0)."


def parse_slow_ranks(spec: str | None) -> dict[int, float]:
    """'1:2.0,3:1.5' -> {1: 2.0, 3: 1.5} (--simulate_slow_ranks): ranks >= 0, each once, finite factors >= 1.0 (a
    nan factor passes every comparison and an inf one sleeps forever, so both are refused by name)."""
    if not spec:
        return {}
    slow = {}
    for item in spec.split(","):
        try:
            rank_text, factor_text = item.split(":")
            rank, factor = int(rank_text), float(factor_text)
        except ValueError:
            raise UserInputError(
                f"--simulate_slow_ranks {spec!r}: {item!r} is not RANK:FACTOR. {SLOW_RANKS_FIX}"
            ) from None
        if rank < 0 or rank in slow or not (math.isfinite(factor) and factor >= 1.0):
            raise UserInputError(
                f"--simulate_slow_ranks {spec!r}: {item!r} needs a rank >= 0 named once and a finite factor >= 1.0 "
                f"(1.0 = normal speed). {SLOW_RANKS_FIX}"
            )
        slow[rank] = factor
    return slow


BALANCE_MODES = ("off", "calibrate")


def parse_balance_spec(spec: str) -> list[float] | None:
    """--balance_batches' grammar, checked at parse time whatever the world size: 'off' or 'calibrate' (None), or
    comma-separated positive finite shares ('1,3' -> [1.0, 3.0]); their count is checked against the world size by
    `parse_shares` once it is known."""
    if spec in BALANCE_MODES:
        return None
    try:
        shares = [float(x) for x in str(spec).split(",")]
    except ValueError:
        shares = []
    if not shares or not all(math.isfinite(s) and s > 0 for s in shares):
        raise UserInputError(
            f"--balance_batches {spec!r} is neither off, calibrate nor positive shares per rank. Fix: pass off, "
            "calibrate, or one positive share per rank such as 1,3."
        )
    return shares


def parse_shares(spec: str, world_size: int) -> list[float]:
    """'1,3' -> [1.0, 3.0] (one share per rank)."""
    shares = parse_balance_spec(spec)
    if shares is None or len(shares) != world_size:
        raise UserInputError(
            f"--balance_batches {spec!r}: give one positive share per rank ({world_size} ranks), e.g. '1,3'."
        )
    return shares


def balanced_rank_batches(
    mode: str, model, train_dataset, collate, world: int, per_device_batch: int, device
) -> list[int] | None:
    """Per-rank micro-batches for `--balance_batches` (None: equal batches): from explicit shares, or from a short
    calibration of every rank's speed on `device`. The same global batch (per-device batch x world) is kept."""
    if mode == "off" or world == 1:
        return None
    global_batch = global_batch_size(per_device_batch, 1, world)  # per micro-step
    if mode == "calibrate":
        model.to(device)
        sample = collate([train_dataset[i] for i in range(per_device_batch)])
        shares = calibrate_speeds(model, sample)
    else:
        shares = parse_shares(mode, world)
    sizes = split_batch(global_batch, shares)
    logger.info(
        f"Balanced micro-batches per rank: {sizes} (shares {[round(s, 3) for s in shares]}, "
        f"global batch {global_batch})"
    )
    return sizes
