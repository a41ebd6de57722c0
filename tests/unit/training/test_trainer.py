"""`VitTrainer` pieces in one process (world size 1, no launcher): the bookkeeping fields the collator adds never
reach the model and are recorded (bad samples, the sample trace), the per-rank loss weight, the non-finite loss
policies, our model card on push, and the per-class results each evaluation files. Their multi-process behaviour
is in tests/launched/."""

import hashlib
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainingArguments, ViTForImageClassification

from hf_vit_scaling.errors import NonFiniteLossError
from hf_vit_scaling.evaluation.metrics import make_module_compute_metrics
from hf_vit_scaling.evaluation.model_card import render_model_card
from hf_vit_scaling.log import setup_logging
from hf_vit_scaling.parallel.hetero import loss_weight
from hf_vit_scaling.regularization.ema import EMACallback
from hf_vit_scaling.training.faults import FAULTS_ENV
from hf_vit_scaling.training.loader_workers import release_loader_workers
from hf_vit_scaling.training.sample_trace import TRACE_DIRNAME
from hf_vit_scaling.training.trainer import VitTrainer
from tests.helpers.builders import tiny_vit_config


@pytest.fixture
def make_trainer(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)

    def make(**kwargs) -> VitTrainer:
        torch.manual_seed(0)
        config = tiny_vit_config()
        args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
        trainer = VitTrainer(model=ViTForImageClassification(config).train(), args=args, **kwargs)
        trainer.current_gradient_accumulation_steps = 1  # set by the training loop, read by training_step
        return trainer

    return make


def _batch(indices=(5, 7, 1, 2), pixels=None) -> dict:
    n = len(indices)
    return {
        "pixel_values": torch.randn(n, 3, 8, 8) if pixels is None else pixels,
        "labels": torch.arange(n) % 3,
        "sample_index": torch.tensor(indices),
    }


