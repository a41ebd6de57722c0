#!/usr/bin/env python
"""Cost of `--stop_signals` on a step that receives no signal: Trainer step time with the stop callback
(`training.interruption.StopOnSignal`: signal handlers, one all_reduce of a flag after every optimizer step) and
without it, measured side by side in one 2-process run.

    python benchmarks/stop_on_signal.py --steps 100 --repeats 6 --output benchmarks/results/stop_on_signal.json

Started plainly, the script starts itself under torchrun with `--nproc` processes (gloo on a CPU, NCCL on GPUs;
the flag's all_reduce then runs on a gloo side group, on CPU tensors).

Method: the same model, data, seed and threads in both arms; each arm is a fresh Trainer run of `--steps` optimizer
steps (DDP); the arms alternate in ABBA order (with, without, without, with, ...) `--repeats` times, to cancel drift
and order effects. Step time is the time between consecutive `on_step_end` calls, taken by a minimal timer present in
both arms, the first `--warmup` steps of each run dropped; the figure per arm is the median over all its steps, on
rank 0. The flag's all_reduce is also timed directly, 2,000 times.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from _common import REPO, child_env, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_preset", default="vit-tiny-cpu", help="Model preset (hf_vit_scaling presets).")
    parser.add_argument("--image_size", type=int, default=32, help="Image side in pixels.")
    parser.add_argument("--batch_size", type=int, default=32, help="Images per process per step.")
    parser.add_argument("--steps", type=int, default=100, help="Optimizer steps per run.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps dropped at the start of each run.")
    parser.add_argument("--repeats", type=int, default=4, help="Runs per arm, alternating.")
    parser.add_argument("--nproc", type=int, default=2, help="Processes (torchrun --nproc_per_node).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    return parser.parse_args()


def one_run(with_stop: bool, args, splits, label_names) -> list[float]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hf_vit_scaling.data.decoding import stack_batch
    from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
    from hf_vit_scaling.training.interruption import StopOnSignal, parse_stop_signals

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    torch.manual_seed(0)
    model = build_model_from_preset(preset_config(args.model_preset, label_names, image_size=args.image_size))
    timer = StepTimer()
    callbacks = [timer, StopOnSignal(parse_stop_signals("SIGTERM,SIGUSR1"))] if with_stop else [timer]
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size, use_cpu=True,
            report_to="none", save_strategy="no", logging_steps=1000, disable_tqdm=True, remove_unused_columns=False,
            dataloader_pin_memory=False, seed=0,
        )  # fmt: skip
        Trainer(model=model, args=training_args, train_dataset=splits["train"], data_collator=stack_batch,
                callbacks=callbacks).train()  # fmt: skip
    deltas = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    return deltas[args.warmup :]


def flag_all_reduce_seconds(calls: int = 2000) -> float:
    """Median seconds of one `agreed_signal()` (the all_reduce of the 0/1 flag), every rank calling together."""
    from hf_vit_scaling.training.interruption import StopOnSignal

    stop = StopOnSignal(())
    stop.on_train_begin(None, None, None)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        stop.agreed_signal()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(args) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    import transformers

    from hf_vit_scaling.arguments.data import DataArguments
    from hf_vit_scaling.data.host_transforms import attach_transforms
    from hf_vit_scaling.data.loading import load_image_classification_data
    from hf_vit_scaling.models.presets import image_processor_for, preset_config

    torch.set_num_threads(args.threads)
    data = load_image_classification_data(DataArguments(), seed=0)
    processor = image_processor_for(preset_config(args.model_preset, data.label_names, image_size=args.image_size))
    splits = attach_transforms(data, args.image_size, processor.image_mean, processor.image_std,
                               DataArguments(horizontal_flip=False, crop_scale_min=0.5))  # fmt: skip
    arms, run_medians = {"with": [], "without": []}, {"with": [], "without": []}
    for repeat in range(args.repeats):
        for arm in ("with", "without") if repeat % 2 == 0 else ("without", "with"):  # ABBA: no arm always first
            deltas = one_run(arm == "with", args, splits, data.label_names)
            arms[arm] += deltas
            run_medians[arm].append(round(1000 * statistics.median(deltas), 3))
    flag_s = flag_all_reduce_seconds()
    if dist.get_rank() != 0:
        return
    with_ms, without_ms = (1000 * statistics.median(arms[a]) for a in ("with", "without"))
    report_result({
        "setup": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                  "processes": dist.get_world_size(), "backend": dist.get_backend(), "threads": args.threads,
                  "model_preset": args.model_preset, "image_size": args.image_size, "batch_size": args.batch_size,
                  "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "torch": torch.__version__,
                  "transformers": transformers.__version__, "deepspeed": deepspeed.__version__},
        "median_step_ms": {"with": round(with_ms, 3), "without": round(without_ms, 3)},
        "ratio_with_over_without": round(with_ms / without_ms, 4),
        "median_step_ms_per_run": run_medians,
        "steps_timed_per_arm": len(arms["with"]),
        "flag_all_reduce_us": round(1e6 * flag_s, 1),
        "flag_share_of_step": round(flag_s / (without_ms / 1000), 5),
    }, args.output)  # fmt: skip


def main() -> int:
    args = parse()
    if "LOCAL_RANK" in os.environ:
        worker(args)
        return 0
    env = child_env(args.threads)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "benchmarks"), env["PYTHONPATH"]])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc), __file__, *sys.argv[1:]]
    return subprocess.run(cmd, env=env, cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main())
