"""`MaeTrainer` in one process (pretraining/trainer.py): a model whose forward returns its own loss trains from
batches without labels, and every evaluation logs the reconstruction loss and the k-NN accuracy through the
Trainer's log (what TensorBoard plots). The same on 2 processes and under ZeRO: tests/launched/test_mae_launched.py."""

import torch
from transformers import TrainingArguments, ViTMAEConfig
from transformers.trainer_utils import IntervalStrategy

from hf_vit_scaling.data.decoding import stack_batch
from hf_vit_scaling.models.presets import build_model_from_preset
from hf_vit_scaling.pretraining.knn import KnnProbe
from hf_vit_scaling.pretraining.trainer import MaeTrainer, WithoutLabels
from hf_vit_scaling.training.faults import FAULTS_ENV


def test_trains_without_labels_and_logs_knn_accuracy_at_each_evaluation(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    config = ViTMAEConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, decoder_hidden_size=8, decoder_num_hidden_layers=1,
                          decoder_num_attention_heads=2, decoder_intermediate_size=16)  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = build_model_from_preset(config)
    assert model.accepts_loss_kwargs is False  # no num_items_in_batch into the forward's **kwargs
    generator = torch.Generator().manual_seed(0)
    rows = [{"pixel_values": torch.randn(3, 8, 8, generator=generator), "labels": i % 2} for i in range(24)]
    probe = KnnProbe(rows, list(range(16)), list(range(16, 24)), stack_batch, num_classes=2, k=3, batch_size=8)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=4,
                             per_device_train_batch_size=4, per_device_eval_batch_size=8, eval_strategy="steps",
                             eval_steps=2, logging_steps=1, save_strategy="no", remove_unused_columns=False,
                             disable_tqdm=True)  # fmt: skip
    trainer = MaeTrainer(model=model, args=args, train_dataset=rows[:16], eval_dataset=rows[16:],
                         data_collator=WithoutLabels(stack_batch), knn=probe)  # fmt: skip
    assert args.eval_strategy == IntervalStrategy.STEPS
    trainer.train()
    history = trainer.state.log_history
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 4 and all(loss > 0 for loss in losses)
    evaluations = [entry for entry in history if "eval_knn_accuracy" in entry]
    assert [entry["step"] for entry in evaluations] == [2, 4]
    for entry in evaluations:
        assert entry["eval_loss"] > 0 and (entry["eval_knn_accuracy"] * 8).is_integer()
    final = trainer.evaluate()
    assert final["eval_knn_accuracy"] == evaluations[-1]["eval_knn_accuracy"]  # same model, same images
    assert final["eval_loss"] == evaluations[-1]["eval_loss"]  # and the same masks
    assert model.config.mask_ratio == 0.75 and model.training is False  # evaluate leaves eval mode; ratio restored
