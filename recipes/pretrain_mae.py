#!/usr/bin/env python
"""Pretrain a ViT encoder as a masked autoencoder (MAE, He et al. 2021, arXiv 2111.06377) with the Hugging Face
Trainer, optionally with DeepSpeed ZeRO or FSDP2; then fine-tune it with recipes/train_vit.py.

The encoder is `--model_preset`'s ViT (transformers' `ViTMAEForPreTraining`): it sees 25% of the patches
(`--mask_ratio 0.75`), a small decoder reconstructs the rest. No labels are trained on; a k-NN accuracy of the
encoder's features on a small labelled subset is logged every `--knn_eval_steps` and at the end (`eval_knn_accuracy`),
and `reconstructions.png` shows original, masked and reconstructed held-out images. Tried on a 2-core CPU:

    accelerate launch --multi_gpu --num_processes 2 recipes/pretrain_mae.py --ds_config ds_configs/zero2.json \
        --model_preset vit-tiny-cpu --output_dir outputs/mae-digits --max_steps 300 --knn_eval_steps 100 \
        --report_to none

Then fine-tune its encoder (every encoder tensor loaded and checked; the decoder is dropped):

    accelerate launch --multi_gpu --num_processes 2 recipes/train_vit.py --ds_config ds_configs/zero2.json \
        --model_name_or_path outputs/mae-digits --output_dir outputs/mae-digits-ft --num_train_epochs 30 \
        --layer_decay 0.75 --drop_path_rate 0.1 --report_to none

Every launcher, engine, data source, resume and fault flag of recipes/train_vit.py works here too; classification-only
flags (Mixup/CutMix, a teacher, class weights) are refused. Run with `--help` for every flag.
"""

import sys

from transformers import set_seed

from hf_vit_scaling import (
    MaeTrainer,
    build_mae_model,
    finish_mae_run,
    load_image_classification_data,
    parse_args,
    prepare_mae_inputs,
    prepare_mae_training,
    prepare_world,
    shutdown_distributed,
)
from hf_vit_scaling.training.recipe import exit_code_of, trainer_arguments  # what every recipe builds the same way


def train(argv=None) -> None:
    """Parse, build, pretrain and evaluate: the run itself; `main` turns an error into its exit code."""
    args = parse_args(argv, mae=True)
    training = args.training

    # The evaluation schedule and FSDP2's MAE blocks, then engine, learning rate, resume point: before the model
    prepare_mae_training(training, args.mae)
    world = prepare_world(args)

    # Data (labels kept only for the k-NN probe) and the MAE model (the same seed gives the same weights)
    set_seed(training.seed)
    data = load_image_classification_data(
        args.data, seed=training.seed, cache_dir=args.model.cache_dir, streaming=args.streaming
    )
    model, processor, model_desc = build_mae_model(args, data.label_names)
    inputs = prepare_mae_inputs(args, world, data, model, processor, model_desc)

    # Trainer: the model's forward returns the reconstruction loss; evaluation adds the k-NN accuracy. The splits and
    # features are train_vit.py's (`trainer_arguments`); the classification-only ones were refused at parse time.
    trainer = MaeTrainer(
        model=model,
        args=training,
        processing_class=processor,
        knn=inputs.knn,
        **trainer_arguments(args, world, inputs),
    )

    # Training, then the picture, evaluation (k-NN accuracy), pretraining.json and the done line
    try:
        train_result = trainer.train(resume_from_checkpoint=world.resume_from)
    finally:
        trainer.close_trace()
    finish_mae_run(trainer, train_result, world, inputs, args, data)
    # Last: gloo's worker threads must be done with every collective before the interpreter tears down.
    shutdown_distributed()


# The exit code: 0 done; 2 bad input; 1 stopped (a non-finite loss, a failed save); 75 a stop signal ended the run
# with a checkpoint (run again to resume). Each is one line, never a traceback.
def main(argv=None) -> int:
    return exit_code_of(train, argv)


if __name__ == "__main__":
    sys.exit(main())
