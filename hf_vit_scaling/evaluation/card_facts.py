"""The model card's facts of a training run (everything but its metrics): what the recipe trained, on what, with
which engine and batch. `evaluation/model_card.py` renders them with the metrics into README.md."""

import json
import os

from hf_vit_scaling.evaluation.model_card import teacher_accuracy
from hf_vit_scaling.models.mae import pretraining_summary
from hf_vit_scaling.models.presets import count_parameters
from hf_vit_scaling.parallel.distributed import global_batch_size


def teacher_card_rows(distil) -> dict:
    """The card's teacher rows: the folder with the distillation settings, and the accuracy its run recorded."""
    settings = f"{distil.distillation_type}, alpha {distil.distillation_alpha:g}, tau {distil.distillation_tau:g}"
    return {
        "teacher": f"{distil.teacher_model} ({settings})",
        "teacher accuracy": teacher_accuracy(distil.teacher_model),
    }


def resolved_summary(resolved: dict) -> str:
    """The DeepSpeed values the project set, for the card's setup table: "reduce_bucket_size=120832 (1 gradient
    flush a step ...); timers={...} (...)"."""
    return "; ".join(
        f"{key.rsplit('.', 1)[-1]}={json.dumps(entry['value'])} ({entry['reason']})" for key, entry in resolved.items()
    )


def model_card_facts(training, model_args, engine, lr_info: dict, sp_size: int, data, model, model_desc: str) -> dict:
    """Everything the model card says except the metrics (see `model_card.render_model_card`). `training`: the
    Trainer's arguments; `model_args`: the model flags (preset or checkpoint); `engine`: the run's
    `parallel.engine.Engine`; `lr_info`: the learning-rate rule applied (`optim.lr_scaling.lr_for_global_batch`);
    `sp_size`: the sequence-parallel size."""
    gas = training.gradient_accumulation_steps
    lr_scaling = (
        "none"
        if lr_info["rule"] == "none"
        else (f"{lr_info['rule']} from {lr_info['base_lr']:g} at batch {lr_info['reference_batch']}")
    )
    pretrained = pretraining_summary(model_args.model_name_or_path) if model_args.model_name_or_path else None
    return {
        "model_name": os.path.basename(os.path.normpath(training.output_dir)),
        "model_desc": model_desc,
        "model_type": model.config.model_type,  # the card's tag: vit, deit, resnet, regnet...
        "dataset": data.source,
        "eval_split_size": len(data.splits["validation"]),
        "train_selection": data.train_selection,  # which rows trained it: a teacher's are checked by its students
        "hub_model_id": training.hub_model_id,
        "setup": {
            "model": model_args.model_name_or_path or model_args.preset,
            "parameters": f"{count_parameters(model) / 1e6:.2f} M",
            "image size": model.config.image_size,
            "patch size": getattr(model.config, "patch_size", None) or "none (CNN)",
            "classes": len(data.label_names),
            "engine": engine.describe(),
            "engine from": engine.route,
            "ds_config": engine.ds_config_path or "none",
            **({"DeepSpeed values set": resolved_summary(engine.resolved)} if engine.resolved else {}),
            **({"DeepSpeed fast paths": engine.fast_paths_summary()} if engine.fast_paths else {}),
            "world size": training.world_size,
            "per-device batch": training.per_device_train_batch_size,
            "gradient accumulation": gas,
            "sequence parallel size": sp_size,
            "global batch": global_batch_size(training.per_device_train_batch_size, gas, training.world_size, sp_size),
            "learning rate": training.learning_rate,
            "lr scaling": lr_scaling,
            "epochs": training.num_train_epochs if training.max_steps <= 0 else f"{training.max_steps} steps",
            "precision": "bf16" if training.bf16 else ("fp16" if training.fp16 else "fp32"),
            "seed": training.seed,
            **({"pretraining": pretrained} if pretrained else {}),  # an MAE run's folder: its mask ratio, steps
        },
    }
