"""Where `VitTrainer` depends on how transformers' `Trainer` (5.24) and DeepSpeed (0.19) work inside: every override
of a private method, and every method that relies on an internal behaviour, lives here, each with the behaviour it
relies on. `tests/unit/training/test_upstream.py` pins each one, so a transformers or DeepSpeed upgrade that changes
it fails a test (naming what to re-check) instead of silently changing a run.

Each override, what it relies on, and its pin in test_upstream.py:

- `_save_checkpoint`: the Trainer rotates old checkpoints inside it, reading `args.save_total_limit`
  (`test_the_trainer_rotates_inside_save_checkpoint`);
- `_load_from_checkpoint`: `train(resume_from_checkpoint=)` loads the plain model's weights through it
  (`test_resume_loads_the_model_through_load_from_checkpoint`);
- `_load_best_model`: `--load_best_model_at_end` loads through it (`test_load_best_model_at_end_calls_it`);
- `_restore_rng_skipped_with_the_data_skip`: `_run_epoch` restores generator states only where it skips data or
  starts an epoch (`test_transformers_restores_generators_only_where_it_skips_data_or_starts_an_epoch`);
- `_correct_zero3_universal_adam_step`, `_match_universal_loading`: DeepSpeed keeps torch's optimizer at
  `engine.optimizer.optimizer` and reads `engine._config.load_universal_checkpoint` at each load
  (`test_deepspeed_attributes_the_universal_fixes_use`);
- `save_model(_internal_call=True)`: `_internal_call` only skips the Hub push
  (`test_save_model_s_internal_call_only_skips_the_push`);
- `init_hf_repo`: the Trainer's `__init__` calls it under `--push_to_hub`
  (`test_the_trainer_creates_the_repo_in_init`);
- the non-finite policy's `accelerator.backward` (`nonfinite.py`): `training_step` calls it once per micro-step
  (`test_training_step_calls_accelerator_backward_once`);
- `_clip_grad_norm`, `_get_grad_norm`: under DeepSpeed accelerate (`DeepSpeedEngineWrapper.get_global_grad_norm`)
  and transformers read the step's gradient norm with `.item()` every step, and the norm's only reader,
  `_maybe_log_save_evaluate`, reads a tensor itself when it logs
  (`test_the_grad_norm_is_read_every_deepspeed_step_and_only_used_when_logging`).
"""

import contextlib
import os

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, Trainer
from transformers.trainer_utils import rotate_checkpoints
from transformers.utils import is_sagemaker_mp_enabled

from hf_vit_scaling.errors import CheckpointSaveError, TrainingStopped, UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.models.weights import load_model_weights
from hf_vit_scaling.parallel.distributed import is_multi_process
from hf_vit_scaling.training.checkpoints import (
    mark_checkpoint_complete,
    needs_universal_checkpoint,
    newest_complete_checkpoint,
    prepare_world_size_change,
    saved_adam_step,
)
from hf_vit_scaling.training.hub import network_errors, refuse_rejected_token, rejected
from hf_vit_scaling.training.hub import where as hub_where
from hf_vit_scaling.training.hub import why as hub_why


