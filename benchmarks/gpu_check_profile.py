#!/usr/bin/env python
"""The GPU check's profiler item: `torch.profiler` over a few steps of the synthetic floor, of the plain Trainer and
of ZeRO-2, each summarised as its top kernels by device self time and the device-busy fraction. Part of
benchmarks/gpu_check.py, which starts this file once per profiled run (docs/gpu.md, "What runs, in this order"):

    python benchmarks/gpu_check_profile.py --out floor.json [--dry_run] floor
    python benchmarks/gpu_check_profile.py --out ddp.json --start 10 --steps 5 -- recipes/train_vit.py ...

The recipe runs unchanged in this process (runpy, as `python recipes/train_vit.py ...` would run it) with one
TrainerCallback added to its trainer: no recipe flag, so the recipe's --help stays what it is.

The window is whole steps as the throughput report times them: from the end of step `start` (the device
synchronised) to the end of step `start + steps`, so the data wait between steps is inside it. Activities: CPU and
CUDA on a GPU; CPU alone on the CPU (the dry run), where the "kernels" are the ATen ops and "device" is the CPU.
Busy fraction: the union of the device's activity intervals (kernels, copies, memsets on any stream; on the CPU the
ops on any thread) over the window's wall time, so overlapping streams are not counted twice and it stays in
[0, 1]; the plain sum of kernel times is kept beside it (`kernel_time_sum_s`), which overlap can push above the wall
time.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TOP = 10


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def activities() -> list:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (microseconds)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def summarise(prof, wall_s: float, steps: int) -> dict:
    """Top kernels (ops on the CPU) by self time on the device that ran them, and the device-busy fraction. Read
    from the raw events (`prof.events()`): a kernel's self time is its duration, an op's on the CPU its duration
    less its children's."""
    from torch.autograd import DeviceType

    on_cuda = any(a.name == "CUDA" for a in activities())
    device = DeviceType.CUDA if on_cuda else DeviceType.CPU
    events = [e for e in prof.events() if e.device_type == device and not e.is_async]
    events = [e for e in events if not getattr(e, "is_user_annotation", False)]  # record_function ranges
    per_name: dict[str, list[float]] = {}
    for e in events:
        self_us = e.time_range.elapsed_us() if on_cuda else e.self_cpu_time_total
        calls_and_us = per_name.setdefault(e.name, [0, 0.0])
        calls_and_us[0] += 1
        calls_and_us[1] += self_us
    top = sorted(per_name.items(), key=lambda item: item[1][1], reverse=True)[:TOP]
    busy_us = union_us([(e.time_range.start, e.time_range.end) for e in events])
    return {
        "device": torch.cuda.get_device_name() if on_cuda else "cpu",
        "activities": [a.name for a in activities()],
        "steps": steps,
        "wall_s": wall_s,
        "step_s": wall_s / steps,
        "device_busy_s": busy_us / 1e6,
        "device_busy_fraction": min(1.0, busy_us / 1e6 / wall_s) if wall_s > 0 else None,
        "kernel_time_sum_s": sum(us for _, us in per_name.values()) / 1e6,
        "kernels_seen": len(per_name),
        "top_kernels": [
            {"name": name[:200], "self_s": us / 1e6, "calls": calls, "share_of_wall": us / 1e6 / wall_s}
            for name, (calls, us) in top
        ],
    }


# --------------------------------------------------------------------------- the floor


def profile_floor(dry_run: bool, out: Path) -> None:
    """The floor item's model, batch and step (eager), `profile_warmup` steps, then `profile_steps` profiled."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import floor_inputs
    from gpu_check_floor import plain_step
    from gpu_check_settings import DRY_RUN, GPU

    settings = DRY_RUN if dry_run else GPU
    model, batch = floor_inputs(settings)
    step = plain_step(model, settings.precision, backend=settings.compile_backend)
    for _ in range(settings.profile_warmup):
        step(*batch)
    from torch.profiler import profile

    with profile(activities=activities()) as prof:
        _sync()
        start = time.perf_counter()
        for _ in range(settings.profile_steps):
            step(*batch)
        _sync()
        wall = time.perf_counter() - start
    out.write_text(json.dumps(summarise(prof, wall, settings.profile_steps), indent=2))


# --------------------------------------------------------------------------- the recipe


def profile_window(start: int, steps: int, out: Path):
    """A TrainerCallback that profiles steps start+1 .. start+steps (end of step `start` to end of the last) and
    writes their summary from the first process."""
    from torch.profiler import profile
    from transformers import TrainerCallback

    class ProfileWindow(TrainerCallback):
        prof = None
        began = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == start:
                self.prof = profile(activities=activities())
                self.prof.start()
                _sync()
                self.began = time.perf_counter()
            elif self.prof is not None and state.global_step == start + steps:
                _sync()
                wall = time.perf_counter() - self.began
                self.prof.stop()
                if args.process_index == 0:
                    out.write_text(json.dumps(summarise(self.prof, wall, steps), indent=2))
                self.prof = None

    return ProfileWindow()


def profile_recipe(start: int, steps: int, out: Path, recipe: list[str]) -> None:
    import transformers

    original_init = transformers.Trainer.__init__

    def init_with_window(trainer, *args, **kwargs):
        original_init(trainer, *args, **kwargs)
        trainer.add_callback(profile_window(start, steps, out))

    transformers.Trainer.__init__ = init_with_window
    sys.argv = recipe
    sys.path.insert(0, str(Path(recipe[0]).resolve().parent))
    runpy.run_path(recipe[0], run_name="__main__")
    if not out.is_file():
        raise SystemExit(f"error: the run ended before step {start + steps}; no profile in {out}")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="The summary's JSON file.")
    parser.add_argument("--dry_run", action="store_true", help="The floor: the dry run's settings (CPU).")
    parser.add_argument("--start", type=int, default=10, help="Recipe: profile from the end of this step.")
    parser.add_argument("--steps", type=int, default=5, help="Recipe: steps profiled.")
    parser.add_argument("target", nargs="?", choices=["floor"], help="floor, or a recipe command after --.")
    args = parser.parse_args(argv)
    if (args.target == "floor") == bool(recipe):
        parser.error("give either `floor` or a recipe command after --")
    if recipe:
        profile_recipe(args.start, args.steps, Path(args.out), recipe)
    else:
        profile_floor(args.dry_run, Path(args.out))


if __name__ == "__main__":
    main()
