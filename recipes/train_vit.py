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

import sys

from transformers import set_seed

from hf_vit_scaling import (
    VitTrainer,
    build_model,
    finish_run,
    load_image_classification_data,
    parse_args,
    prepare_inputs,
    prepare_world,
    shutdown_distributed,
)
from hf_vit_scaling.training.recipe import exit_code_of, trainer_arguments  # what every recipe builds the same way


def train(argv=None) -> None:
    """Parse, build, train and evaluate: the run itself; `main` turns an error into its exit code."""
    args = parse_args(argv)
    training = args.training

    # Engine, learning rate, sequence-parallel groups, resume point: before the model (ZeRO-3 partitions it)
    world = prepare_world(args)

    # Data and model (the same seed gives the same initial weights)
    set_seed(training.seed)
    data = load_image_classification_data(
        args.data, seed=training.seed, cache_dir=args.model.cache_dir, streaming=args.streaming
    )
    model, processor, model_desc = build_model(args.model, data.label_names, args.distillation.distillation_token)
    inputs = prepare_inputs(args, world, data, model, processor, model_desc)

    # Trainer: the splits, metrics and every feature the flags turn on (`trainer_arguments`, shared by the recipes)
    trainer = VitTrainer(
        model=model, args=training, processing_class=processor, **trainer_arguments(args, world, inputs)
    )

    # Training, then evaluation, reports, model card and the done line
    try:
        train_result = trainer.train(resume_from_checkpoint=world.resume_from)
    finally:
        trainer.close_trace()
    finish_run(trainer, train_result, world, inputs)
    # Last: gloo's worker threads must be done with every collective before the interpreter tears down.
    shutdown_distributed()


# The exit code: 0 done; 2 bad input; 1 stopped (a non-finite loss, a failed save); 75 a stop signal ended the run
# with a checkpoint (run again to resume). Each is one line, never a traceback.
def main(argv=None) -> int:
    return exit_code_of(train, argv)


if __name__ == "__main__":
    sys.exit(main())
