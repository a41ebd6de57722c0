"""The recipe's building blocks, in the order `recipes/train_vit.py` calls them.

1. `prepare_world(args)`: the engine (DeepSpeed, FSDP2 or the plain Trainer) and its communication, the learning rate
   for the global batch, sequence-parallel groups, and the checkpoint to resume from; all before the model exists
   (ZeRO-3 builds it partitioned over the world).
2. `build_model(model_args, label_names, distillation_token)` (`models/build.py`): a preset from scratch (a ViT,
   or with `--distillation_token` a DeiT with its second head) or a checkpoint with a new head.
3. `prepare_inputs(args, world, data, model, processor, model_desc)`: four phases, each decided in one place: the
   loss (`choose_loss`), the input path (`data/input_pipeline.py`), the model's extension points (its hooks in their
   one order, `model_hooks`), and the run's records (per-rank batches, metrics, EMA, the model card's facts).
4. `finish_run(trainer, train_result, world, inputs)`: save, evaluate (metrics, and per class in
   eval_confusion_matrix.json), report skipped images, model card, push, one done line.
"""

import os
from dataclasses import asdict, dataclass

from hf_vit_scaling.data.input_pipeline import attach_input_path
from hf_vit_scaling.data.streaming.load import StreamBatches, split_size
from hf_vit_scaling.evaluation.card_facts import model_card_facts, teacher_card_rows
from hf_vit_scaling.evaluation.metrics import make_module_compute_metrics, save_class_report
from hf_vit_scaling.evaluation.model_card import load_card_facts, teacher_accuracy
from hf_vit_scaling.log import logger, setup_logging
from hf_vit_scaling.losses.class_weighting import class_weighting_loss
from hf_vit_scaling.losses.distillation import DistillationLoss
from hf_vit_scaling.models.flops import as_pair
from hf_vit_scaling.models.presets import count_parameters
from hf_vit_scaling.optim.build import Optimization
from hf_vit_scaling.optim.lr_scaling import deepspeed_lr_values
from hf_vit_scaling.parallel.distributed import is_main_process
from hf_vit_scaling.parallel.engine import Engine, start_engine
from hf_vit_scaling.parallel.hetero import SlowRankSimulator, balanced_rank_batches
from hf_vit_scaling.parallel.sequence_parallel import sequence_parallel_ds_values, setup_sequence_parallel
from hf_vit_scaling.regularization.batch_augmenter import BatchAugmenter
from hf_vit_scaling.regularization.ema import EMACallback, check_ema_resumable
from hf_vit_scaling.training.checkpoints import (
    UNIVERSAL_LOADING,
    check_optimizer_state,
    needs_universal_checkpoint,
    prepare_world_size_change,
    resolve_resume_checkpoint,
)
from hf_vit_scaling.training.distillation import Teacher, check_teacher_labels, check_teacher_rows
from hf_vit_scaling.training.hub import push_trained_model
from hf_vit_scaling.training.loader_workers import release_loader_workers
from hf_vit_scaling.training.model_hooks import attach_model_hooks
from hf_vit_scaling.utils import write_json_atomically


@dataclass
class World:
    """What is settled before the model is built."""

    engine: Engine
    lr_info: dict  # the learning-rate rule applied (see optim.build.Optimization.scale_learning_rate)
    sequence_parallel: object | None  # a ViTSequenceParallel, or None
    resume_from: str | None  # a complete checkpoint folder, or None
    optimization: Optimization | None = None  # the optimizer, its schedule and lrs (`optim.build`), for the Trainer


@dataclass
class TrainerInputs:
    """What the Trainer is given besides the model: splits with transforms, the collate function, the metrics, the
    model card's facts and per-rank batches."""

    splits: dict
    collate: object
    compute_metrics: object | None  # None when the model is not a classifier (MAE pretraining)
    model_card: dict | None
    rank_batches: list[int] | None
    compute_loss_func: object | None = None  # soft-target loss with Mixup/CutMix/label smoothing, or distillation
    ema: object | None = None  # EMACallback: the weights' moving average, continued from a resumed checkpoint
    teacher_config: object | None = None  # a distillation teacher's config: its forward FLOPs join the MFU
    input_path: object | None = None  # the input path chosen (`data.input_path.InputPath`)


