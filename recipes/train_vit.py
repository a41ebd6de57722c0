#!/usr/bin/env python
"""Train a ViT from scratch or fine-tune one with the Hugging Face Trainer, optionally with DeepSpeed ZeRO.

Tried on a 2-core CPU (no GPU, DeepSpeed's CPU accelerator over gloo; on CPU accelerate needs --multi_gpu to
start more than one process):

    accelerate launch --multi_gpu --num_processes 2 recipes/train_vit.py --ds_config ds_configs/zero2.json \
        --model_preset vit-tiny-cpu --output_dir outputs/digits --num_train_epochs 30 --report_to none

On GPUs, the study's setup (ViT-B/16 from scratch at 224 px on CIFAR-100, 8 GPUs):

    accelerate launch --num_processes 8 recipes/train_vit.py --ds_config ds_configs/zero0.json \
        --model_preset vit-b-16 --dataset_name uoft-cs/cifar100 --label_column_name fine_label \
        --per_device_train_batch_size 64 --learning_rate 1e-4 --num_train_epochs 5 --bf16 \
        --output_dir outputs/vit-b16-cifar100

Fine-tuning a Hub checkpoint: `--model_name_or_path google/vit-base-patch16-224-in21k` instead of `--model_preset`.

High-resolution images with sequence parallelism (each image's 4,097 tokens split over 4 GPUs; 8 GPUs = 2 data-parallel
groups of 4; the 224 px checkpoint's position embeddings are interpolated to 1024 px):

    torchrun --nproc_per_node 8 recipes/train_vit.py --ds_config ds_configs/zero2.json --sequence_parallel_size 4 \
        --model_name_or_path google/vit-base-patch16-224-in21k --image_size 1024 --per_device_train_batch_size 1 \
        --bf16 --dataset_name YOUR_DATASET --output_dir outputs/vit-b16-1024-sp4

On the CPU: `torchrun --nproc_per_node 2 recipes/train_vit.py --sequence_parallel_size 2 --ds_config
ds_configs/zero2.json --model_preset vit-tiny-cpu --image_size 16 --max_steps 30 --output_dir outputs/sp2`.

Every launcher works: `python`, `accelerate launch`, `torchrun --nproc_per_node N`, `deepspeed --num_gpus N`.
Run with `--help` for every flag (ours and TrainingArguments').
"""

import logging
import os
import sys

import transformers
from transformers import AutoImageProcessor, set_seed

from hf_vit_scaling import (
    DEFAULT_PRESET,
    DevicePreprocessor,
    SlowRankSimulator,
    TrainingStopped,
    UserInputError,
    VitTrainer,
    add_throughput_callback,
    apply_lr_scaling,
    attach_transforms,
    attach_uint8_transforms,
    build_model_from_preset,
    calibrate_speeds,
    choose_input_path,
    collate_image_batch,
    collate_uint8_batch,
    count_parameters,
    image_processor_for,
    init_deepspeed_comm,
    load_image_classification_data,
    load_model_for_finetuning,
    make_compute_metrics,
    needs_universal_checkpoint,
    parse_args,
    parse_shares,
    parse_slow_ranks,
    prepare_world_size_change,
    preset_config,
    resolve_resume_checkpoint,
    setup_sequence_parallel,
    shutdown_distributed,
    split_batch,
    with_sample_index,
    write_json_atomically,
    write_model_card,
    zero_stage,
)

logger = logging.getLogger(__name__)


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def build_model_and_processor(model_args, label_names):
    """From scratch (preset) or from a checkpoint (new head). Returns (model, image_processor, description)."""
    if model_args.model_name_or_path:
        # --image_size with a checkpoint: high-resolution fine-tuning, position embeddings interpolated once.
        model = load_model_for_finetuning(model_args.model_name_or_path, label_names, model_args.model_revision,
                                          model_args.cache_dir, model_args.attn_implementation, model_args.image_size)
        processor = AutoImageProcessor.from_pretrained(model_args.model_name_or_path,
                                                       revision=model_args.model_revision, cache_dir=model_args.cache_dir)
        if model_args.image_size:
            processor.size = {"height": model_args.image_size, "width": model_args.image_size}
        return model, processor, f"fine-tuned from {model_args.model_name_or_path}"
    preset = model_args.model_preset or DEFAULT_PRESET
    config = preset_config(preset, label_names, model_args.image_size, model_args.patch_size,
                           model_args.attn_implementation)
    model = build_model_from_preset(config)
    return model, image_processor_for(config), f"{preset} trained from scratch"


def processor_size_and_norm(processor, config):
    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    return size, processor.image_mean, processor.image_std


