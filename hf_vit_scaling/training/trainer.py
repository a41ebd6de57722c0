"""`VitTrainer`: the Trainer plus what the recipes need, every feature given to the constructor.

- `model_card`: the facts of the run; `write_model_card()` (and `push_to_hub`) writes our card with the latest
  evaluation metrics instead of the generic one;
- `sequence_parallel`: training batches sharded by data-parallel rank (`hf_vit_scaling.parallel.sequence_parallel`);
- `rank_batches`: per-rank micro-batch sizes (heterogeneous clusters): each rank reads its own slice of every global
  batch and weights its loss by b_r x W / B (see `hf_vit_scaling.parallel.hetero`);
- `nonfinite_policy`: a NaN/inf training loss on any rank stops training ("stop") or skips that optimizer step on
  every rank ("skip"), see `NonFiniteLossPolicy`;
- checkpoints: each save is marked complete (`checkpoint_complete.json`) before old ones are rotated away; a save that
  fails raises `CheckpointSaveError` naming the newest complete checkpoint;
- loads: resuming and `--load_best_model_at_end` under the plain Trainer and DDP restore every tensor of the model
  through the key conversion of `from_pretrained` (`checkpoints.load_model_weights`), or stop with an error naming
  the keys (the Trainer's own load skips the conversion and only warns); DeepSpeed and FSDP keep their own loaders;
- `bad_samples`: images that could not be decoded and were left out of their batch (see `data.decoding`);
- `trace_samples`: append each training micro-batch's dataset indices, and a fingerprint of the pixels the model saw
  (after every input hook: crop, augmentation, Mixup/CutMix), to output_dir/sample_trace/rank{R}.jsonl;
- every rank's random draws differ from the others' (`seeding.PerRankRandomness`), reproducibly from `--seed`.
- a streamed training split (`data.streaming`): its own loader, and each checkpoint holds the data position of
  every rank (`data_position/rank{R}.json`) before it is marked complete;
- `layer_decay`: BEiT's per-layer learning rates as the optimizer's parameter groups (every ZeRO stage), written to
  output_dir/layer_decay_groups.json as the optimizer holds them when training starts;
- `ema`: an `EMACallback`; evaluation adds `eval_ema_*`, each checkpoint holds `ema.safetensors` before it is marked.
- `class_reports`: the latest confusion matrix and per-class accuracy of each evaluation (`eval`, `eval_ema`), when
  `compute_metrics` keeps them (`evaluation.ModuleComputeMetrics`); `run.finish_run` writes them.
Injected faults (`faults.FaultInjector`) do nothing unless the environment asks for them.
"""

import hashlib
import json
import os

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, Trainer
from transformers.trainer_utils import rotate_checkpoints
from transformers.utils import is_sagemaker_mp_enabled

from hf_vit_scaling.data.sample_randomness import EpochOfDraws
from hf_vit_scaling.data.streaming.loader import StreamingTrainData
from hf_vit_scaling.errors import CheckpointSaveError, NonFiniteLossError, TrainingStopped, UserInputError
from hf_vit_scaling.evaluation.model_card import write_model_card
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.deepspeed_config import zero_stage
from hf_vit_scaling.parallel.distributed import gather_object, is_multi_process
from hf_vit_scaling.parallel.hetero import UnevenBatchSampler, loss_weight
from hf_vit_scaling.parallel.sequence_parallel import shard_dataloader_by_data_parallel_rank
from hf_vit_scaling.regularization.layer_decay import LayerDecayReport, layer_decay_optimizer_cls_and_kwargs
from hf_vit_scaling.training.checkpoints import (
    load_model_weights,
    mark_checkpoint_complete,
    needs_universal_checkpoint,
    newest_complete_checkpoint,
    prepare_world_size_change,
    saved_adam_step,
)
from hf_vit_scaling.training.faults import FaultInjector
from hf_vit_scaling.training.hub import network_errors, refuse_rejected_token, rejected
from hf_vit_scaling.training.hub import where as hub_where
from hf_vit_scaling.training.hub import why as hub_why
from hf_vit_scaling.training.seeding import PerRankRandomness, pin_data_order_seed

TRACE_DIRNAME = "sample_trace"
NONFINITE_POLICIES = ("stop", "skip")


