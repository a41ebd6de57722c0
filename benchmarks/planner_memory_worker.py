"""One rank of a memory measurement for `planner_memory.py`: a few Trainer steps with every CPU tensor allocation
tracked, launched by torchrun (2 processes over gloo).

Every engine runs through the Trainer as the recipe runs it: DeepSpeed with ds_configs/<engine>.json (offload
variants included), FSDP2 with `--fsdp --fsdp_config fsdp_configs/fsdp2.json` after the recipe's own CPU setup
(`hf_vit_scaling.parallel.engine.start_engine`), DDP with neither; `--precision bf16` is the Trainer's `bf16=True`
(DeepSpeed's bf16 engine, autocast for DDP, MixedPrecisionPolicy(param_dtype=bf16) + autocast for FSDP2). Until
the bf16 fix the FSDP2 rows applied `fully_shard` by hand and trained in fp32 whatever --precision said. `trained` in
the output records what actually ran.

How memory is measured on a CPU. torch keeps no allocator statistics for CPU tensors (`torch.cpu` has no
`max_memory_allocated`), and RSS counts the interpreter, libraries and freed-but-unreturned pages. But torch's CPU
allocator goes through c10's `ProfiledCPUMemoryReporter`, which keeps a running total of live CPU tensor bytes
(`allocated_`, all threads, under a mutex) when the c10 flag `caffe2_report_cpu_memory_usage` is on, and hands that
total to the profiler with every allocation and free it reports (`profile_memory=True`). The flag is switched on
first thing (it is a plain exported bool in libc10, set through ctypes), so every tensor this rank allocates is in the
total: parameters, optimizer states, DeepSpeed/DDP buffers, activations, gradients. The measured figure is the
highest total seen inside a training step.

Why the flag and not the profiler's own byte counts: the profiler only hears of allocations and frees made in a
thread where it is enabled. gloo completes asynchronous collectives in its own threads, and a tensor whose last
reference dies there (DeepSpeed ZeRO-3's all-gathers do this) would look alive forever (a test's counts:
docs/planner.md, "Checked against measured memory"); the flag's total has none left.

Each step is wrapped in a `record_function` range, so per-step peaks can be read from the same event stream.
Writes `rank{R}.json` into --output_dir.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_PREFIX = "planner_memory_step_"
# The planner's engines (hf_vit_scaling.planning.shapes.ENGINES), each run as the recipe runs it: the ZeRO engines
# with ds_configs/<engine>.json, FSDP2 with fsdp_configs/fsdp2.json, DDP with neither.
ENGINES = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp2")


class SyntheticImages(torch.utils.data.Dataset):
    """Random images: the measurement is about the model, not about decoding."""

    def __init__(self, length: int, image_size: int, num_labels: int):
        self.length, self.image_size, self.num_labels = length, image_size, num_labels

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        pixels = torch.randn(3, self.image_size, self.image_size, generator=generator)
        return {"pixel_values": pixels, "labels": index % self.num_labels}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, choices=list(ENGINES))
    parser.add_argument("--model_preset", required=True)
    parser.add_argument("--image_size", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--num_labels", type=int, default=10)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--output_dir", required=True)
    return parser.parse_args()


def training_arguments(args, output_dir: str):
    from transformers import TrainingArguments

    engine = {}
    if args.engine.startswith("zero"):
        engine["deepspeed"] = os.path.join(REPO, "ds_configs", f"{args.engine}.json")
    elif args.engine == "fsdp2":  # the recipe's `--fsdp --fsdp_config fsdp_configs/fsdp2.json`
        engine.update(fsdp=True, fsdp_config=os.path.join(REPO, "fsdp_configs", "fsdp2.json"))
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=1e-4,
        use_cpu=True,
        bf16=args.precision == "bf16",
        gradient_checkpointing=args.gradient_checkpointing,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=10_000,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        ddp_find_unused_parameters=False,
        remove_unused_columns=False,
        seed=0,
        **engine,
    )


def step_ranges_callback():
    from transformers import TrainerCallback

    class StepRanges(TrainerCallback):
        """Opens a profiler range at each step's start and closes it at its end (after the optimizer step)."""

        def __init__(self):
            self.current = None

        def on_step_begin(self, args, state, control, **kwargs):
            self.current = record_function(f"{STEP_PREFIX}{state.global_step + 1}")
            self.current.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if self.current is not None:
                self.current.__exit__(None, None, None)
                self.current = None

    return StepRanges()