def balanced_rank_batches(mode, model, train_dataset, collate, training_args) -> list[int] | None:
    """Per-rank micro-batches for heterogeneous clusters: from explicit shares or a short calibration
    (the flag was checked by parse_args: shares name every rank, no ZeRO-3)."""
    world = training_args.world_size
    if mode == "off" or world == 1:
        return None
    global_batch = training_args.per_device_train_batch_size * world
    if mode == "calibrate":
        model.to(training_args.device)
        sample = collate([train_dataset[i] for i in range(training_args.per_device_train_batch_size)])
        shares = calibrate_speeds(model, sample)
    else:
        shares = parse_shares(mode, world)
    sizes = split_batch(global_batch, shares)
    if training_args.process_index == 0:
        print(f"Balanced micro-batches per rank: {sizes} (shares {[round(s, 3) for s in shares]}, "
              f"global batch {global_batch})", flush=True)
    return sizes


def resume_checkpoint(training_args, ds_config) -> str | None:
    """--resume_from_checkpoint PATH or `latest` -> a complete checkpoint (or None); prepares DeepSpeed's universal
    checkpoint when the number of processes changed since it was saved."""
    is_main = training_args.process_index == 0
    folder, notes = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    world = training_args.world_size
    if needs_universal_checkpoint(folder, world, zero_stage(ds_config)):
        notes.append(prepare_world_size_change(folder, training_args, world, is_main))
    if is_main:
        for note in notes:
            print(f"Resume: {note}", flush=True)
    return folder


def report_skips(trainer, training_args) -> dict:
    """Gather every rank's skipped images (a collective) and write skipped_images.json and the counts."""
    bad = trainer.gather_bad_samples()
    counts = {
        "train_skipped_images": sum(b["split"] == "train" for b in bad),
        "eval_skipped_images": sum(b["split"] == "eval" for b in bad),
        "train_nonfinite_steps_skipped": len(trainer.skipped_steps),
    }
    if trainer.is_world_process_zero():
        trainer.save_metrics("reliability", counts)
        if bad:
            write_json_atomically(os.path.join(training_args.output_dir, "skipped_images.json"),
                                  {"count": len(bad), "images": bad})
            print(f"Skipped {len(bad)} image(s) that could not be decoded: see skipped_images.json", flush=True)
    return {"bad images skipped": len(bad), "non-finite steps skipped": len(trainer.skipped_steps)}


def card_info(model_args, data, training_args, model, model_desc, metrics, world_size, ds_config_path,
              lr_info, sp_size: int = 1) -> dict:
    gas = training_args.gradient_accumulation_steps
    return {
        "model_name": os.path.basename(os.path.normpath(training_args.output_dir)),
        "model_desc": model_desc,
        "dataset": data.source,
        "eval_split_size": len(data.splits["validation"]),
        "metrics": metrics,
        "hub_model_id": training_args.hub_model_id,
        "setup": {
            "model": model_args.model_name_or_path or (model_args.model_preset or DEFAULT_PRESET),
            "parameters": f"{count_parameters(model) / 1e6:.2f} M",
            "image size": model.config.image_size,
            "patch size": model.config.patch_size,
            "classes": len(data.label_names),
            "ds_config": ds_config_path or "none (plain Trainer)",
            "world size": world_size,
            "per-device batch": training_args.per_device_train_batch_size,
            "gradient accumulation": gas,
            "sequence parallel size": sp_size,
            # N ranks of one sequence-parallel group share each image: per-device batch x accumulation x world / N.
            "global batch": training_args.per_device_train_batch_size * gas * world_size // sp_size,
            "learning rate": training_args.learning_rate,
            "lr scaling": "none" if lr_info["rule"] == "none" else
            f"{lr_info['rule']} from {lr_info['base_lr']:g} at batch {lr_info['reference_batch']}",
            "epochs": training_args.num_train_epochs if training_args.max_steps <= 0 else f"{training_args.max_steps} steps",
            "precision": "bf16" if training_args.bf16 else ("fp16" if training_args.fp16 else "fp32"),
            "seed": training_args.seed,
        },
    }


