"""`VitTrainer`: the Trainer with our model card on push, per-rank balanced micro-batches, and the reliability
pieces: checkpoints marked complete, clear errors for failed saves and non-finite losses, skipped-image counts and
an optional per-step trace of the samples each rank trains on."""

import json
import os

import torch
import torch.distributed as dist
from transformers import Trainer
from transformers.trainer_utils import rotate_checkpoints

from .checkpoints import mark_checkpoint_complete, newest_complete_checkpoint
from .deepspeed_config import zero_stage
from .faults import SigkillFault, failing_writes, faults_from_env, poison_forward
from .hetero import UnevenBatchSampler, loss_weight
from .model_card import write_model_card
from .sequence_parallel import shard_dataloader_by_data_parallel_rank
from .throughput import gather_object

TRACE_DIRNAME = "sample_trace"


class TrainingStopped(Exception):
    """Training ended on purpose with a message for the user (the recipe prints it and exits 1)."""


class NonFiniteLossError(TrainingStopped):
    pass


class CheckpointSaveError(TrainingStopped):
    pass


class _EpochAwareLoader(torch.utils.data.DataLoader):
    """The Trainer calls `set_epoch` on its dataloader: pass it on to our batch sampler (new permutation per epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class VitTrainer(Trainer):
    """The Trainer, plus:
    - `card_info`: `push_to_hub` writes our model card instead of the generic one before uploading;
    - `sequence_parallel`: training batches sharded by data-parallel rank (`hf_vit_scaling.sequence_parallel`);
    - `rank_batches`: per-rank micro-batch sizes (heterogeneous clusters). Each rank then reads its own slice of
      every global batch and weights its loss by b_r x W / B (see `hf_vit_scaling.hetero`);
    - `nonfinite_policy`: a NaN/inf training loss on any rank stops training with a clear error ("stop") or skips
      that optimizer step on every rank ("skip"); the ranks agree through one all-reduce of a flag per micro-step;
    - checkpoints: each save is marked complete (`checkpoint_complete.json`) before old ones are rotated away; a save
      that fails raises `CheckpointSaveError` naming the newest complete checkpoint;
    - `bad_samples`: images that could not be decoded and were left out of their batch (see `data.py`);
    - `trace_samples`: append each step's dataset indices to output_dir/sample_trace/rank{R}.jsonl.
    """

    card_info: dict | None = None
    rank_batches: list[int] | None = None
    sequence_parallel = None  # a ViTSequenceParallel: the ranks of one SP group read the same batches

    def __init__(self, *args, nonfinite_policy: str = "stop", trace_samples: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.nonfinite_policy = nonfinite_policy
        self.trace_samples = trace_samples
        self.bad_samples: list[dict] = []  # {"split", "sample", "reason"} seen by this rank
        self.skipped_steps: list[int] = []  # optimizer steps skipped for a non-finite loss
        self._skip_backward = False
        self._trace_file = None
        self.faults = faults_from_env()
        if self.faults:
            self.add_callback(SigkillFault(self.faults, self.args.process_index))
        self._accelerator_backward = self.accelerator.backward
        self.accelerator.backward = self._backward_unless_skipped

    # ------------------------------------------------------------------ model card, balanced batches

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
        sampler = UnevenBatchSampler(
            len(self.train_dataset),
            self.rank_batches,
            self.args.process_index,
            seed=self.args.data_seed or self.args.seed,
            drop_last=self.args.dataloader_drop_last,
        )
        # Not passed through accelerate's prepare(): that would shard the batches again. The Trainer moves each
        # batch to the device itself (`_prepare_inputs`).
        return _EpochAwareLoader(
            self.train_dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )

    def _loss_normalised_by_global_count(self, num_items_in_batch) -> bool:
        """transformers 5 already sums each rank's loss and divides by the item count of the whole global batch
        (gathered over ranks) and multiplies by the world size, when the model takes loss kwargs (ViT does) and
        `average_tokens_across_devices` is on (the default): that is exactly w_r x mean_r, so nothing to add."""
        return (
            num_items_in_batch is not None
            and bool(self.model_accepts_loss_kwargs)
            and bool(self.args.average_tokens_across_devices)
        )

    # ------------------------------------------------------------------ batches: bookkeeping fields, trace

    def _pop_bookkeeping(self, inputs: dict, training: bool) -> None:
        """Remove the fields the collator adds for us (the model must not see them) and record them."""
        indices = inputs.pop("sample_index", None)
        bad = inputs.pop("bad_samples", None) or []
        split = "train" if training else "eval"
        self.bad_samples.extend({"split": split, **b} for b in bad)
        if training and self.trace_samples and indices is not None:
            self._trace(indices)

    def _trace(self, indices) -> None:
        if self._trace_file is None:
            folder = os.path.join(self.args.output_dir, TRACE_DIRNAME)
            os.makedirs(folder, exist_ok=True)
            # Appending: a resumed run adds its steps after the interrupted run's (the last entry of a step wins).
            self._trace_file = open(
                os.path.join(folder, f"rank{self.args.process_index}.jsonl"), "a", encoding="utf-8"
            )
        record = {"step": self.state.global_step + 1, "indices": [int(i) for i in indices.tolist()]}
        self._trace_file.write(json.dumps(record) + "\n")
        self._trace_file.flush()  # in the page cache: survives a SIGKILL of this process

    # ------------------------------------------------------------------ non-finite losses

    def _nonfinite_on_any_rank(self, loss: torch.Tensor) -> bool:
        flag = (~torch.isfinite(loss.detach())).any().to(torch.float32).reshape(1)
        if _distributed():
            flag = flag.to(self.args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _handle_nonfinite_loss(self, loss: torch.Tensor) -> None:
        step = self.state.global_step + 1
        where = f"at step {step} (loss on this rank {loss.item()})"
        if self.nonfinite_policy == "stop":
            newest, _ = newest_complete_checkpoint(self.args.output_dir)
            raise NonFiniteLossError(
                f"non-finite training loss {where}; training stopped (--on_nonfinite_loss stop). "
                f"Newest complete checkpoint: {newest or 'none'}. Fix: lower --learning_rate or use bf16 instead of "
                "fp16, check the data, or pass --on_nonfinite_loss skip to skip such steps."
            )
        self.skipped_steps.append(step)
        self._skip_backward = True
        if self.is_world_process_zero():
            print(
                f"warning: non-finite training loss {where}: step skipped on every rank (--on_nonfinite_loss skip).",
                flush=True,
            )

    def _backward_unless_skipped(self, loss, **kwargs):
        if self._skip_backward and self.is_deepspeed_enabled:
            return  # no engine.backward/step: DeepSpeed's optimizer and its lr schedule stay where they were
        self._accelerator_backward(loss, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.faults:
            poison_forward(model, self.faults, self.state.global_step + 1, self.args.process_index)
        self._skip_backward = False
        loss = super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)
        if self._skip_backward and not self.is_deepspeed_enabled:
            # The backward ran (DDP needs it); drop its gradients so the optimizer step changes nothing
            # (torch optimizers skip parameters whose .grad is None: no update, no moment update).
            model.zero_grad(set_to_none=True)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._pop_bookkeeping(inputs, model.training)
        result = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        loss = result[0] if return_outputs else result
        if model.training and self._nonfinite_on_any_rank(loss):
            self._handle_nonfinite_loss(loss)
        if not self.rank_batches or not model.training or self._loss_normalised_by_global_count(num_items_in_batch):
            return result
        weight = loss_weight(self.rank_batches, self.args.process_index)
        if return_outputs:
            return result[0] * weight, result[1]
        return result * weight

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # we rotate after marking (below)
        try:
            with failing_writes(self.faults, self.state.global_step, self.args.process_index):
                super()._save_checkpoint(model, trial)
        except Exception as err:  # any failure part-way: disk full, quota, I/O error, a killed writer
            newest, _ = newest_complete_checkpoint(run_dir)
            raise CheckpointSaveError(
                f"saving {folder} failed part-way ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
                f"The newest complete checkpoint, {newest or 'none'}, is intact; {folder} is not marked complete "
                "and will never be resumed from. Fix: free disk space (or change --output_dir), then rerun the same "
                "command with --resume_from_checkpoint latest."
            ) from err
        finally:
            self.args.save_total_limit = limit
        if _distributed():
            dist.barrier()  # every rank's files (ZeRO shards, RNG state) are on disk
        if self.args.should_save:
            ds_config = self.args.hf_deepspeed_config.config if self.is_deepspeed_enabled else None
            mark_checkpoint_complete(folder, self.state.global_step, self.args.world_size, zero_stage(ds_config))
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

    # ------------------------------------------------------------------ end of training

    def gather_bad_samples(self) -> list[dict]:
        """Every rank's skipped images (a collective: call on all ranks)."""
        return [b for part in gather_object(self.bad_samples) for b in part]

    def close_trace(self) -> None:
        if self._trace_file is not None:
            self._trace_file.close()
            self._trace_file = None