def prepare_world(args) -> World:
    """Logging, engine, learning rate, sequence-parallel groups and the resume point (see the module docstring)."""
    training = args.training
    setup_logging(training.get_process_log_level())
    training.remove_unused_columns = False  # images become `pixel_values` in a transform: raw columns must reach it
    if args.streaming.streaming:
        training.ignore_data_skip = True  # a stream resumes from the data position in the checkpoint, not by skipping
    if training.device.type == "cpu":
        training.dataloader_pin_memory = False  # pinning needs an accelerator
    if args.reliability.on_nonfinite_loss == "stop":  # the policy stops before a non-finite loss is logged, so the
        training.logging_nan_inf_filter = False  # Trainer's filter has nothing to do; its check reads every loss
    if args.distillation.distillation_token:  # DeiT's two-head forward takes no `labels`: the Trainer would find no
        training.label_names = ["labels"]  # label field in its signature and evaluate without labels (no accuracy)
    sp_size = args.engine.sequence_parallel_size
    engine = args.run_engine  # resolved once by parse_args
    optimization = Optimization(**asdict(args.lr), layer_decay=args.regularization.layer_decay)
    lr_info = optimization.scale_learning_rate(
        training.learning_rate,
        training.warmup_steps,
        training.per_device_train_batch_size,
        training.gradient_accumulation_steps,
        training.world_size,
        sp_size,
    )
    training.learning_rate, training.warmup_steps = lr_info["lr"], lr_info["warmup_steps"]  # the Trainer's, and
    engine.set_values(
        deepspeed_lr_values(engine.reading.lr_keys, lr_info["lr"]),  # DeepSpeed's optimizer block
        f"--lr_scaling {lr_info['rule']}",
    )
    start_engine(engine, training.device.type, training.mixed_precision)
    if sp_size > 1:
        engine.set_values(
            sequence_parallel_ds_values(
                sp_size,
                training.per_device_train_batch_size,
                training.gradient_accumulation_steps,
                training.world_size,
            ),
            f"--sequence_parallel_size {sp_size}: batch counted per data-parallel replica",
        )
    sequence_parallel = setup_sequence_parallel(sp_size, engine.zero_stage)
    resume_from = resume_checkpoint(training, engine)
    check_ema_resumable(args.regularization.ema_decay, resume_from)  # the EMA state must be there
    return World(engine, lr_info, sequence_parallel, resume_from, optimization)


def resume_checkpoint(training_args, engine: Engine) -> str | None:
    """--resume_from_checkpoint PATH or `latest` -> a complete checkpoint (or None); prepares DeepSpeed's universal
    checkpoint when the number of processes changed since it was saved."""
    folder, notes = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if folder is not None:
        check_optimizer_state(folder, engine.kind, engine.zero_stage)
    world = training_args.world_size
    if needs_universal_checkpoint(folder, world, engine.zero_stage):
        notes.append(prepare_world_size_change(folder, world, is_main_process()))
        engine.set_values(UNIVERSAL_LOADING, "resumed on another number of processes")
    for note in notes:
        logger.info(f"Resume: {note}")
    return folder


def training_loss(args, data, augmenter):
    """The Trainer's `compute_loss_func`: the augmenter's soft-target loss (Mixup/CutMix, label smoothing),
    class-weighted cross-entropy, or None for the model's own loss. Reads the training labels, so call it before
    the image transforms are set."""
    if augmenter.produces_soft_targets:
        return augmenter.loss
    if args.data.class_weighting != "none":  # validate_args refused class weights beside soft targets
        labels = data.splits["train"][data.label_column]
        return class_weighting_loss(args.data.class_weighting, labels, len(data.label_names))
    return None


def distillation_loss_for(args, data, augmenter, training_precision) -> DistillationLoss:
    """The teacher (loaded once on this rank, checked against the data's classes before training) and DeiT's loss
    on the augmenter's targets. Its pixel hook goes on the model after the input hooks (`attach_model_hooks`)."""
    distil = args.distillation
    teacher = Teacher.from_pretrained(distil.teacher_model, training_precision)
    check_teacher_labels(teacher.labels, data.label_names, distil.teacher_model)
    teacher_facts = load_card_facts(distil.teacher_model) or {}
    check_teacher_rows(teacher_facts.get("train_selection"), data.train_selection, distil.teacher_model)
    held = sum(p.numel() for p in teacher.model.parameters())  # this rank's own elements: 0 if it were partitioned
    logger.info(
        f"Distillation: {distil.distillation_type} from {distil.teacher_model} (alpha "
        f"{distil.distillation_alpha:g}, tau {distil.distillation_tau:g}), teacher "
        f"{type(teacher.model).__name__} of {count_parameters(teacher.model) / 1e6:.2f} M parameters "
        f"({held:,} held whole on this rank), frozen, {str(training_precision).removeprefix('torch.')}; "
        f"teacher accuracy: {teacher_accuracy(distil.teacher_model)}"
    )
    return DistillationLoss(
        teacher,
        len(data.label_names),
        distil.distillation_type,
        distil.distillation_alpha,
        distil.distillation_tau,
        augmenter,
    )


