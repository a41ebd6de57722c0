"""Pins of what `hf_vit_scaling/training/upstream.py` relies on inside transformers' `Trainer` and DeepSpeed: one
test per override (its docstring lists them). Each fails when a transformers or DeepSpeed upgrade changes the
behaviour, and says what to re-check, so an upgrade breaks a test, never a run.

The behavioural pins train a plain `Trainer` subclass (not ours) for a few steps of a tiny ViT in this process and
record what the Trainer calls; the rest read the upstream source where a run would need the Hub or several
processes."""

import inspect
import os

import pytest
import torch
from transformers import Trainer, TrainingArguments, ViTForImageClassification

from tests.helpers.builders import tiny_vit_config


class TinyImages(torch.utils.data.Dataset):
    """16 random images of 2 classes at the tiny ViT's size."""

    def __init__(self, n: int = 16):
        generator = torch.Generator().manual_seed(0)
        size = tiny_vit_config().image_size
        self.pixels = torch.randn(n, 3, size, size, generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": self.pixels[i], "labels": self.labels[i]}


class Spy(Trainer):
    """A plain Trainer that records the calls upstream.py's overrides rely on."""

    def __init__(self, *args, **kwargs):
        self.calls = {"save": [], "load_from_checkpoint": [], "load_best_model": 0, "backward": 0}
        super().__init__(*args, **kwargs)
        backward = self.accelerator.backward

        def counted(loss, **kw):
            self.calls["backward"] += 1
            return backward(loss, **kw)

        self.accelerator.backward = counted

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folders = sorted(n for n in os.listdir(self.args.output_dir) if n.startswith("checkpoint-"))
        self.calls["save"].append(folders)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self.calls["load_from_checkpoint"].append(resume_from_checkpoint)
        return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self):
        self.calls["load_best_model"] += 1
        return super()._load_best_model()


def spy_run(output_dir, resume=None, **settings) -> Spy:
    torch.manual_seed(0)
    config = tiny_vit_config()
    settings = {"save_strategy": "steps", "save_steps": 1, **settings}
    args = TrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to="none", max_steps=4,
                             per_device_train_batch_size=4, logging_steps=1, disable_tqdm=True,
                             **settings)  # fmt: skip
    trainer = Spy(model=ViTForImageClassification(config), args=args, train_dataset=TinyImages(),
                  eval_dataset=TinyImages(8))  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_the_trainer_rotates_inside_save_checkpoint(tmp_path):
    """`UpstreamOverrides._save_checkpoint` lifts `save_total_limit` around the Trainer's save and rotates itself
    after marking the checkpoint complete. That works because the Trainer rotates inside `_save_checkpoint`, reading
    `args.save_total_limit`: with a limit of 1 the previous checkpoint is gone when it returns. If this fails,
    transformers rotates elsewhere: an incomplete checkpoint could be kept or a complete one deleted; move our
    rotation to match."""
    trainer = spy_run(tmp_path / "out", save_total_limit=1)
    assert trainer.calls["save"] == [["checkpoint-1"], ["checkpoint-2"], ["checkpoint-3"], ["checkpoint-4"]]


def test_training_step_calls_accelerator_backward_once(tmp_path):
    """The non-finite policy (`training/nonfinite.py`) skips a step under DeepSpeed by replacing
    `trainer.accelerator.backward`: `training_step` must call it, once per micro-step."""
    trainer = spy_run(tmp_path / "out", save_strategy="no", gradient_accumulation_steps=2)
    assert trainer.calls["backward"] == 4 * 2


def test_resume_loads_the_model_through_load_from_checkpoint(tmp_path):
    """Our strict resume load overrides `_load_from_checkpoint`: `train(resume_from_checkpoint=)` must call it with
    the folder (plain Trainer and DDP)."""
    spy_run(tmp_path / "out")
    folder = str(tmp_path / "out" / "checkpoint-2")
    resumed = spy_run(tmp_path / "out", resume=folder)
    assert resumed.calls["load_from_checkpoint"] == [folder]
    assert resumed.state.global_step == 4


def test_load_best_model_at_end_calls_it(tmp_path):
    """`--load_best_model_at_end` goes through `_load_best_model` (our strict load of every tensor, and the EMA of
    the best step in `regularization/ema.py`), once, after training."""
    trainer = spy_run(tmp_path / "out", eval_strategy="steps", eval_steps=1, load_best_model_at_end=True,
                      metric_for_best_model="loss")  # fmt: skip
    assert trainer.calls["load_best_model"] == 1
    assert trainer.state.best_model_checkpoint is not None


def test_save_model_s_internal_call_only_skips_the_push():
    """`UpstreamOverrides.save_model` passes `_internal_call=True` so the Trainer never uploads on its own (ours
    uploads once, when the folder is complete). It relies on `_internal_call` guarding the push and nothing else."""
    assert list(inspect.signature(Trainer.save_model).parameters) == ["self", "output_dir", "_internal_call"]
    source = inspect.getsource(Trainer.save_model)
    uses = [line.strip() for line in source.splitlines() if "_internal_call" in line and "def " not in line]
    assert uses == ["if self.args.push_to_hub and not _internal_call:"]


