"""Tests `training.seeding`: per-rank seeds, the sequence-parallel group as one rank, the callback, the data order."""

from types import SimpleNamespace

import torch

from hf_vit_scaling.training.seeding import PerRankRandomness, data_parallel_rank, pin_data_order_seed, rank_seed


def test_rank_seeds_differ_for_every_rank_and_seed_and_rank_0_keeps_its_stream():
    seeds = {(seed, rank): rank_seed(seed, rank) for seed in range(20) for rank in range(1, 64)}
    assert len(set(seeds.values())) == len(seeds)  # no two (seed, rank) pairs share a stream
    assert all(0 <= s < 2**63 for s in seeds.values())
    assert set(seeds.values()).isdisjoint(range(20))  # nor any seed's rank 0 (which keeps the seed itself)
    assert rank_seed(42, 0) is None and rank_seed(42, 3) == rank_seed(42, 3)  # reproducible


def test_sequence_parallel_groups_are_one_data_parallel_rank():
    assert [data_parallel_rank(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [data_parallel_rank(r) for r in range(3)] == [0, 1, 2]


def draws_after_train_begin(process_index: int, sp_size: int = 1) -> torch.Tensor:
    torch.manual_seed(7)  # what set_seed(--seed) leaves every rank with
    args = SimpleNamespace(seed=7, process_index=process_index)
    PerRankRandomness(sp_size).on_train_begin(args, None, None)
    return torch.rand(4)


def test_the_callback_reseeds_every_rank_but_the_first():
    rank0, rank1, rank2 = (draws_after_train_begin(r) for r in range(3))
    torch.manual_seed(7)
    assert torch.equal(rank0, torch.rand(4))  # rank 0 (and a one-process run) draws as before
    assert not torch.equal(rank0, rank1) and not torch.equal(rank1, rank2)
    assert torch.equal(rank1, draws_after_train_begin(1))  # the same seed gives the same draws
    assert torch.equal(draws_after_train_begin(2, sp_size=2), draws_after_train_begin(3, sp_size=2))  # one SP group


def test_sequence_parallel_groups_draw_alike_within_and_apart_across():
    """dp 2 x sp 2: ranks 0 and 1 (group 0) draw alike, ranks 2 and 3 (group 1) alike, and the groups apart. Fails if
    every sequence-parallel rank keeps data-parallel rank 0's stream (one seed for all groups), which the launched
    runs' traces cannot show on their own: the groups read other rows there."""
    group0 = [draws_after_train_begin(r, sp_size=2) for r in (0, 1)]
    group1 = [draws_after_train_begin(r, sp_size=2) for r in (2, 3)]
    assert torch.equal(*group0) and torch.equal(*group1)
    assert not torch.equal(group0[0], group1[0])
    assert torch.equal(group1[0], draws_after_train_begin(1))  # group 1 draws as data-parallel rank 1 without SP


def test_the_data_order_seed_is_pinned_unless_given():
    args = SimpleNamespace(seed=5, data_seed=None)
    pin_data_order_seed(args)
    assert args.data_seed == 5
    given = SimpleNamespace(seed=5, data_seed=11)
    pin_data_order_seed(given)
    assert given.data_seed == 11