def test_bookkeeping_fields_are_recorded_and_never_reach_the_model(make_trainer):
    trainer = make_trainer(trace_samples=True)
    model = trainer.model
    bad = {"sample": "'broken.jpg'", "reason": "UnidentifiedImageError: x"}
    first, second = _batch((5, 7)), _batch((1, 2))
    pixels = [b["pixel_values"].clone() for b in (first, second)]
    inputs = {**first, "bad_samples": [bad]}
    trainer.compute_loss(model, inputs)  # the model would fail on unknown keyword arguments
    assert set(inputs) == {"pixel_values", "labels"}
    trainer.state.global_step = 1
    trainer.compute_loss(model, second)
    model.eval()
    trainer.compute_loss(model, {**_batch((9,)), "bad_samples": [bad]})  # evaluation: recorded, not traced
    trainer.close_trace()
    assert trainer.bad_samples == [{"split": "train", **bad}, {"split": "eval", **bad}]
    trace = trainer.args.output_dir + f"/{TRACE_DIRNAME}/rank0.jsonl"
    with open(trace, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert [{k: r[k] for k in ("step", "indices")} for r in records] == [
        {"step": 1, "indices": [5, 7]},
        {"step": 2, "indices": [1, 2]},
    ]
    # The pixels the model saw (no input hooks here: the batch itself), fingerprinted per micro-batch.
    assert [r["pixels"] for r in records] == [hashlib.sha1(p.numpy().tobytes()).hexdigest()[:16] for p in pixels]


def test_no_trace_unless_asked(make_trainer, tmp_path):
    trainer = make_trainer()
    trainer.compute_loss(trainer.model, _batch())
    assert not (tmp_path / "out" / TRACE_DIRNAME).exists()


def test_own_loss_weight_applies_only_without_a_global_item_count(make_trainer):
    trainer = make_trainer()
    model, batch = trainer.model, _batch()
    plain = trainer.compute_loss(model, dict(batch))
    trainer.rank_batches = [3, 1]  # this rank (0) reads 3 of every 4 images: weight b_r x W / B = 3 x 2 / 4
    weighted = trainer.compute_loss(model, dict(batch))
    assert loss_weight([3, 1], 0) == 1.5
    torch.testing.assert_close(weighted, plain * 1.5)
    # With the global item count the Trainer already weights each rank by its share: nothing is added.
    counted = trainer.compute_loss(model, dict(batch), num_items_in_batch=torch.tensor(4))
    torch.testing.assert_close(counted, plain)


def _host_reads(monkeypatch) -> list[str]:
    """Every `.item()` / `.tolist()` / `.cpu()` of a tensor from now on (each a device sync on a GPU)."""
    reads = []
    for name in ("item", "tolist", "cpu"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: reads.append(_n) or _o(self, *a, **k)
        )
    return reads  # fmt: skip


def test_nonfinite_loss_stop_names_the_first_step_when_the_trainer_next_logs(make_trainer):
    """ "stop" keeps the flag on the device: the step after a NaN trains on, and the run stops at the next point where
    the Trainer would log, save or evaluate, naming the first non-finite step and the newest checkpoint."""
    trainer = make_trainer()
    trainer.training_step(trainer.model, _batch(pixels=torch.full((4, 3, 8, 8), float("nan"))))
    trainer.state.global_step = 1
    trainer.training_step(trainer.model, _batch(pixels=torch.full((4, 3, 8, 8), float("inf"))))
    trainer.nonfinite.on_step_end(trainer.args, trainer.state, TrainerControl())  # not a logging step: no read
    with pytest.raises(NonFiniteLossError, match="non-finite training loss at step 1 ") as err:
        trainer.nonfinite.on_step_end(trainer.args, trainer.state, TrainerControl(should_log=True))
    assert "Newest complete checkpoint: none" in str(err.value) and "--on_nonfinite_loss skip" in str(err.value)
    trainer.training_step(trainer.model, _batch(pixels=torch.full((4, 3, 8, 8), float("nan"))))
    with pytest.raises(NonFiniteLossError, match="at step 2 "):  # the end of training reads it too
        trainer.nonfinite.on_train_end(trainer.args, trainer.state, TrainerControl())


def test_nonfinite_loss_stop_reads_the_device_once_per_logging_window(make_trainer, monkeypatch):
    """No host read of the loss or its flag in a training step: one read when the Trainer logs (fails on a check
    that reads the flag with `.item()` every micro-step)."""
    trainer = make_trainer()
    reads = _host_reads(monkeypatch)
    for step in range(4):
        trainer.state.global_step = step
        trainer.training_step(trainer.model, _batch())
    assert reads == []
    trainer.nonfinite.on_step_end(trainer.args, trainer.state, TrainerControl())  # not a logging step
    assert reads == []
    trainer.nonfinite.on_step_end(trainer.args, trainer.state, TrainerControl(should_log=True))
    assert reads == ["tolist"]


def test_a_deepspeed_grad_norm_stays_on_the_device_until_the_trainer_logs(make_trainer, monkeypatch):
    """No host read of the gradient norm at an optimizer step under DeepSpeed (transformers' `_get_grad_norm` reads
    it with `.item()` every step: one device sync per step the plain Trainer does not make); the logged value is the
    same number."""
    from accelerate.utils import DistributedType

    trainer = make_trainer()
    monkeypatch.setattr(trainer.accelerator.state, "distributed_type", DistributedType.DEEPSPEED)
    norm = torch.tensor(2.5)
    engine = type("Engine", (), {"get_global_grad_norm": lambda self: norm})()
    wrapped = type("Wrapped", (), {"engine": engine, "get_global_grad_norm": lambda self: norm.item()})()
    monkeypatch.setattr(trainer.accelerator, "deepspeed_engine_wrapped", wrapped, raising=False)  # accelerate's path
    trainer.is_deepspeed_enabled, trainer.model_wrapped = True, engine  # as the training loop leaves them
    reads = _host_reads(monkeypatch)
    kept = trainer._get_grad_norm(trainer.model, grad_norm=trainer._clip_grad_norm(trainer.model))
    assert reads == [] and kept is norm
    logged = {}
    monkeypatch.setattr(trainer, "log", lambda logs, *a, **k: logged.update(logs))
    trainer.state.global_step, trainer._globalstep_last_logged = 1, 0
    trainer.control.should_log, trainer._total_loss_scalar = True, 0.0  # _total_loss_scalar: set by train()
    trainer._maybe_log_save_evaluate(torch.tensor(1.0), kept, trainer.model, None, 0.0, None, 0.0, 0.001)
    assert logged["grad_norm"] == 2.5


def test_nonfinite_loss_skip_drops_the_step_gradients(make_trainer, capsys):
    setup_logging()  # the recipe's logger: the main process prints the warning once
    trainer = make_trainer(nonfinite_policy="skip")
    model = trainer.model
    trainer.training_step(model, _batch(pixels=torch.full((4, 3, 8, 8), float("nan"))))
    assert trainer.skipped_steps == [1]
    assert all(p.grad is None for p in model.parameters())  # the optimizer step changes nothing
    assert "step skipped on every rank" in capsys.readouterr().out  # the main process says it once
    trainer.state.global_step = 1
    trainer.training_step(model, _batch())
    assert trainer.skipped_steps == [1] and all(p.grad is not None for p in model.parameters())


def test_push_writes_our_model_card(make_trainer, tmp_path):
    facts = {"model_name": "out", "model_desc": "vit-tiny-cpu trained from scratch", "dataset": "sklearn-digits",
             "eval_split_size": 270, "setup": {"world size": 1}, "hub_model_id": None}  # fmt: skip
    trainer = make_trainer(model_card=facts)
    trainer.write_model_card({"eval_accuracy": 0.5, "eval_runtime": 1.0, "epoch": 3.0})
    card = tmp_path / "out" / "README.md"
    expected = render_model_card({**facts, "metrics": {"eval_accuracy": 0.5}})  # no runtimes, no epoch
    assert card.read_text(encoding="utf-8") == expected
    card.unlink()
    trainer.create_model_card()  # what push_to_hub calls: the same card, with the same metrics
    assert card.read_text(encoding="utf-8") == expected


def test_evaluation_files_the_per_class_results_under_each_metric_prefix(make_trainer):
    ema = EMACallback(0.9)
    trainer = make_trainer(compute_metrics=make_module_compute_metrics(["a", "b", "c"]), ema=ema)
    ema.on_train_begin(None, SimpleNamespace(global_step=0), None, model=trainer.model)
    torch.manual_seed(1)
    images = [{"pixel_values": torch.randn(3, 8, 8), "labels": torch.tensor(i % 3)} for i in range(12)]
    metrics = trainer.evaluate(eval_dataset=images)
    assert {"eval_accuracy", "eval_macro_f1", "eval_ema_accuracy", "eval_ema_macro_f1"} <= set(metrics)
    assert set(trainer.class_reports) == {"eval", "eval_ema"} and trainer.compute_metrics.latest is None
    for prefix, report in trainer.class_reports.items():
        assert sum(report["images_per_class"]) == 12 and report["images_per_class"] == [4, 4, 4]
        correct = sum(report["confusion_matrix"][i][i] for i in range(3))
        assert metrics[f"{prefix}_accuracy"] == correct / 12


def test_the_ema_leaves_out_the_steps_the_nonfinite_policy_skips(make_trainer):
    from hf_vit_scaling.regularization.ema import EMACallback

    ema = EMACallback(0.9)
    trainer = make_trainer(ema=ema, nonfinite_policy="skip")
    trainer.nonfinite.check(torch.tensor(float("nan")))  # step 1 skipped on every rank
    assert ema.skipped_steps == trainer.nonfinite.skipped_steps == [1]


class _TinyImages(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"pixel_values": torch.full((3, 8, 8), float(i) / 8), "labels": torch.tensor(i % 3)}


def test_release_loader_workers_ends_the_persistent_workers_of_both_loaders(tmp_path, monkeypatch):
    """Left to interpreter exit, persistent workers cost up to 5 s each per loader (pytorch#81794: ~82 s per GPU
    recipe run with 8 workers); finish_run ends them first. Without the release, both loaders' workers live on."""
    import psutil

    monkeypatch.delenv(FAULTS_ENV, raising=False)
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=2,
                             per_device_train_batch_size=4, per_device_eval_batch_size=4, dataloader_num_workers=1,
                             dataloader_persistent_workers=True, save_strategy="no", disable_tqdm=True)  # fmt: skip
    trainer = VitTrainer(model=ViTForImageClassification(tiny_vit_config()), args=args,
                         train_dataset=_TinyImages(), eval_dataset=_TinyImages())  # fmt: skip
    trainer.train()
    trainer.evaluate()
    me = psutil.Process()
    workers = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert len(workers) >= 2  # one train worker, one eval worker, both kept alive by persistent_workers
    release_loader_workers(trainer)
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
