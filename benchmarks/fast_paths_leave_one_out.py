#!/usr/bin/env python
"""What each of DeepSpeed's fast paths saves: every ZeRO stage's run with all of them on against the same run with
one left out (`HF_VIT_SCALING_DEEPSPEED_FAST_PATHS=-name`), on this machine's CPU, measured side by side.

    python benchmarks/fast_paths_leave_one_out.py --rounds 3 --output benchmarks/results/fast_paths_leave_one_out.json

Arms and method are `engine_overhead.py`'s (the recipe on the digits, tiny preset at 16 px, a global batch of 32,
`--steps` timed steps after `--warmup`, the throughput report's median step time; the arms of one stage and world
size started together and taking turns `--turn_steps` steps at a time, the order reversed every other round). Per
ZeRO stage and world size (1 and 2 processes) the arms are the stage with every fast path on and, for each path that
can act there, the stage without it (a path of parts leaves out its other parts too; leaving out
`zero2_reduce_at_epilogue` leaves out `zero2_no_gradient_hooks`, which needs it). A path's figure is the median over
rounds of (step time without it - step time with all) / step time with all: the share of the step it saves.
"""

import argparse
import statistics
import sys

import engine_overhead as overhead  # benchmarks/engine_overhead.py (scripts run as benchmarks/<name>.py)
from _common import report_result

from hf_vit_scaling.parallel.fast_paths.registry import ENV_SWITCH

ZERO12 = ["zero12_grad_norm", "zero12_bit16_views", "zero12_file_at_once"]
# Where each path can act: a world of one for the single-rank reductions, several processes for the grouped norms'
# and the weights' one collective (zero3_one_param_gather also gathers ZeRO-3's persistent parameters on one).
PATHS = {
    (1, 1): [*ZERO12, "zero12_single_rank_reduce"],
    (1, 2): [*ZERO12, "zero12_grouped_norm", "zero12_one_param_gather"],
    (2, 1): [*ZERO12, "zero12_single_rank_reduce", "zero2_reduce_at_epilogue", "zero2_no_gradient_hooks"],
    (2, 2): [*ZERO12, "zero12_grouped_norm", "zero12_one_param_gather", "zero2_reduce_at_epilogue",
             "zero2_no_gradient_hooks"],
    (3, 1): ["zero3_grad_norm", "zero3_single_rank_reduce_scatter", "zero3_one_param_gather",
             "zero3_whole_module_hooks", "zero3_whole_through_step", "cpu_numa_cores_once"],
    (3, 2): ["zero3_grad_norm", "zero3_one_param_gather", "zero3_whole_module_hooks",
             "zero3_whole_through_step", "cpu_numa_cores_once"],
}  # fmt: skip


def arm_env(args, name: str, nproc: int) -> dict:
    """engine_overhead's environment, with the switch leaving out the arm's path (`zero2-without-<path>`)."""
    env = overhead_arm_env(args, name, nproc)
    if "-without-" in name:
        env[ENV_SWITCH] = "-" + name.split("-without-", 1)[1]
    return env


overhead_arm_env = overhead.arm_env
overhead.arm_env = arm_env  # run_together starts every arm through it


def arm_names(stage: int, nproc: int) -> list[str]:
    names = [f"zero{stage}"] + [f"zero{stage}-without-{path}" for path in PATHS[(stage, nproc)]]
    for name in names[1:]:
        overhead.CONFIGS[name] = f"zero{stage}.json"
    return names


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; every arm runs once per round.")
    parser.add_argument("--steps", type=int, default=60, help="Timed optimizer steps per arm, after the warm-up.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps dropped before the timed ones.")
    parser.add_argument("--turn_steps", type=int, default=5, help="Steps an arm runs per turn.")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], choices=[1, 2], help="World sizes.")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3], help="ZeRO stages.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    return parser.parse_args()


def main() -> None:
    args = parse()
    arm_args, _ = overhead.parse(["--steps", str(args.steps), "--warmup", str(args.warmup), "--turn_steps",
                                  str(args.turn_steps)])  # fmt: skip
    rounds = []
    for index in range(args.rounds):
        record = {}
        for stage in args.stages:
            for nproc in args.processes:
                names = arm_names(stage, nproc)
                names = names if index % 2 == 0 else names[::-1]
                together = overhead.run_together(arm_args, names, nproc)
                record.update({f"{name}@{nproc}": step_s for name, step_s in together.items()})
                base = together[f"zero{stage}"]
                print(f"round {index + 1} ZeRO-{stage} x{nproc}: all on {base * 1000:.1f} ms; " + ", ".join(
                    f"{name.split('-without-')[1]} {(together[name] / base - 1):+.1%}"
                    for name in names if "-without-" in name
                ), file=sys.stderr)  # fmt: skip
        rounds.append(record)
    saves = {}
    for stage in args.stages:
        for nproc in args.processes:
            base = f"zero{stage}@{nproc}"
            for path in PATHS[(stage, nproc)]:
                key = f"zero{stage}-without-{path}@{nproc}"
                saves.setdefault(path, {})[f"zero{stage}@{nproc}"] = statistics.median(
                    r[key] / r[base] - 1 for r in rounds
                )
    largest = {path: max(by_setup.values()) for path, by_setup in saves.items()}
    setup = {"model_preset": "vit-tiny-cpu", "image_size": 16, "global_batch": 32, "precision": "fp32",
             "steps": args.steps, "warmup_dropped": args.warmup, "rounds": args.rounds,
             "timed": "throughput.json step_time_s.median (rank 0)",
             "order": f"the arms of a stage and world size started together, taking turns {args.turn_steps} steps "
                      "at a time, the order reversed every other round"}  # fmt: skip
    report_result(
        {
            "setup": setup,
            "saved_fraction_of_step": saves,
            "largest_saved_fraction": largest,
            "under_2_percent_everywhere": sorted(path for path, value in largest.items() if value < 0.02),
            "rounds": rounds,
        },
        args.output,
    )


if __name__ == "__main__":
    main()
