#!/usr/bin/env python
"""Overhead of the throughput-report callback: Trainer step time with and without it, measured side by side.

    python benchmarks/callback_overhead.py --model_preset vit-tiny-cpu --image_size 32 --steps 200 --repeats 3

Method: one process, the same model, data, seed and threads in both arms. Each arm is a fresh Trainer run of
`--steps` optimizer steps; arms alternate (with, without, with, without, ...) `--repeats` times to cancel drift.
Step time is taken by a minimal timing callback present in both arms (time between consecutive `on_step_end`),
the first `--warmup` steps of each run dropped; the figure per arm is the median over all its steps.
"""

import argparse
import platform
import statistics
import tempfile
import time

import torch
import transformers
from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.decoding import stack_batch as collate_image_batch
from hf_vit_scaling.data.host_transforms import attach_transforms
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.models.presets import build_model_from_preset, image_processor_for, preset_config
from hf_vit_scaling.throughput.timing import ThroughputCallback


class StepTimer(TrainerCallback):
    def __init__(self):
        self.ends = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def one_run(with_report: bool, args, data) -> list[float]:
    torch.manual_seed(0)
    config = preset_config(args.model_preset, data.label_names, image_size=args.image_size)
    model = build_model_from_preset(config)
    processor = image_processor_for(config)
    splits = attach_transforms(
        data,
        config.image_size,
        processor.image_mean,
        processor.image_std,
        DataArguments(horizontal_flip=False, crop_scale_min=0.5),
    )
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=50,
            disable_tqdm=True,
            remove_unused_columns=False,
            dataloader_pin_memory=False,
            seed=0,
        )
        timer = StepTimer()
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=splits["train"],
            data_collator=collate_image_batch,
            callbacks=[timer],
        )
        if with_report:
            trainer.callback_handler.callbacks.insert(
                0, ThroughputCallback(warmup_steps=args.warmup, peak_tflops=1.0, print_table=False)
            )
        trainer.train()
    deltas = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    return deltas[args.warmup :]


def direct_cost_per_step(n: int = 2000) -> float:
    """Seconds the callback itself spends per step: its two step events plus its forward hooks around a no-op
    module, timed directly (no model compute), so it is free of run-to-run noise."""
    from transformers import TrainerControl, TrainerState

    class NoOp(torch.nn.Module):
        def forward(self, pixel_values=None):
            return pixel_values

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, use_cpu=True, report_to="none")
        state, control, module = TrainerState(), TrainerControl(), NoOp().train()
        cb = ThroughputCallback(warmup_steps=0, peak_tflops=1.0, print_table=False)
        cb.on_train_begin(args, state, control, model=module)
        x = torch.zeros(4, 3, 8, 8)
        start = time.perf_counter()
        for _ in range(n):
            cb.on_step_begin(args, state, control)
            module(pixel_values=x)
            cb.on_step_end(args, state, control)
        with_cb = time.perf_counter() - start
        for hook in cb._hooks:
            hook.remove()
        start = time.perf_counter()
        for _ in range(n):
            module(pixel_values=x)
        bare = time.perf_counter() - start
    return (with_cb - bare) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", default="vit-tiny-cpu", help="Preset to time.")
    parser.add_argument("--image_size", type=int, default=32, help="Input resolution.")
    parser.add_argument("--batch_size", type=int, default=32, help="Per-device batch size.")
    parser.add_argument("--steps", type=int, default=200, help="Optimizer steps per run.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps dropped at the start of each run.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per arm, alternated.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    data = load_image_classification_data(DataArguments(), seed=0)
    times = {"with": [], "without": []}
    for _ in range(args.repeats):
        times["with"] += one_run(True, args, data)
        times["without"] += one_run(False, args, data)
    median = {arm: statistics.median(v) for arm, v in times.items()}
    direct = direct_cost_per_step()
    result = {
        "setup": {
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "model_preset": args.model_preset,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "deepspeed": "none (plain Trainer)",
            "steps_per_run": args.steps,
            "warmup_dropped": args.warmup,
            "repeats": args.repeats,
        },
        "median_step_s": median,
        "ratio_with_over_without": median["with"] / median["without"],
        "callback_direct_cost_s_per_step": direct,
        "direct_cost_fraction_of_step": direct / median["without"],
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