class _EpochAwareLoader(torch.utils.data.DataLoader):
    """The Trainer calls `set_epoch` on its dataloader: pass it on to our batch sampler (new permutation per epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class NonFiniteLossPolicy:
    """What a NaN/inf training loss on any rank does. The ranks agree through one all-reduce of a flag per
    micro-step (MAX), so every rank takes the same decision at the same step.

    - "stop": raise `NonFiniteLossError` naming the step and the newest complete checkpoint;
    - "skip": leave that optimizer step out on every rank. Under DeepSpeed the backward (and so DeepSpeed's optimizer
      step and lr schedule) is not run; under the plain Trainer the backward runs (DDP needs every rank in it) and
      the gradients are dropped, so torch's optimizer skips every parameter (no update, no moment update).
    """

    def __init__(self, trainer: "VitTrainer", policy: str):
        self.trainer, self.policy = trainer, policy
        self.skipped_steps: list[int] = []
        self.skip_this_step = False
        self._backward = trainer.accelerator.backward
        trainer.accelerator.backward = self.backward_unless_skipped

    def on_any_rank(self, loss: torch.Tensor) -> bool:
        flag = (~torch.isfinite(loss.detach())).any().to(torch.float32).reshape(1)
        if is_multi_process():
            flag = flag.to(self.trainer.args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def check(self, loss: torch.Tensor) -> None:
        """Call with each training micro-step's loss, on every rank."""
        if not self.on_any_rank(loss):
            return
        step = self.trainer.state.global_step + 1
        where = f"at step {step} (loss on this rank {loss.item()})"
        if self.policy == "stop":
            newest, _ = newest_complete_checkpoint(self.trainer.args.output_dir)
            raise NonFiniteLossError(
                f"non-finite training loss {where}; training stopped (--on_nonfinite_loss stop). "
                f"Newest complete checkpoint: {newest or 'none'}. Fix: lower --learning_rate or use bf16 instead of "
                "fp16, check the data, or pass --on_nonfinite_loss skip to skip such steps."
            )
        self.skipped_steps.append(step)
        self.skip_this_step = True
        if self.trainer.is_world_process_zero():
            logger.warning(f"warning: non-finite training loss {where}: step skipped on every rank "
                           "(--on_nonfinite_loss skip).")  # fmt: skip

    def backward_unless_skipped(self, loss, **kwargs):
        if self.skip_this_step and self.trainer.is_deepspeed_enabled:
            return  # no engine.backward/step: DeepSpeed's optimizer and its lr schedule stay where they were
        self._backward(loss, **kwargs)

    def after_training_step(self, model) -> None:
        if self.skip_this_step and not self.trainer.is_deepspeed_enabled:
            model.zero_grad(set_to_none=True)
        self.skip_this_step = False


