"""The k-NN progress metric (pretraining/knn.py): the vote on constructed feature sets whose answer is known, the
rows each rank encodes, and the probe's features: the encoder's output on every patch, in order, drawing nothing
from the run's random generator."""

import pytest
import torch
from transformers import ViTMAEConfig, ViTMAEForPreTraining

from hf_vit_scaling.data.decoding import stack_batch
from hf_vit_scaling.pretraining.knn import KnnProbe, knn_accuracy, own_rows, pooled, rank_rows


def test_separable_features_score_one():
    # Two classes along two axes, small jitter: every query's 20 nearest neighbours are of its own class.
    generator = torch.Generator().manual_seed(0)
    bank = torch.cat([torch.tensor([[1.0, 0.0]]).repeat(25, 1), torch.tensor([[0.0, 1.0]]).repeat(25, 1)])
    bank = bank + 0.01 * torch.randn(50, 2, generator=generator)
    labels = torch.tensor([0] * 25 + [1] * 25)
    queries = torch.tensor([[2.0, 0.1], [0.1, 3.0], [1.0, -0.05]])
    assert knn_accuracy(bank, labels, queries, torch.tensor([0, 1, 0]), k=20) == 1.0
    assert knn_accuracy(bank, labels, queries, torch.tensor([1, 0, 1]), k=20) == 0.0  # every answer wrong


def test_votes_are_weighted_by_similarity_and_cosine_ignores_length():
    # k = 3: one very close neighbour of class 1 outweighs two farther ones of class 0 (exp(cos / 0.07)); a plain
    # majority vote would say class 0. Lengths do not matter (cosine): the bank's class-1 vector is 100x longer.
    bank = torch.tensor([[100.0, 0.0], [0.6, 0.8], [0.6, -0.8], [-1.0, 0.0]])
    labels = torch.tensor([1, 0, 0, 2])
    query = torch.tensor([[1.0, 0.0]])
    assert knn_accuracy(bank, labels, query, torch.tensor([1]), k=3, temperature=0.07) == 1.0
    # With a very high temperature every neighbour weighs about the same: the majority (class 0) wins.
    assert knn_accuracy(bank, labels, query, torch.tensor([0]), k=3, temperature=1e6) == 1.0
    # k larger than the bank: the whole bank votes (class 2's opposite vector weighs exp(-1/0.07), nothing).
    assert knn_accuracy(bank, labels, query, torch.tensor([1]), k=50) == 1.0


def test_half_right_is_one_half():
    bank = torch.eye(4)
    labels = torch.tensor([0, 1, 2, 3])
    queries = torch.eye(4) + 0.1
    assert knn_accuracy(bank, labels, queries, torch.tensor([0, 1, 3, 2]), k=1) == 0.5


@pytest.mark.parametrize("count, world", [(10, 2), (7, 2), (5, 3), (1, 2)])
def test_every_rank_runs_the_same_number_of_rows_and_each_row_is_owned_once(count, world):
    shares = [rank_rows(count, rank, world) for rank in range(world)]
    assert len({len(share) for share in shares}) == 1  # the same forwards on every rank (ZeRO-3, FSDP2)
    owned = [row for rank in range(world) for row in shares[rank][: own_rows(count, rank, world)]]
    assert sorted(owned) == list(range(count))


def tiny_mae(mask_ratio=0.75):
    config = ViTMAEConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, decoder_hidden_size=8, decoder_num_hidden_layers=1,
                          decoder_num_attention_heads=2, decoder_intermediate_size=16,
                          mask_ratio=mask_ratio)  # fmt: skip
    torch.manual_seed(0)
    return ViTMAEForPreTraining(config)


@pytest.mark.parametrize("features", ["cls", "mean"])
def test_probe_features_are_the_unmasked_encoder_output(features):
    model = tiny_mae()
    images = torch.randn(6, 3, 8, 8)
    split = [{"pixel_values": images[i], "labels": i % 2} for i in range(6)]
    probe = KnnProbe(split, [0, 1, 2, 3], [4, 5], stack_batch, num_classes=2, k=2, features=features, batch_size=3)
    state = torch.get_rng_state()
    bank, labels = probe._encode(model.eval(), probe.bank_rows, lambda batch: batch)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn: training's random draws are unchanged
    assert model.config.mask_ratio == 0.75  # restored after
    assert labels.tolist() == [0, 1, 0, 1]
    # The same as the encoder on every patch in its order: position embeddings added, nothing shuffled or dropped.
    model.config.mask_ratio = 0.0
    with torch.no_grad():
        out = model.vit(images[:4], noise=torch.arange(4.0).expand(4, 4))
    assert torch.equal(out.ids_restore, torch.arange(4).expand(4, 4)) and out.mask.sum() == 0
    assert torch.allclose(bank, pooled(out.last_hidden_state, features), atol=1e-6)
    model.config.mask_ratio = 0.75
    assert 0.0 <= probe.accuracy(model.train(), lambda batch: batch) <= 1.0 and model.training