class UpstreamOverrides(Trainer):
    """The Trainer with our checkpoint saves (marked complete before rotation), strict loads, the two restores a
    resume leaves out, the save without the push and a Hub repo that may be unreachable at the start. Subclasses
    hook into a save with `saving(step)` (a context around the Trainer's own save) and `save_checkpoint_extras`."""

    def __init__(self, *args, **kwargs):
        self._starting = True  # `init_hf_repo` runs inside the Trainer's __init__
        super().__init__(*args, **kwargs)
        self._starting = False

    # ------------------------------------------------------------------ hooks for the subclass

    def saving(self, step: int):
        """A context around the Trainer's own checkpoint save (fault injection wraps it)."""
        return contextlib.nullcontext()

    def save_checkpoint_extras(self, folder: str) -> None:
        """Files of ours that must be in `folder` before it is marked complete."""

    # ------------------------------------------------------------------ saves

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save, without its upload (`hub.push_trained_model` uploads once, when the run's folder is
        complete); with FSDP2 and SHARDED_STATE_DICT it writes nothing for the final model (checkpoints keep their
        per-rank shards), so gather the full state dict there (a collective) and save plain safetensors, as
        FULL_STATE_DICT does."""
        super().save_model(output_dir, _internal_call=True)  # `_internal_call` only skips the push
        if not _internal_call and self._fsdp_saves_shards():
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))

    def _fsdp_saves_shards(self) -> bool:
        return self.is_fsdp_enabled and "SHARDED" in str(self.accelerator.state.fsdp_plugin.state_dict_type)

    def _save_checkpoint(self, model, trial):
        """The Trainer's save, then ours (`save_checkpoint_extras`), then the marker, then rotation: the Trainer
        rotates inside its own save, before our files and marker exist, so its limit is lifted around it."""
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # we rotate after marking (below)
        try:
            with self.saving(self.state.global_step):
                super()._save_checkpoint(model, trial)
            self.save_checkpoint_extras(folder)
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
            stage = self.model_wrapped.zero_optimization_stage() if self.is_deepspeed_enabled else None
            mark_checkpoint_complete(folder, self.state.global_step, self.args.world_size, stage)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

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
            logger.warning(
                f"warning: --push_to_hub: {repo} could not be reached ({hub_why(err)}); training goes "
                "on, and the upload is tried again when it ends."
            )

    # ------------------------------------------------------------------ loads

    def _plain_model(self, model=None) -> PreTrainedModel | None:
        """The model whose weights our strict load restores, or None where the Trainer's own loader runs (DeepSpeed
        and FSDP load their own checkpoint formats, strictly; SageMaker MP and PEFT adapters are left to it)."""
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or is_sagemaker_mp_enabled():
            return None
        model = self.accelerator.unwrap_model(self.model if model is None else model, keep_torch_compile=False)
        return model if isinstance(model, PreTrainedModel) else None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Resume (plain Trainer, DDP): every tensor of the model from the checkpoint, converted as `from_pretrained`
        converts it, or `UserInputError` naming the keys and the checkpoint (the Trainer's own load skips the
        conversion and only warns)."""
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
            logger.info(prepare_world_size_change(folder, world, self.is_world_process_zero()))
        self.model_wrapped._config.load_universal_checkpoint = universal  # the engine is built: set it there

    def _clip_grad_norm(self, model):
        """DeepSpeed clips inside its step; its norm is taken from the engine as it is: accelerate's
        `clip_grad_norm_` hands it over through `DeepSpeedEngineWrapper.get_global_grad_norm`, which reads it with
        `.item()` at every step (a device sync on a GPU). Other engines: transformers' path."""
        if self.is_deepspeed_enabled:
            return self.model_wrapped.get_global_grad_norm()  # the engine, once the training loop built it
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        """The step's gradient norm, left on the device: transformers turns DeepSpeed's into a float with `.item()`
        at every optimizer step (`Trainer._get_grad_norm`), a device sync per step on a GPU that the plain Trainer
        does not pay, though the value is only read when the Trainer logs (`_maybe_log_save_evaluate` calls
        `.item()` on a tensor). Without a clipping norm (--max_grad_norm 0) transformers computes one: its path."""
        return super()._get_grad_norm(model, grad_norm) if grad_norm is None else grad_norm

    # ------------------------------------------------------------------ resume: what upstream leaves out

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # What the first training step completes of a resume (`finish_resume`), or None.
        self._resumed_from = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def finish_resume(self) -> None:
        """Call at the start of every training step: once, before the first resumed step's forward (after its
        batches are fetched), the two restores transformers and DeepSpeed leave out of a resume."""
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
        """DeepSpeed's universal checkpoint (the version read: docs/reliability.md, "Not guaranteed") has no `step.pt`
        for ZeRO-3 parameters, and a ZeRO-3 run resumed from one on another number of processes restores the torch
        optimizer's step count wrong (measured: 12 where the checkpoint of step 6 saved 6; the run then ends at 18 for
        12 steps), so AdamW's bias corrections are off and the updates drift (how far: the same page). Put back the
        count the checkpoint's own files saved, before the first resumed step."""
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