def count_all_cpu_allocations() -> None:
    """Switch on c10's process-wide count of live CPU tensor bytes (see the module docstring)."""
    libc10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(libc10, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def _walk(events):
    for event in events:
        yield event
        yield from _walk(event.children)


def tracked_bytes(prof) -> tuple[list[tuple[int, int]], dict[int, tuple[int, int]]]:
    """(time-ordered (ns, live CPU tensor bytes) at each allocation or free, {step: (start_ns, end_ns)})."""
    timeline, steps = [], {}
    for event in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        kind, fields = event.typed
        if kind == _EventType.Allocation and fields.device.type == "cpu":
            timeline.append((event.start_time_ns, fields.total_allocated))
        elif kind == _EventType.TorchOp and event.name.startswith(STEP_PREFIX):
            steps[int(event.name[len(STEP_PREFIX) :])] = (event.start_time_ns, event.end_time_ns)
    timeline.sort()
    return timeline, steps


def summarise(timeline, steps) -> dict:
    """Peak live bytes overall and per step; live bytes at each step's start (model states held between steps)."""
    per_step = {}
    for step, (start, end) in sorted(steps.items()):
        before = [live for ns, live in timeline if ns < start]
        inside = [live for ns, live in timeline if start <= ns <= end]
        at_start = before[-1] if before else 0
        per_step[step] = {"live_at_start": at_start, "peak": max([at_start, *inside])}
    return {"peak_overall": max((live for _, live in timeline), default=0), "steps": per_step}


def engine_of_training_args(training_args):
    """The run's `Engine` from the TrainingArguments this worker builds: the recipe's own read
    (`arguments.parse.run_engine`); a DeepSpeed config reached TrainingArguments as a path, which names itself."""
    from hf_vit_scaling.arguments.parse import run_engine

    return run_engine(training_args, ds_config_path=None)


def what_trained(trainer, training_args) -> dict:
    """What actually trained, for the record: the engine, the wrapper, the dtypes the parameters are stored in, and
    FSDP2's compute dtype (an earlier version of this worker trained FSDP2 in fp32 whatever --precision said)."""
    from torch.distributed.fsdp import FSDPModule

    record = {
        "engine": engine_of_training_args(training_args).label(),
        "wrapper": type(trainer.model_wrapped).__name__,
        "accelerate_mixed_precision": trainer.accelerator.mixed_precision,
        "parameter_dtypes": sorted({str(p.dtype) for p in trainer.model.parameters()}),
    }
    sharded = next((m for m in trainer.model.modules() if isinstance(m, FSDPModule)), None)
    if sharded is not None:
        record["fsdp_param_dtype"] = str(sharded._get_fsdp_state()._mp_policy.param_dtype)
    return record


def main() -> int:
    args = parse()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    count_all_cpu_allocations()
    rank = int(os.environ.get("RANK", "0"))
    started = time.time()
    # Started before anything is built: every tensor of this rank is allocated while the reporter is on.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        from transformers import Trainer

        from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
        from hf_vit_scaling.parallel.engine import start_engine
        from hf_vit_scaling.utils import peak_rss_bytes

        labels = [str(i) for i in range(args.num_labels)]
        dataset = SyntheticImages(
            args.batch * args.steps * int(os.environ.get("WORLD_SIZE", "1")), args.image_size, args.num_labels
        )
        training_args = training_arguments(args, os.path.join(args.output_dir, "trainer"))
        # What the recipe does before building the model (hf_vit_scaling.training.run.prepare_world): DeepSpeed
        # told the world (ZeRO-3 builds the model partitioned), accelerate told to run FSDP2 on a CPU world.
        start_engine(engine_of_training_args(training_args), training_args.device.type, training_args.mixed_precision)
        model = build_model_from_preset(preset_config(args.model_preset, labels, image_size=args.image_size))
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[step_ranges_callback()])
        trainer.train()
    trained = what_trained(trainer, training_args)
    timeline, steps = tracked_bytes(prof)
    result = {
        "rank": rank,
        "config": vars(args),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "trained": trained,
        "max_rss_bytes": peak_rss_bytes(),
        "wall_s": round(time.time() - started, 1),
        **summarise(timeline, steps),
    }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=2)
    from hf_vit_scaling.parallel.distributed import shutdown_distributed

    shutdown_distributed()  # a no-op without a process group
    return 0


if __name__ == "__main__":
    sys.exit(main())
