"""The progress metric of MAE pretraining: k-NN accuracy of the encoder's features on a small labelled subset.

Protocol of DINO (Caron et al. 2021, §4.1 and `eval_knn.py`), which MAE's paper also reports: L2-normalised features,
cosine similarity, the k = 20 nearest training images vote for their class with weight exp(similarity / T),
T = 0.07; a query's prediction is the class with the most weight. The features are the encoder's output for the
whole image: no masking (mask ratio 0, patches in their order), the CLS token or the mean of the patch tokens.

Several processes: each rank encodes every world-th image of the bank and of the queries (padded to the same number
of batches, so every rank runs the same forwards: ZeRO-3 and FSDP2 gather weights in each forward, together), the
features are gathered (`torch.distributed.all_gather_object` through `parallel.distributed.gather_object`) and every
rank computes the same accuracy from them.
"""

import contextlib

import torch

from hf_vit_scaling.parallel.distributed import gather_object, rank_and_world


def knn_accuracy(
    bank_features: torch.Tensor,
    bank_labels: torch.Tensor,
    query_features: torch.Tensor,
    query_labels: torch.Tensor,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> float:
    """Top-1 accuracy of weighted k-NN voting (see the module docstring). Features are (n, d), labels (n,) ints;
    k above the bank's size uses the whole bank. Ties in the vote go to the lowest class index."""
    bank = torch.nn.functional.normalize(bank_features.float(), dim=1)
    queries = torch.nn.functional.normalize(query_features.float(), dim=1)
    num_classes = num_classes or int(max(bank_labels.max(), query_labels.max())) + 1
    k = min(k, bank.shape[0])
    similarity = queries @ bank.T  # (queries, bank): cosine similarity
    top_similarity, top_index = similarity.topk(k, dim=1)
    weights = (top_similarity / temperature).exp()
    votes = torch.zeros(queries.shape[0], num_classes, dtype=weights.dtype)
    votes.scatter_add_(1, bank_labels[top_index].long(), weights)
    predictions = votes.argmax(dim=1)
    return float((predictions == query_labels.long()).float().mean())


def pooled(last_hidden_state: torch.Tensor, features: str) -> torch.Tensor:
    """An image's feature from the encoder's output (batch, 1 + patches, width): `cls` the CLS token, `mean` the
    mean of the patch tokens."""
    if features == "cls":
        return last_hidden_state[:, 0]
    return last_hidden_state[:, 1:].mean(dim=1)


@contextlib.contextmanager
def unmasked(model):
    """Inside, the MAE encoder sees every patch: mask ratio 0 (transformers' `random_masking` keeps
    int(P · (1 - ratio)) patches)."""
    config = model.vit.embeddings.config
    ratio, config.mask_ratio = config.mask_ratio, 0.0
    try:
        yield
    finally:
        config.mask_ratio = ratio


def in_order_noise(batch: int, num_patches: int, device) -> torch.Tensor:
    """The `noise` that keeps the patches in their order (MAE sorts the noise to shuffle them) and draws nothing
    from the random generator: the training run's random draws are the same with and without k-NN evaluations."""
    return torch.arange(num_patches, dtype=torch.float32, device=device).expand(batch, num_patches)


def rank_rows(count: int, rank: int, world: int) -> list[int]:
    """This rank's rows of `count`: every world-th, padded with its last row (row 0 if it has none) to
    ceil(count / world) rows, so every rank runs the same number of forwards. Padding rows are dropped after
    the gather (`own_rows`)."""
    rows = list(range(rank, count, world))
    per_rank = -(-count // world)
    return rows + [rows[-1] if rows else 0] * (per_rank - len(rows))


def own_rows(count: int, rank: int, world: int) -> int:
    """How many of `rank_rows`' rows are the rank's own (not padding)."""
    return len(range(rank, count, world))


class KnnProbe:
    """k-NN accuracy of a `ViTMAEForPreTraining`'s encoder (see the module docstring). `split` is map-style with the
    evaluation transforms of the run's input path; its rows `bank_rows` are the memory bank, `query_rows` the images
    classified; `collate` makes their batches; `prepare(batch)` (the Trainer's `_prepare_inputs`) moves a batch to
    the device in the model's dtype."""

    def __init__(
        self,
        split,
        bank_rows: list[int],
        query_rows: list[int],
        collate,
        num_classes: int,
        k: int = 20,
        temperature: float = 0.07,
        features: str = "cls",
        batch_size: int = 64,
    ):
        self.split, self.bank_rows, self.query_rows, self.collate = split, bank_rows, query_rows, collate
        self.num_classes, self.k, self.temperature = num_classes, k, temperature
        self.features, self.batch_size = features, batch_size

    def batches(self, rows: list[int]):
        """Collated batches of `rows` of the split, in order."""
        for start in range(0, len(rows), self.batch_size):
            yield self.collate([self.split[row] for row in rows[start : start + self.batch_size]])

    def _encode(self, model, rows: list[int], prepare) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, labels) of `rows`: this rank encodes its share (`rank_rows`), gathered back in row order."""
        rank, world = rank_and_world()
        mine = [rows[i] for i in rank_rows(len(rows), rank, world)]
        captured = []
        hook = model.vit.register_forward_hook(
            lambda module, args, out: captured.append(pooled(out.last_hidden_state, self.features))
        )
        features, labels = [], []
        try:
            with torch.no_grad(), unmasked(model):
                for batch in self.batches(mine):
                    labels.append(torch.as_tensor(batch["labels"]))
                    pixels = prepare({"pixel_values": batch["pixel_values"]})["pixel_values"]
                    patches = model.vit.embeddings.patch_embeddings.num_patches
                    model(pixel_values=pixels, noise=in_order_noise(pixels.shape[0], patches, pixels.device))
                    features.append(captured.pop().float().cpu())
        finally:
            hook.remove()
        own = own_rows(len(rows), rank, world)
        parts = gather_object((torch.cat(features)[:own], torch.cat(labels)[:own]) if own else None)
        # Row i of `rows` is rank (i % world)'s (i // world)-th: interleave back into row order.
        order = [(i % world, i // world) for i in range(len(rows))]
        return torch.stack([parts[w][0][j] for w, j in order]), torch.stack([parts[w][1][j] for w, j in order])

    def accuracy(self, model, prepare) -> float:
        """Every rank: encode its share, gather, and return the same accuracy. Leaves the model's mode as found."""
        was_training = model.training
        model.eval()
        try:
            bank_features, bank_labels = self._encode(model, self.bank_rows, prepare)
            query_features, query_labels = self._encode(model, self.query_rows, prepare)
        finally:
            model.train(was_training)
        return knn_accuracy(
            bank_features, bank_labels, query_features, query_labels, self.k, self.temperature, self.num_classes
        )