def main(argv=None) -> int:
    try:
        model_args, data_args, scaling_args, reliability_args, training_args = parse_args(argv)
    except UserInputError as err:
        if is_main_process():
            print(f"error: {err}", file=sys.stderr)
        return 2

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    # Images become `pixel_values` in a transform, so the raw columns must reach it.
    training_args.remove_unused_columns = False
    if training_args.device.type == "cpu":
        training_args.dataloader_pin_memory = False  # pinning needs an accelerator
    ds_config_path = training_args.deepspeed if isinstance(training_args.deepspeed, str) else None
    lr_info = apply_lr_scaling(training_args, scaling_args.lr_scaling, scaling_args.reference_batch_size,
                               scaling_args.sequence_parallel_size)
    # parse_args checked and loaded the file; TrainingArguments holds it (with the Trainer's "auto" values filled).
    ds_config = training_args.hf_deepspeed_config.config if training_args.deepspeed else None
    if ds_config is not None:
        init_deepspeed_comm()  # ZeRO-3 builds the model partitioned: DeepSpeed must know the world first
    # --sequence_parallel_size N: DeepSpeed's SP groups and mpu, before the model is built (checked in parse_args).
    sequence_parallel = setup_sequence_parallel(scaling_args.sequence_parallel_size, ds_config, training_args)

    try:
        resume_from = resume_checkpoint(training_args, ds_config)
    except UserInputError as err:
        if training_args.process_index == 0:
            print(f"error: {err}", file=sys.stderr)
        return 2

    set_seed(training_args.seed)  # before the model is built: the same seed gives the same initial weights
    try:
        data = load_image_classification_data(data_args, seed=training_args.seed, cache_dir=model_args.cache_dir)
        model, processor, model_desc = build_model_and_processor(model_args, data.label_names)
        if sequence_parallel is not None:
            sequence_parallel.attach(model)  # a checkpoint's head count is only known here
    except UserInputError as err:
        if training_args.process_index == 0:
            print(f"error: {err}", file=sys.stderr)
        return 2
    size, mean, std = processor_size_and_norm(processor, model.config)
    input_path = choose_input_path(data, data_args.input_path)
    if input_path == "device":
        # uint8 batches cross to the device; resize, augmentation and normalisation run there, batched.
        splits, collate = attach_uint8_transforms(data), collate_uint8_batch
        DevicePreprocessor(size, mean, std, data_args.random_resized_crop, data_args.crop_scale_min,
                           data_args.horizontal_flip).attach(model)
    else:
        splits, collate = attach_transforms(data, size, mean, std, data_args), collate_image_batch
    splits = with_sample_index(splits)  # batches say which rows they hold (skipped images, --trace_samples)

    slow_ranks = parse_slow_ranks(scaling_args.simulate_slow_ranks)
    if slow_ranks.get(training_args.process_index, 1.0) > 1.0:
        SlowRankSimulator(slow_ranks[training_args.process_index]).attach(model)  # labelled in every report
    rank_batches = balanced_rank_batches(scaling_args.balance_batches, model, splits["train"], collate,
                                         training_args)

    trainer = VitTrainer(
        model=model,
        args=training_args,
        train_dataset=splits["train"],
        eval_dataset=splits["validation"],
        data_collator=collate,
        compute_metrics=make_compute_metrics(len(data.label_names)),
        processing_class=processor,
        nonfinite_policy=reliability_args.on_nonfinite_loss,
        trace_samples=reliability_args.trace_samples,
    )
    trainer.rank_batches = rank_batches
    trainer.sequence_parallel = sequence_parallel
    add_throughput_callback(trainer, warmup_steps=scaling_args.throughput_warmup_steps,
                            peak_tflops=scaling_args.peak_tflops, ds_config=ds_config, slow_ranks=slow_ranks,
                            rank_batches=rank_batches, sequence_parallel_size=scaling_args.sequence_parallel_size)

    try:
        train_result = trainer.train(resume_from_checkpoint=resume_from)
    except TrainingStopped as err:  # a non-finite loss (every rank) or a failed save: the message says what is safe
        if training_args.process_index == 0 or "saving" in str(err):
            print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        trainer.close_trace()
    trainer.save_model()  # model.safetensors + config + image processor (ZeRO-3: gathered 16-bit weights)
    train_metrics = dict(train_result.metrics, train_samples=len(splits["train"]))
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()

    eval_metrics = trainer.evaluate()
    eval_metrics["eval_samples"] = len(splits["validation"])
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    reliability = report_skips(trainer, training_args)

    world_size = training_args.world_size
    trainer.card_info = card_info(model_args, data, training_args, model, model_desc,
                                  {k: v for k, v in eval_metrics.items() if k.startswith("eval_") and "runtime" not in k
                                   and "per_second" not in k},
                                  world_size, ds_config_path, lr_info, scaling_args.sequence_parallel_size)
    if trainer.is_world_process_zero():
        write_model_card(training_args.output_dir, trainer.card_info)
    if training_args.push_to_hub:
        trainer.push_to_hub()  # our create_model_card writes the same card before the upload
    if trainer.is_world_process_zero():
        stage = zero_stage(ds_config)
        skips = "".join(f", {n} {what}" for what, n in reliability.items() if n)
        print(f"Done: {training_args.output_dir} (accuracy {eval_metrics.get('eval_accuracy', float('nan')):.4f}, "
              f"{'ZeRO-' + str(stage) if stage is not None else 'no DeepSpeed'}, {world_size} process(es){skips})",
              flush=True)
    # Last: gloo's worker threads must be done with every collective before the interpreter tears down (issue 6).
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
