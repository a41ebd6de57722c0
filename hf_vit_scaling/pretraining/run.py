"""MAE pretraining's building blocks, in the order `recipes/pretrain_mae.py` calls them; everything else (engine,
resume, data, input path, hooks, throughput, faults) is `recipes/train_vit.py`'s own (`training.run`).

0. `prepare_mae_training(training, mae)`: the evaluation schedule (`--knn_eval_steps`), FSDP2's MAE blocks.
1. `build_mae_model(args, label_names)`: the `--model_preset` ViT as the encoder of a `ViTMAEForPreTraining`,
   random-init (the same weights for the same seed under every engine, ZeRO-3 included: `presets`).
2. `prepare_mae_inputs(args, world, data, model, processor, model_desc)`: `training.run.prepare_inputs` (the input
   path and its hooks, per-rank batches), then batches without labels, no classification metrics, and the k-NN
   probe on its labelled subset (`knn.KnnProbe`), evaluated every `--knn_eval_steps` and at the end.
3. `finish_mae_run(trainer, train_result, world, inputs, args, data)`: the reconstruction picture, then
   `training.run.finish_run` (save, evaluate: k-NN accuracy, done line), then `pretraining.json` (what a fine-tuned
   model's card names).
"""

import dataclasses
import os
from dataclasses import dataclass

from datasets import DatasetDict, concatenate_datasets
from transformers.trainer_utils import IntervalStrategy

from hf_vit_scaling.data.input_transforms import build_input_transforms
from hf_vit_scaling.data.streaming.load import is_streaming
from hf_vit_scaling.log import logger
from hf_vit_scaling.models.build import config_from_model_args
from hf_vit_scaling.models.flops import as_pair, mae_visible_patches
from hf_vit_scaling.models.mae import DECODER_FIELDS, PRETRAINING_FILENAME, mae_config
from hf_vit_scaling.models.presets import build_model_from_preset, image_processor_for
from hf_vit_scaling.parallel.distributed import is_main_process
from hf_vit_scaling.pretraining import reconstruction
from hf_vit_scaling.pretraining.knn import KnnProbe
from hf_vit_scaling.pretraining.trainer import WithoutLabels
from hf_vit_scaling.training.run import TrainerInputs, World, finish_run, prepare_inputs
from hf_vit_scaling.utils import write_json_atomically