class VitTrainer(Trainer):
    """The Trainer plus the features in the module docstring; each is off unless its argument is given."""

    def __init__(self, *args, model_card: dict | None = None, rank_batches: list[int] | None = None,
                 sequence_parallel=None, nonfinite_policy: str = "stop", trace_samples: bool = False,
                 layer_decay: float | None = None, ema=None, **kwargs):  # fmt: skip
        if kwargs.get("args") is not None:
            pin_data_order_seed(kwargs["args"])  # before the Trainer reads it into its data loader configuration
        self._starting = True  # `init_hf_repo` runs inside the Trainer's __init__
        super().__init__(*args, **kwargs)
        self._starting = False
        sp_size = sequence_parallel.sp_size if sequence_parallel is not None else 1
        self.add_callback(PerRankRandomness(sp_size))  # augmentation and drop path differ across data-parallel ranks
        host_draws = getattr(self.train_dataset, "randomness", None)
        if host_draws is not None:  # host transforms seeded per (seed, epoch, row): tell them the epoch
            self.add_callback(EpochOfDraws(host_draws))
        self.layer_decay, self.ema = layer_decay, ema
        if ema is not None:
            self.add_callback(ema)
        self.layer_decay_report = LayerDecayReport() if layer_decay is not None else None
        if self.layer_decay_report is not None:
            self.add_callback(self.layer_decay_report)
        self.model_card_facts = model_card
        self.rank_batches = rank_batches
        self.sequence_parallel = sequence_parallel
        self.nonfinite = NonFiniteLossPolicy(self, nonfinite_policy)
        if ema is not None:
            ema.skipped_steps = self.nonfinite.skipped_steps  # one list: a skipped step is left out of the EMA too
        self.trace_samples = trace_samples
        self.bad_samples: list[dict] = []  # {"split", "sample", "reason"} seen by this rank
        self.class_reports: dict[str, dict] = {}  # metric prefix -> the latest evaluation's per-class results
        self._trace_file = None
        self._pending_trace = self._pixels_seen = self._pixel_hook = None
        self.stream_position = None  # --streaming: the data position after the last batch trained
        self.faults = FaultInjector(self.args.process_index)
        if self.faults:
            self.add_callback(self.faults)

    @property
    def skipped_steps(self) -> list[int]:
        return self.nonfinite.skipped_steps

    # ------------------------------------------------------------------ model card

    def write_model_card(self, metrics: dict | None = None) -> None:
        """Write README.md (main process): the run's facts plus `metrics` (default: the latest evaluation's), without
        runtimes and rates. The metrics given once are kept for the card `push_to_hub` writes."""
        if metrics is not None:
            self._card_metrics = metrics
        if self.model_card_facts is None or not self.is_world_process_zero():
            return
        if metrics is None:
            metrics = getattr(self, "_card_metrics", None) or next(
                (entry for entry in reversed(self.state.log_history) if "eval_loss" in entry), {}
            )
        shown = {
            k: v for k, v in metrics.items() if k.startswith("eval_") and "runtime" not in k and "per_second" not in k
        }
        write_model_card(self.args.output_dir, {**self.model_card_facts, "metrics": shown})

    def create_model_card(self, *args, **kwargs):
        if self.model_card_facts is None:
            return super().create_model_card(*args, **kwargs)
        self.write_model_card()

    # ------------------------------------------------------------------ batches per rank

    def get_train_dataloader(self):
        if isinstance(self.train_dataset, StreamingTrainData):  # batches made in the stream, one rank's shards
            return self.train_dataset.loader(self.args)
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
        position = inputs.pop("stream_position", None)
        split = "train" if training else "eval"
        self.bad_samples.extend({"split": split, **b} for b in bad)
        if training and position is not None:
            self.stream_position = position
        if training and self.trace_samples and indices is not None:
            self._pending_trace = (indices, {"pass": position["pass"]} if position is not None else {})
            self._watch_pixels()

    def _watch_pixels(self) -> None:
        """A forward pre-hook on the model, registered when training has begun, so it runs after every input hook
        (the recipe's and the throughput clock's): it fingerprints the pixels the model is given."""
        if self._pixel_hook is not None:
            return

        def fingerprint(module, args, kwargs):
            pixels = kwargs.get("pixel_values", args[0] if args else None)
            if pixels is not None and module.training:
                data = pixels.detach().float().contiguous().cpu().numpy().tobytes()
                self._pixels_seen = hashlib.sha1(data).hexdigest()[:16]

        self._pixel_hook = self.model.register_forward_pre_hook(fingerprint, with_kwargs=True)

    def _write_pending_trace(self) -> None:
        if self._pending_trace is None:
            return
        indices, extra = self._pending_trace
        self._pending_trace = None
        pixels, self._pixels_seen = self._pixels_seen, None
        self._trace(indices, {**extra, **({"pixels": pixels} if pixels is not None else {})})

    def _trace(self, indices, extra: dict) -> None:
        if self._trace_file is None:
            folder = os.path.join(self.args.output_dir, TRACE_DIRNAME)
            os.makedirs(folder, exist_ok=True)
            # Appending: a resumed run adds its steps after the interrupted run's (the last entry of a step wins).
            self._trace_file = open(
                os.path.join(folder, f"rank{self.args.process_index}.jsonl"), "a", encoding="utf-8"
            )
        record = {"step": self.state.global_step + 1, "indices": [int(i) for i in indices.tolist()], **extra}
        self._trace_file.write(json.dumps(record) + "\n")
        self._trace_file.flush()  # in the page cache: survives a SIGKILL of this process

    # ------------------------------------------------------------------ training step and loss

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # What the first training step completes of a resume (`_finish_resume`), or None.
        self._resumed_from = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _finish_resume(self) -> None:
        """Once, before the first resumed step's forward (after its batches are fetched): the two restores
        transformers and DeepSpeed leave out of a resume."""
        checkpoint, self._resumed_from = getattr(self, "_resumed_from", None), None
        if checkpoint is not None:
            self._restore_rng_skipped_with_the_data_skip(checkpoint)
            self._correct_zero3_universal_adam_step(checkpoint)

    def _restore_rng_skipped_with_the_data_skip(self, checkpoint: str) -> None:
        """transformers (5.24 `Trainer._run_epoch`) restores a checkpoint's generator states only in its data-skip
        branch or at an epoch boundary; with `ignore_data_skip` (a stream resumes from its saved data position) a
        resume in the middle of an epoch never restored them, so device-side augmentation and drop path drew from the
        fresh seed. Restore them here, before the first resumed step's forward: where the Trainer's own skip branch
        does (after the first batch is fetched)."""
        if self.args.ignore_data_skip and (self.state.epoch or 0.0) % 1:
            self._load_rng_state(checkpoint)

    def _correct_zero3_universal_adam_step(self, checkpoint: str) -> None:
        """DeepSpeed 0.19's universal checkpoint has no `step.pt` for ZeRO-3 parameters, and a ZeRO-3 run resumed
        from one on another number of processes restores the torch optimizer's step count wrong (measured: 12 where
        the checkpoint of step 6 saved 6; the run then ends at 18 for 12 steps), so AdamW's bias corrections are off
        and the updates drift (rel. 1e-5 in the loss the step after, 3e-4 five steps on). Put back the count the
        checkpoint's own files saved, before the first resumed step."""
        if not self.is_deepspeed_enabled:
            return
        engine = self.model_wrapped
        if not engine._config.load_universal_checkpoint or engine.zero_optimization_stage() != 3:
            return
        saved = saved_adam_step(checkpoint)
        if saved is not None:
            for state in engine.optimizer.optimizer.state.values():
                if "step" in state:
                    step = state["step"]
                    state["step"] = torch.full_like(step, saved) if torch.is_tensor(step) else saved

    def training_step(self, model, inputs, num_items_in_batch=None):
        self._finish_resume()
        self.faults.before_training_step(model, self.state.global_step + 1)
        loss = super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)
        self.nonfinite.after_training_step(model)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._pop_bookkeeping(inputs, model.training)
        result = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        self._write_pending_trace()  # after the forward: its input hooks have made the pixels
        loss = result[0] if return_outputs else result
        if model.training:
            self.nonfinite.check(loss)
        if not self.rank_batches or not model.training or self._loss_normalised_by_global_count(num_items_in_batch):
            return result
        weight = loss_weight(self.rank_batches, self.args.process_index)
        if return_outputs:
            return result[0] * weight, result[1]
        return result * weight

    def create_optimizer(self, model=None):
        if self.layer_decay is not None and self.optimizer is None:  # BEiT's per-layer lrs, as parameter groups
            opt_model = self.model if model is None else model
            self.optimizer_cls_and_kwargs = layer_decay_optimizer_cls_and_kwargs(self, opt_model, self.layer_decay)
            self.layer_decay_report.record(opt_model, self.optimizer_cls_and_kwargs[1]["params"])
        return super().create_optimizer(model)

    def evaluate(self, *args, metric_key_prefix: str = "eval", **kwargs):
        metrics = super().evaluate(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        self._file_class_report(metric_key_prefix)
        if self.ema is not None and self.ema.shadow is not None and metric_key_prefix == "eval":
            with self.ema.applied(self.model):
                metrics.update(super().evaluate(*args, metric_key_prefix="eval_ema", **kwargs))
            self._file_class_report("eval_ema")
        return metrics

    def _file_class_report(self, prefix: str) -> None:
        """Take the per-class results `compute_metrics` kept from the evaluation that just ran (taken, so a later
        evaluation that computes no metrics cannot file them again under its own prefix)."""
        report = getattr(self.compute_metrics, "latest", None)
        if report is not None:
            self.compute_metrics.latest = None
            self.class_reports[prefix] = report

    # ------------------------------------------------------------------ checkpoints

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save, without its upload (`hub.push_trained_model` uploads once, when the run's folder is
        complete); with FSDP2 and SHARDED_STATE_DICT it writes nothing for the final model (checkpoints keep their
        per-rank shards), so gather the full state dict there (a collective) and save plain safetensors, as
        FULL_STATE_DICT does."""
        super().save_model(output_dir, _internal_call=True)  # transformers 5.24: `_internal_call` only skips the push
        if not _internal_call and self._fsdp_saves_shards():
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """--push_to_hub: the Trainer creates the repo as it starts. A rejected token stops the run then, before any
        training; an endpoint that cannot be reached is a warning, and the final upload tries again
        (`training.hub`)."""
        try:
            super().init_hf_repo(token=token, private=private)
        except network_errors() as err:
            if not self._starting:
                raise
            if rejected(err):
                raise refuse_rejected_token(err, self.args.hub_model_id) from err
            repo = hub_where(self.args.hub_model_id)
            logger.warning(f"warning: --push_to_hub: {repo} could not be reached ({hub_why(err)}); training goes "
                           "on, and the upload is tried again when it ends.")  # fmt: skip

    def _fsdp_saves_shards(self) -> bool:
        return self.is_fsdp_enabled and "SHARDED" in str(self.accelerator.state.fsdp_plugin.state_dict_type)

    def _save_checkpoint(self, model, trial):
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # we rotate after marking (below)
        try:
            with self.faults.during_save(self.state.global_step):
                super()._save_checkpoint(model, trial)
            if self.ema is not None and self.args.should_save:
                self.ema.save_state(folder)  # before the checkpoint is marked complete, so the marker lists it
            if isinstance(self.train_dataset, StreamingTrainData):  # every rank, before the marker (as above)
                self.train_dataset.save_position(folder, self.stream_position)
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
        if is_multi_process():
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

    # ------------------------------------------------------------------ loading a checkpoint's model weights

    def _plain_model(self, model=None) -> PreTrainedModel | None:
        """The model whose weights our strict load restores, or None where the Trainer's own loader runs (DeepSpeed
        and FSDP load their own checkpoint formats, strictly; SageMaker MP and PEFT adapters are left to it)."""
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or is_sagemaker_mp_enabled():
            return None
        model = self.accelerator.unwrap_model(self.model if model is None else model, keep_torch_compile=False)
        return model if isinstance(model, PreTrainedModel) else None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Resume (plain Trainer, DDP): every tensor of the model from the checkpoint, converted as `from_pretrained`
        converts it, or `UserInputError` naming the keys and the checkpoint."""
        plain = self._plain_model(model)
        if plain is None:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        fix = (
            "Fix: resume with the model that saved it (the same --model_preset, --image_size and --config_overrides, "
            "or --model_name_or_path), or start a new run without --resume_from_checkpoint."
        )
        count = load_model_weights(plain, resume_from_checkpoint, UserInputError, "--resume_from_checkpoint", fix)
        logger.info(f"Restored all {count} tensors of the model from {resume_from_checkpoint}.")

    def _load_best_model(self) -> None:
        """`--load_best_model_at_end` (plain Trainer, DDP): every tensor of the best checkpoint, or `TrainingStopped`
        naming the keys (the last step's model is then still in memory and nothing more is saved)."""
        plain = self._plain_model()
        if plain is None:
            self._match_universal_loading(self.state.best_model_checkpoint)
            return super()._load_best_model()
        best = self.state.best_model_checkpoint
        score = f"{self.args.metric_for_best_model} {self.state.best_metric}"
        what = f"--load_best_model_at_end: the best checkpoint ({score})"
        fix = (
            f"Training finished, but the final model was not saved; the checkpoints in {self.args.output_dir} are "
            "kept. Fix: check that the checkpoint is intact (a multi-node run without a shared disk needs "
            "--save_on_each_node), or load the checkpoint you want with from_pretrained."
        )
        count = load_model_weights(plain, best, TrainingStopped, what, fix)
        logger.info(f"Loaded the best model, all {count} tensors, from {best} (score: {self.state.best_metric}).")

    def _match_universal_loading(self, folder: str | None) -> None:
        """DeepSpeed reads a checkpoint as universal whenever its config says so, for every load of the run. After a
        resume on another world size (`prepare_world_size_change` turned it on), the best checkpoint, saved by this
        run, was read as universal and the run failed at its end (`latest_universal does not exist`). Set per
        checkpoint: on only for one saved by another number of processes (converted first)."""
        if not self.is_deepspeed_enabled or folder is None:
            return
        stage, world = self.model_wrapped.zero_optimization_stage(), self.args.world_size
        universal = needs_universal_checkpoint(folder, world, stage)
        if universal:
            logger.info(prepare_world_size_change(folder, self.args, world, self.is_world_process_zero()))
        self.model_wrapped._config.load_universal_checkpoint = universal

    # ------------------------------------------------------------------ end of training

    def gather_bad_samples(self) -> list[dict]:
        """Every rank's skipped images (a collective: call on all ranks)."""
        return [b for part in gather_object(self.bad_samples) for b in part]

    def close_trace(self) -> None:
        if self._pixel_hook is not None:
            self._pixel_hook.remove()
            self._pixel_hook = None
        if self._trace_file is not None:
            self._trace_file.close()
            self._trace_file = None