def run_precision(training_args):
    """The dtype the run computes in: bf16, fp16 or float32."""
    import torch

    return torch.bfloat16 if training_args.bf16 else (torch.float16 if training_args.fp16 else torch.float32)


def choose_loss(args, data, augmenter) -> tuple:
    """Phase 1, the loss: (the Trainer's `compute_loss_func` or None, the DistillationLoss or None). DeiT's loss with
    a teacher (check_distillation refused class weights beside one), else `training_loss`."""
    if args.distillation.enabled:
        distillation = distillation_loss_for(args, data, augmenter, run_precision(args.training))
        return distillation, distillation
    return training_loss(args, data, augmenter), None


def attach_extension_points(args, world: World, model, pipeline, augmenter, distillation) -> None:
    """Phase 3, the model's extension points: its forward hooks in their one order (`model_hooks`): the device half
    of the input path, sequence parallelism, a simulated slow rank, the batch augmenter, the eval crop, drop path and
    the teacher's pixels."""
    reg = args.regularization
    factor = args.cluster.slow_ranks.get(args.training.process_index, 1.0)
    slow_rank = SlowRankSimulator(factor) if factor > 1.0 else None  # labelled in every report
    eval_crop = pipeline.path.eval_crop(as_pair(model.config.image_size)[0], reg.eval_crop_pct)  # None on the host
    attach_model_hooks(
        model,
        pipeline.preprocessor,
        world.sequence_parallel,
        slow_rank,
        augmenter if augmenter.active else None,
        eval_crop,
        reg.drop_path_rate,
        distillation,
    )


def card_facts(args, world: World, data, model, model_desc: str) -> dict:
    """The model card's facts of this run (`evaluation.card_facts.model_card_facts`), from the values it needs."""
    return model_card_facts(
        args.training,
        args.model,
        world.engine,
        world.lr_info,
        args.engine.sequence_parallel_size,
        data,
        model,
        model_desc,
    )


def prepare_inputs(
    args, world: World, data, model, processor, model_desc: str, classifier: bool = True
) -> TrainerInputs:
    """What the Trainer is given besides the model, in four phases, each decided in one place: the loss
    (`choose_loss`), the input path (`data/input_pipeline.attach_input_path`), the model's extension points
    (`attach_extension_points`), and the run's records (per-rank batches, metrics, EMA, the model card's facts).
    `classifier=False` (MAE pretraining): no classification metrics (their `evaluate` modules are not loaded) and no
    card facts."""
    # DeepSpeed's model-sized values, before the Trainer (a CPU has no streams to overlap a reduction on)
    world.engine.resolve_for_model(model, args.training.world_size, on_gpu=args.training.device.type != "cpu")
    size, mean, std = as_pair(model.config.image_size)[0], processor.image_mean, processor.image_std
    reg = args.regularization
    smoothing = args.training.label_smoothing_factor  # applied by the augmenter's loss, before mixing
    augmenter = BatchAugmenter.from_arguments(reg, len(data.label_names), mean, std, smoothing)
    loss, distillation = choose_loss(args, data, augmenter)  # reads the training labels: before the transforms
    training = args.training
    stream_batches = StreamBatches(
        training.per_device_train_batch_size, training.dataloader_drop_last, training.dataloader_num_workers
    )
    pipeline = attach_input_path(
        data,
        args.data,
        size,
        mean,
        std,
        training.device.type == "cpu",
        training.seed,
        stream_batches,
        reg.eval_crop_pct,
        world.resume_from,
    )
    attach_extension_points(args, world, model, pipeline, augmenter, distillation)
    rank_batches = balanced_rank_batches(
        args.cluster.balance_batches,
        model,
        pipeline.splits["train"],
        pipeline.collate,
        training.world_size,
        training.per_device_train_batch_size,
        training.device,
    )
    card = card_facts(args, world, data, model, model_desc) if classifier else None
    if distillation is not None:
        card["setup"] |= teacher_card_rows(args.distillation)
    ema = EMACallback(reg.ema_decay, world.resume_from) if reg.ema_decay else None
    # top-1, top-5, macro F1; per-class kept aside
    metrics = make_module_compute_metrics(data.label_names) if classifier else None
    teacher_config = distillation.teacher.model.config if distillation is not None else None
    return TrainerInputs(
        pipeline.splits, pipeline.collate, metrics, card, rank_batches, loss, ema, teacher_config, pipeline.path
    )