def build_mae_model(args, label_names: list[str]):
    """(model, image processor, description): the preset's ViTConfig as the encoder, the decoder from the preset's
    row of `models.mae.DECODER_PRESETS` and the flags."""
    model_args, mae = args.model, args.mae
    vit = config_from_model_args(model_args, label_names)
    decoder = mae.decoder(model_args.preset)
    config = mae_config(vit, mae.mask_ratio, mae.norm_pix_loss, decoder)
    model = build_model_from_preset(config)
    patches = (config.image_size // config.patch_size) ** 2
    visible = mae_visible_patches(patches, mae.mask_ratio)
    sizes = ", ".join(f"{key.removeprefix('decoder_')} {value}" for key, value in decoder.items())
    logger.info(
        f"MAE: encoder {model_args.preset} sees {visible} of {patches} patches (mask ratio "
        f"{mae.mask_ratio:g}, norm_pix_loss {mae.norm_pix_loss}); decoder {sizes}"
    )
    return model, image_processor_for(config), f"MAE pretraining of {model_args.preset}'s encoder"


def prepare_mae_training(training, mae) -> None:
    """What MAE changes in the Trainer's arguments, before the engine starts (`training.run.prepare_world`):

    * `--knn_eval_steps N`: an evaluation (reconstruction loss and k-NN accuracy) every N optimizer steps, through
      the Trainer's own schedule; the end-of-run evaluation happens whatever N is;
    * FSDP2 wraps transformers' MAE blocks (`ViTMAELayer`, the encoder's and the decoder's) where the FSDP config
      names the classifier's `ViTLayer` (fsdp_configs/*.json), which the MAE model does not have."""
    if mae.knn_eval_steps:
        training.eval_strategy = IntervalStrategy.STEPS
        training.eval_steps = mae.knn_eval_steps
    wrap = training.fsdp_plugin_args.get("transformer_cls_names_to_wrap") if training.fsdp_plugin_args else None
    if wrap:
        names = ["ViTMAELayer" if name.strip() == "ViTLayer" else name.strip() for name in wrap.split(",")]
        training.fsdp_plugin_args["transformer_cls_names_to_wrap"] = ",".join(names)
        training.fsdp_config["transformer_layer_cls_to_wrap"] = names


@dataclass
class MaeInputs(TrainerInputs):
    """`TrainerInputs` and the k-NN probe (`knn.KnnProbe`), whose query images also make the picture."""

    knn: KnnProbe | None = None


def spread_rows(total: int, count: int) -> list[int]:
    """`count` row indices evenly spaced over `total` rows (all of them when count >= total): row i * total // count.
    Not the first rows: an image-folder split is sorted by class folder (Br35H's 2,100 training images: 1,049 "no",
    then 1,051 "yes"), so its first 1,000 hold one class and a k-NN vote over them always answers that class."""
    count = min(count, total)
    return [i * total // count for i in range(count)]


def knn_split(args, data, inputs: TrainerInputs, size: int, mean, std) -> tuple:
    """(split with evaluation transforms, bank rows, query rows, collate): --knn_train_samples training images
    and --knn_eval_samples validation images, evenly spaced through each split (`spread_rows`), with their labels,
    through the run's input path. A streamed training split is read once per pass, never indexed: its bank is the
    validation images that are not queries (the validation split, in memory, is split in two)."""
    mae = args.mae
    if is_streaming(data):
        split = inputs.splits["validation"]
        queries = spread_rows(len(split), mae.knn_eval_samples)
        rest = sorted(set(range(len(split))) - set(queries))
        bank = [rest[i] for i in spread_rows(len(rest), mae.knn_train_samples)]
        return split, bank, queries, inputs.collate
    train, validation = data.splits["train"], data.splits["validation"]
    bank = train.select(spread_rows(len(train), mae.knn_train_samples))
    queries = validation.select(spread_rows(len(validation), mae.knn_eval_samples))
    both = concatenate_datasets([bank.with_format(None), queries.with_format(None)])
    probe_data = dataclasses.replace(data, splits=DatasetDict(train=both.select([0]), validation=both))
    splits, collate, _ = build_input_transforms(
        probe_data, inputs.input_path, size, mean, std, args.data, args.regularization.eval_crop_pct
    )
    rows = list(range(len(bank)))
    return splits["validation"], rows, list(range(len(bank), len(bank) + len(queries))), collate


def prepare_mae_inputs(args, world: World, data, model, processor, model_desc: str) -> MaeInputs:
    """`prepare_inputs` for a model without labels, and the k-NN probe (see the module docstring)."""
    inputs = prepare_inputs(args, world, data, model, processor, model_desc, classifier=False)
    size, mean, std = as_pair(model.config.image_size)[0], processor.image_mean, processor.image_std
    split, bank, queries, collate = knn_split(args, data, inputs, size, mean, std)
    if not bank or not queries:
        logger.warning(f"warning: k-NN evaluation off: {len(bank)} bank and {len(queries)} query images.")
    mae = args.mae
    knn = None
    if bank and queries:
        knn = KnnProbe(
            split,
            bank,
            queries,
            collate,
            len(data.label_names),
            mae.knn_k,
            mae.knn_temperature,
            mae.knn_features,
            args.training.per_device_eval_batch_size,
        )
        when = f"every {mae.knn_eval_steps} steps and at the end" if mae.knn_eval_steps else "at the end"
        logger.info(
            f"k-NN evaluation: {len(bank)} labelled bank images, {len(queries)} queries, k {mae.knn_k}, "
            f"{mae.knn_features} features, unmasked; {when}."
        )
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(TrainerInputs)}
    fields.update(collate=WithoutLabels(inputs.collate), knn=knn)
    return MaeInputs(**fields)


def save_picture(trainer, inputs: MaeInputs, count: int) -> str | None:
    """The reconstruction picture of `count` query (validation) images, evenly spaced through them (every rank runs
    the forward; the main process writes it)."""
    if inputs.knn is None or not count:
        return None
    rows = [inputs.knn.query_rows[i] for i in spread_rows(len(inputs.knn.query_rows), count)]
    batch = inputs.knn.collate([inputs.knn.split[row] for row in rows])
    pixels = trainer._prepare_inputs({"pixel_values": batch["pixel_values"]})["pixel_values"]
    images = reconstruction.reconstruct(trainer.model, pixels, seed=trainer.args.seed)
    path = os.path.join(trainer.args.output_dir, reconstruction.FILENAME)
    if is_main_process():
        mean, std = trainer.processing_class.image_mean, trainer.processing_class.image_std
        reconstruction.save_reconstructions(path, images, mean, std, trainer.model.config.mask_ratio)
        logger.info(f"Reconstructions of {len(rows)} held-out images (original, masked, reconstruction): {path}")
    return path


def finish_mae_run(trainer, train_result, world: World, inputs: MaeInputs, args, data) -> dict:
    """The picture, the shared end of a run (k-NN accuracy in the done line), and `pretraining.json`."""
    save_picture(trainer, inputs, args.mae.reconstruction_images)
    eval_metrics = finish_run(trainer, train_result, world, inputs, score="knn_accuracy")
    if trainer.is_world_process_zero():
        config, mae = trainer.model.config, args.mae
        write_json_atomically(os.path.join(trainer.args.output_dir, PRETRAINING_FILENAME), {
            "method": "MAE (He et al. 2021, arXiv 2111.06377)",
            "model": args.model.preset,
            "mask_ratio": mae.mask_ratio,
            "norm_pix_loss": mae.norm_pix_loss,
            **{key: getattr(config, key) for key in DECODER_FIELDS},
            "steps": trainer.state.global_step,
            "dataset": data.source,
            "knn_accuracy": eval_metrics.get("eval_knn_accuracy"),
            "knn": {"k": mae.knn_k, "features": mae.knn_features, "temperature": mae.knn_temperature,
                    "bank": len(inputs.knn.bank_rows) if inputs.knn else 0,
                    "queries": len(inputs.knn.query_rows) if inputs.knn else 0},
        })  # fmt: skip
    return eval_metrics