def test_the_trainer_creates_the_repo_in_init(tmp_path):
    """`UpstreamOverrides.init_hf_repo` tells a start-up failure (a warning, or a rejected token's error) from a later
    one by `_starting`, set around the Trainer's `__init__`: the Trainer must call `init_hf_repo()` from there, once,
    under `--push_to_hub` (recorded on a plain Trainer whose `init_hf_repo` touches no Hub)."""

    class RecordsRepoCreation(Trainer):
        def __init__(self, *args, **kwargs):
            self.in_init, self.repo_created_in_init = True, []
            super().__init__(*args, **kwargs)
            self.in_init = False

        def init_hf_repo(self, token=None, private=None):
            self.repo_created_in_init.append(self.in_init)

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", push_to_hub=True,
                             hub_model_id="user/repo")  # fmt: skip
    trainer = RecordsRepoCreation(model=ViTForImageClassification(tiny_vit_config()), args=args)
    assert trainer.repo_created_in_init == [True]
    assert list(inspect.signature(Trainer.init_hf_repo).parameters) == ["self", "token", "private"]


def test_deepspeed_attributes_the_universal_fixes_use():
    """`_correct_zero3_universal_adam_step` and `_match_universal_loading` reach into DeepSpeed's engine: its config's
    `load_universal_checkpoint` (read at every `load_checkpoint`), and the torch optimizer a ZeRO-3 optimizer wraps
    as `.optimizer`."""
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    assert "load_universal_checkpoint" in inspect.getsource(deepspeed.runtime.config.DeepSpeedConfig)
    assert "return self._config.load_universal_checkpoint" in inspect.getsource(
        DeepSpeedEngine.load_universal_checkpoint
    )
    assert "self.load_universal_checkpoint()" in inspect.getsource(DeepSpeedEngine.load_checkpoint)
    assert "self.optimizer = init_optimizer" in inspect.getsource(DeepSpeedZeroOptimizer_Stage3.__init__)


def test_transformers_restores_generators_only_where_it_skips_data_or_starts_an_epoch():
    """`VitTrainer._restore_rng_skipped_with_the_data_skip` covers the one case transformers leaves out: with
    `ignore_data_skip` (a stream resumes from its saved position) a resume in the middle of an epoch restores no
    generator state. It relies on `Trainer._run_epoch` (5.24) restoring them in exactly two places: the data-skip
    branch, after the first batches are fetched (`rng_to_sync`), and an epoch's start when no step of it was trained.
    If this fails, transformers moved that restore: check that a streamed resume is still exact
    (tests/launched/test_resume_augmented.py) and adapt the method, rather than restoring twice."""
    import inspect

    from transformers import Trainer

    source = inspect.getsource(Trainer._run_epoch)
    assert source.count("self._load_rng_state(") == 2
    assert "if steps_trained_in_current_epoch > 0 and not self.args.ignore_data_skip:" in source
    skip_branch, epoch_start = source.split("elif steps_trained_in_current_epoch == 0:", 1)
    assert "rng_to_sync = True" in skip_branch
    assert epoch_start.lstrip().startswith("self._load_rng_state(resume_from_checkpoint)")
    fetch, after = source.split("self.get_batch_samples(", 1)
    assert "if rng_to_sync:" in after and "if rng_to_sync:" not in fetch  # restored after the first fetch


def test_the_grad_norm_is_read_every_deepspeed_step_and_only_used_when_logging():
    """Pins `UpstreamOverrides._clip_grad_norm` and `_get_grad_norm`: accelerate's and transformers' versions read
    a DeepSpeed norm with `.item()`, the training loop hands the norm only to `_maybe_log_save_evaluate`, and that
    reads a tensor norm when it logs."""
    from accelerate import Accelerator
    from accelerate.utils.deepspeed import DeepSpeedEngineWrapper

    assert "grad_norm = grad_norm.item()" in inspect.getsource(Trainer._get_grad_norm)
    assert "return grad_norm.item()" in inspect.getsource(DeepSpeedEngineWrapper.get_global_grad_norm)
    assert "deepspeed_engine_wrapped.get_global_grad_norm()" in inspect.getsource(Accelerator.clip_grad_norm_)
    loop = inspect.getsource(Trainer._inner_training_loop) + inspect.getsource(Trainer._run_epoch)
    uses = [line.strip() for line in loop.splitlines()
            if "grad_norm" in line and "grad_norm = " not in line and "max_grad_norm" not in line]  # fmt: skip
    assert uses == ["grad_norm,"] * len(uses) and uses, uses  # only passed on, as an argument
    logging = inspect.getsource(Trainer._maybe_log_save_evaluate)
    assert 'logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm' in logging
