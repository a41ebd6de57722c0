#!/usr/bin/env python
"""The same ZeRO-2 run named three ways: the recipe's `--ds_config ds_configs/zero2.json`, an accelerate config with
`distributed_type: DEEPSPEED` naming that file, and `accelerate launch --use_deepspeed --zero_stage 2`. Median step
time of each, measured side by side in one run.

    python benchmarks/engine_routes.py --rounds 3 --steps 60 --output benchmarks/results/engine_routes.json

Method: each route is a fresh 2-process run of the recipe (tiny preset at 16 px, batch 16 per process, fp32, 2 CPU
processes over gloo, one thread each), `--steps` optimizer steps; the routes run one after another in a round, in
another order each round (rotated), `--rounds` rounds. A run's figure is its throughput report's median step time
(compute + data wait of rank 0, the first `--warmup` steps excluded); a route's figure is the median over its
rounds, and its ratio is that over the `--ds_config` route's. Each run's report also says which engine it was
(`setup.engine`, `zero_stage`, `engine_route`), recorded beside the times.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO, child_env, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

from hf_vit_scaling.parallel.launch import accelerate_deepspeed_config, launch_command
from hf_vit_scaling.throughput.schema import load_throughput_report

ZERO2 = REPO / "ds_configs" / "zero2.json"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; each runs every route once.")
    parser.add_argument("--steps", type=int, default=60, help="Optimizer steps per run.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps the throughput report leaves out per run.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    return parser.parse_args()


def free_port() -> int:
    from torch.distributed.elastic.utils.distributed import get_free_port

    return get_free_port()


def route_launchers(folder: Path) -> dict[str, list[str]]:
    """{route: argv up to the script and its engine flags}; the script's place is marked by None."""
    accelerate = str(Path(sys.executable).parent / "accelerate")
    config = folder / "accelerate_deepspeed.yaml"
    config.write_text(accelerate_deepspeed_config(str(ZERO2), free_port(), 2), encoding="utf-8")
    return {
        "ds_config": [*launch_command("accelerate", 2, free_port()), None, "--ds_config", str(ZERO2)],
        "accelerate_config_file": [accelerate, "launch", "--config_file", str(config), None],
        "accelerate_use_deepspeed": [
            accelerate,
            "launch",
            "--use_deepspeed",
            "--zero_stage",
            "2",
            "--num_processes",
            "2",
            "--main_process_port",
            str(free_port()),
            None,
        ],  # fmt: skip
    }


def one_run(argv: list, out: Path, args) -> dict:
    """The run's median step time (s) and what it says it was."""
    recipe = [str(REPO / "recipes" / "train_vit.py"), "--output_dir", str(out)]
    tiny = (
        "--model_preset vit-tiny-cpu --image_size 16 --per_device_train_batch_size 16 --learning_rate 2e-3 "
        "--warmup_steps 0 --report_to none --save_strategy no --eval_strategy no --disable_tqdm true --seed 0 "
        f"--dataloader_num_workers 0 --peak_tflops 0.1 --max_steps {args.steps} --throughput_warmup_steps "
        f"{args.warmup} --logging_steps {args.steps}"
    ).split()
    cmd = [part for item in argv for part in (recipe if item is None else [item])] + tiny
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(1), cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    report = load_throughput_report(str(out / "throughput.json"))
    setup = report["setup"]
    return {
        "median_step_s": report["step_time_s"]["median"],
        "engine": setup["engine"],
        "zero_stage": setup["zero_stage"],
        "engine_route": setup["engine_route"],
    }


def main() -> None:
    args = parse()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            launchers = route_launchers(Path(tmp))
            names = list(launchers)
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for name in order:
                out = Path(tmp) / f"{name}-{round_index}"
                runs.setdefault(name, []).append(one_run(launchers[name], out, args))
                print(f"round {round_index + 1}: {name} {runs[name][-1]['median_step_s']:.4f} s", file=sys.stderr)
    medians = {name: statistics.median(r["median_step_s"] for r in rs) for name, rs in runs.items()}
    result = {
        "setup": {
            "model": "vit-tiny-cpu at 16 px",
            "processes": 2,
            "batch_per_process": 16,
            "precision": "fp32",
            "zero_stage": 2,
            "steps": args.steps,
            "warmup_steps": args.warmup,
            "rounds": args.rounds,
        },
        "median_step_ms": {name: round(1000 * value, 2) for name, value in medians.items()},
        "ratio_to_ds_config": {name: round(value / medians["ds_config"], 3) for name, value in medians.items()},
        "runs": runs,
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
