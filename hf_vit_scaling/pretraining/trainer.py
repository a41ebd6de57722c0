"""`MaeTrainer`: `VitTrainer` (checkpoints, resume, faults, non-finite losses, traces) for a model whose forward
returns its own loss from the pixels alone (`ViTMAEForPreTraining`), with the k-NN progress metric in every
evaluation.

- training: no labels reach the model (the collate leaves them out, `WithoutLabels`); the loss is MAE's, a mean over
  the micro-batch's masked patches;
- evaluation: the reconstruction loss on the validation split (`eval_loss`, with masks drawn from `--seed`, the
  rank and the batch's place, not from the run's generator: the same masks at every evaluation, so the losses of
  two evaluations compare the models only) and
  `eval_knn_accuracy` (`knn.KnnProbe`), logged through the Trainer's log, so `--report_to tensorboard` plots both;
  `--eval_strategy steps --eval_steps N` (what `--knn_eval_steps N` sets) runs it every N steps.
"""

import torch

from hf_vit_scaling.training.trainer import VitTrainer


class WithoutLabels:
    """A collate function without the `labels` field: the MAE forward takes pixels only (a picklable class, for
    data loader workers)."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.collate(examples)
        batch.pop("labels", None)
        return batch


class MaeTrainer(VitTrainer):
    """`VitTrainer` with MAE's evaluation (see the module docstring). `knn`: a `KnnProbe`, or None."""

    def __init__(self, *args, knn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.knn = knn

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The reconstruction loss only (the Trainer finds no label field in MAE's forward and would compute none),
        with this batch's fixed masks (`evaluation_noise`)."""
        inputs = self._prepare_inputs(inputs)
        inputs["noise"] = self.evaluation_noise(inputs["pixel_values"])
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def evaluation_noise(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """MAE's per-patch noise (its argsort picks the visible patches) for the next evaluation batch, from its own
        generator seeded by --seed, the rank and the batch's index in this evaluation."""
        patches = self.model.vit.embeddings.patch_embeddings.num_patches
        seed = (self.args.seed * 1_000_003 + self.args.process_index) * 1_000_003 + self._eval_batch
        self._eval_batch += 1
        generator = torch.Generator().manual_seed(seed)
        return torch.rand(pixel_values.shape[0], patches, generator=generator).to(pixel_values.device)

    def evaluation_loop(self, *args, metric_key_prefix: str = "eval", **kwargs):
        self._eval_batch = 0
        output = super().evaluation_loop(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        if self.knn is not None:  # every rank: each encodes its share (see knn.py)
            output.metrics[f"{metric_key_prefix}_knn_accuracy"] = self.knn.accuracy(self.model, self._prepare_inputs)
        return output
