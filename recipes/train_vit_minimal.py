#!/usr/bin/env python
"""The bare shape: train or fine-tune a ViT with the Hugging Face Trainer and DeepSpeed, nothing else.

Copy this file when you want the smallest working recipe; `train_vit.py` adds the rest (throughput report,
resume after kills, sequence parallelism, heterogeneous clusters, the device input path, a model card). DeepSpeed
comes in through the Trainer's own `--deepspeed` flag; every launcher works, plain `python` too (one process). On a CPU
(gloo) add `--use_cpu true`:

    torchrun --nproc_per_node 2 recipes/train_vit_minimal.py --deepspeed ds_configs/zero2.json --use_cpu true \
        --output_dir outputs/minimal --num_train_epochs 5 --per_device_train_batch_size 16 --learning_rate 1e-3 \
        --report_to none

Fine-tune: `--model_name_or_path google/vit-base-patch16-224-in21k --dataset_name uoft-cs/cifar10`.

Exit codes (`exit_code_of`): 0 done; 2 bad input (an unknown flag, a bad value, a dataset that cannot be read), as one
`error:` line.
"""

import sys

from transformers import Trainer, TrainingArguments, set_seed

from hf_vit_scaling import (
    DataArguments,
    DataclassParser,
    ModelArguments,
    attach_transforms,
    build_model,
    collate_image_batch,
    exit_code_of,
    load_image_classification_data,
    make_compute_metrics,
    shutdown_distributed,
)


def train(argv=None) -> None:
    parser = DataclassParser((ModelArguments, DataArguments, TrainingArguments), script="recipes/train_vit_minimal.py")
    model_args, data_args, training_args = parser.parse_flags(argv)
    training_args.remove_unused_columns = False  # images become `pixel_values` in a transform

    # Data and model
    set_seed(training_args.seed)
    data = load_image_classification_data(data_args, seed=training_args.seed, cache_dir=model_args.cache_dir)
    model, processor, _ = build_model(model_args, data.label_names)
    size = model.config.image_size
    splits = attach_transforms(data, size, processor.image_mean, processor.image_std, data_args)

    # Training and evaluation
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=splits["train"],
        eval_dataset=splits["validation"],
        data_collator=collate_image_batch,
        compute_metrics=make_compute_metrics(len(data.label_names)),
        processing_class=processor,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    # Last: gloo's worker threads must be done with every collective before the interpreter tears down, or a
    # rank can abort after the run finished ("terminate called without an active exception"; docs/reliability.md).
    shutdown_distributed()


def main(argv=None) -> int:
    return exit_code_of(train, argv)  # bad input: one `error:` line, exit 2


if __name__ == "__main__":
    sys.exit(main())
