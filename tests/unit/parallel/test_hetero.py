"""Heterogeneous ranks: per-rank batch shares, the loss weights that keep the global mean, the uneven batch
sampler, the --simulate_slow_ranks spec. The launched runs (equal gradients with uneven batches) are in
tests/launched/test_hetero_launched.py, the flags in --help in tests/launched/test_recipe_commands.py."""

from collections import Counter

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.hetero import (
    UnevenBatchSampler,
    loss_weight,
    parse_balance_spec,
    parse_shares,
    parse_slow_ranks,
    split_batch,
)


def test_split_batch_is_proportional_and_exact():
    assert split_batch(64, [2, 1]) == [43, 21]
    assert split_batch(64, [1, 1]) == [32, 32]
    assert split_batch(10, [1, 1, 1]) in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    assert sum(split_batch(97, [0.7, 1.9, 3.3, 0.1])) == 97
    assert min(split_batch(8, [100, 1])) == 1  # every rank gets at least one sample
    with pytest.raises(UserInputError):
        split_batch(1, [1, 1])


def test_loss_weights_make_the_average_the_global_mean():
    sizes = [43, 21]
    # (1/W) sum_r w_r * mean_r must weight each sample by 1/B: w_r / (W * b_r) = 1 / B.
    for r, b in enumerate(sizes):
        assert loss_weight(sizes, r) / (len(sizes) * b) == pytest.approx(1 / sum(sizes))


@pytest.mark.parametrize("n, sizes", [(100, [7, 3]), (103, [5, 2, 1]), (64, [32, 32])])
def test_every_sample_once_per_epoch_with_uneven_batches(n, sizes):
    for epoch in (0, 1):
        seen = []
        lengths = set()
        for rank in range(len(sizes)):
            sampler = UnevenBatchSampler(n, sizes, rank, seed=3)
            sampler.set_epoch(epoch)
            batches = list(sampler)
            lengths.add(len(batches))
            assert all(len(b) == sizes[rank] for b in batches[: n // sum(sizes)])
            seen += [i for b in batches for i in b]
        assert len(lengths) == 1  # every rank takes the same number of steps
        assert Counter(seen) == Counter(range(n))  # each sample exactly once


def test_epochs_reshuffle():
    first = list(UnevenBatchSampler(50, [3, 2], 0, seed=1))
    sampler = UnevenBatchSampler(50, [3, 2], 0, seed=1)
    sampler.set_epoch(1)
    assert list(sampler) != first


def test_parse_shares():
    assert parse_shares("1,3", 2) == [1.0, 3.0]
    with pytest.raises(UserInputError, match="one positive share per rank"):
        parse_shares("1,2,3", 2)


def test_parse_slow_ranks():
    assert parse_slow_ranks("1:2.0,3:1.5") == {1: 2.0, 3: 1.5}
    assert parse_slow_ranks(None) == {}


@pytest.mark.parametrize("spec", ["1:nan", "1:inf", "1:0.5", "-1:2.0", "1:2.0,1:3.0", "1", "a:2"])
def test_parse_slow_ranks_refuses_what_no_run_can_simulate(spec):
    """nan passes every comparison and inf sleeps forever. Fails if the factor's finiteness, the rank's sign or a
    repeated rank goes unchecked."""
    with pytest.raises(UserInputError, match=r"--simulate_slow_ranks .*Fix: write RANK:FACTOR pairs"):
        parse_slow_ranks(spec)


def test_parse_balance_spec_takes_its_grammar_without_the_world_size():
    assert parse_balance_spec("off") is None and parse_balance_spec("calibrate") is None
    assert parse_balance_spec("1,3") == [1.0, 3.0]
    for spec in ("sometimes", "1,0", "1,inf", "1,,2"):
        with pytest.raises(UserInputError, match="is neither off, calibrate nor positive shares"):
            parse_balance_spec(spec)