def distinct_bad_samples(notes: list[dict]) -> list[dict]:
    """One entry per bad image (split + name: its path, or its row when it has none), in the order first met, with
    `times_skipped`. The trainer notes an image each time a batch leaves it out: a bad validation file at every
    evaluation, a bad training file every epoch, and on each rank that met it; it is still one bad file."""
    seen: dict[tuple, dict] = {}
    for note in notes:
        key = (note["split"], note["sample"])
        if key in seen:
            seen[key]["times_skipped"] += 1
        else:
            seen[key] = {**note, "times_skipped": 1}
    return list(seen.values())


def report_skips(trainer) -> dict:
    """Gather every rank's skipped images (a collective) and write skipped_images.json and the counts (each bad image
    once, however often it was met)."""
    bad = distinct_bad_samples(trainer.gather_bad_samples())
    counts = {
        "train_skipped_images": sum(b["split"] == "train" for b in bad),
        "eval_skipped_images": sum(b["split"] == "eval" for b in bad),
        "train_nonfinite_steps_skipped": len(trainer.skipped_steps),
    }
    if trainer.is_world_process_zero():
        trainer.save_metrics("reliability", counts)
        if bad:
            path = os.path.join(trainer.args.output_dir, "skipped_images.json")
            write_json_atomically(path, {"count": len(bad), "images": bad})
            logger.info(f"Skipped {len(bad)} image(s) that could not be decoded: see skipped_images.json")
    return {"bad images skipped": len(bad), "non-finite steps skipped": len(trainer.skipped_steps)}


def note_ema_step(trainer) -> None:
    """Say in the log and the card which step the saved EMA (ema/, eval_ema_*) averages up to: the best checkpoint's
    under --load_best_model_at_end (beside the best model), else the last step's."""
    ema = trainer.ema
    which = f"step {ema.global_step}" + (
        ", the best checkpoint's, as the model" if ema.best_step is not None else ", the last"
    )
    logger.info(f"EMA (decay {ema.decay:g}) saved in ema/: the average up to {which}.")
    if trainer.model_card_facts is not None:
        trainer.model_card_facts["setup"]["EMA (ema/)"] = f"decay {ema.decay:g}, averaged up to {which}"


def finish_run(trainer, train_result, world: World, inputs: TrainerInputs, score: str = "accuracy") -> dict:
    """Save the model and metrics, evaluate, report skipped images, write the card, push, print the done line
    (with `eval_<score>`: MAE pretraining's is its k-NN accuracy)."""
    trainer.save_model()  # model.safetensors + config + image processor (ZeRO-3: gathered 16-bit weights)
    if trainer.ema is not None:  # the EMA weights as a second plain model beside the trained one
        with trainer.ema.applied(trainer.model):
            trainer.save_model(os.path.join(trainer.args.output_dir, "ema"))
        note_ema_step(trainer)
    train_metrics = dict(train_result.metrics)
    if split_size(inputs.splits["train"]) is not None:  # a stream's size is known from a manifest only
        train_metrics["train_samples"] = split_size(inputs.splits["train"])
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()

    eval_metrics = trainer.evaluate()
    eval_metrics["eval_samples"] = len(inputs.splits["validation"])
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    if trainer.is_world_process_zero():  # per-class accuracy and the confusion matrix: eval_confusion_matrix.json
        for prefix, report in trainer.class_reports.items():
            save_class_report(trainer.args.output_dir, prefix, report)
    skips = report_skips(trainer)

    trainer.write_model_card(eval_metrics)
    if trainer.args.push_to_hub:
        push_trained_model(trainer)  # our create_model_card writes the same card before the upload
    release_loader_workers(trainer)  # not at interpreter exit: up to 5 s per worker there (see the module)
    noted = "".join(f", {n} {what}" for what, n in skips.items() if n)
    logger.info(
        f"Done: {trainer.args.output_dir} ({score} {eval_metrics.get(f'eval_{score}', float('nan')):.4f}, "
        f"{world.engine.label()}, {trainer.args.world_size} process(es){noted})"
    )
    return eval_metrics
