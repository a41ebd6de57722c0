"""`VitTrainer`: the Trainer with our model card on push, and optional per-rank balanced micro-batches."""

import torch
from transformers import Trainer

from .hetero import UnevenBatchSampler, loss_weight
from .model_card import write_model_card
from .sequence_parallel import shard_dataloader_by_data_parallel_rank


class _EpochAwareLoader(torch.utils.data.DataLoader):
    """The Trainer calls `set_epoch` on its dataloader: pass it on to our batch sampler (new permutation per epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class VitTrainer(Trainer):
    """The Trainer, plus:
    - `card_info`: `push_to_hub` writes our model card instead of the generic one before uploading;
    - `sequence_parallel`: training batches sharded by data-parallel rank (`hf_vit_scaling.sequence_parallel`);
    - `rank_batches`: per-rank micro-batch sizes (heterogeneous clusters). Each rank then reads its own slice of
      every global batch and weights its loss by b_r x W / B (see `hf_vit_scaling.hetero`).
    """

    card_info: dict | None = None
    rank_batches: list[int] | None = None
    sequence_parallel = None  # a ViTSequenceParallel: the ranks of one SP group read the same batches

    def create_model_card(self, *args, **kwargs):
        if self.card_info is None or not self.is_world_process_zero():
            return super().create_model_card(*args, **kwargs)
        write_model_card(self.args.output_dir, self.card_info)

    def get_train_dataloader(self):
        if self.sequence_parallel is not None:
            sp = self.sequence_parallel
            return shard_dataloader_by_data_parallel_rank(super().get_train_dataloader(), sp.dp_size, sp.dp_rank)
        if not self.rank_batches:
            return super().get_train_dataloader()
        sampler = UnevenBatchSampler(len(self.train_dataset), self.rank_batches, self.args.process_index,
                                     seed=self.args.data_seed or self.args.seed,
                                     drop_last=self.args.dataloader_drop_last)
        # Not passed through accelerate's prepare(): that would shard the batches again. The Trainer moves each
        # batch to the device itself (`_prepare_inputs`).
        return _EpochAwareLoader(self.train_dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                                 num_workers=self.args.dataloader_num_workers,
                                 pin_memory=self.args.dataloader_pin_memory)

    def _loss_normalised_by_global_count(self, num_items_in_batch) -> bool:
        """transformers 5 already sums each rank's loss and divides by the item count of the whole global batch
        (gathered over ranks) and multiplies by the world size, when the model takes loss kwargs (ViT does) and
        `average_tokens_across_devices` is on (the default): that is exactly w_r x mean_r, so nothing to add."""
        return (num_items_in_batch is not None and bool(self.model_accepts_loss_kwargs)
                and bool(self.args.average_tokens_across_devices))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                      num_items_in_batch=num_items_in_batch)
        if not self.rank_batches or not model.training or self._loss_normalised_by_global_count(num_items_in_batch):
            return result
        weight = loss_weight(self.rank_batches, self.args.process_index)
        if return_outputs:
            return result[0] * weight, result[1]
        return result * weight
