#!/usr/bin/env python
"""Straggler benchmark: 2 processes, rank 1 slowed 2x (simulated); naive equal batches vs balanced batches.

    python benchmarks/hetero_balance.py --epochs 15 --seeds 0,1,2 --output benchmarks/results/hetero_balance.json

Setup: plain DDP over gloo, 2 processes x 1 thread (torchrun, OMP_NUM_THREADS=1), vit-tiny-cpu at 32 px, global
batch 128 (64 per rank when equal), built-in digits, `--simulate_slow_ranks 1:2.0` (rank 1 sleeps so that its
compute takes 2x). Arms, each a separate launched run:
- naive: equal micro-batches (32 + 32);
- balanced: `--balance_batches calibrate` (a short timing at start sets the per-rank micro-batches);
- ideal: the sum of what each rank does alone: one process at the global batch per step unslowed + one process
  slowed 2x (each pinned to one core).
Method: images/s from each run's throughput report (first 5 steps excluded); held-out top-1 accuracy after the same
number of epochs (= same samples), over `--seeds`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

from hf_vit_scaling.throughput.schema import load_throughput_report

REPO = Path(__file__).resolve().parents[1]
COMMON = [
    "--model_preset",
    "vit-tiny-cpu",
    "--image_size",
    "32",
    "--crop_scale_min",
    "0.5",
    "--horizontal_flip",
    "false",
    "--learning_rate",
    "1e-3",
    "--weight_decay",
    "0.05",
    "--warmup_steps",
    "20",
    *"--eval_strategy no --save_strategy no --report_to none --disable_tqdm true".split(),
    "--logging_steps",
    "50",
]


def launch(nproc: int, args: list[str], out: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    if nproc > 1:
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", str(nproc), "--master_port", "29777"]
    else:
        cmd = ["taskset", "-c", "0", sys.executable]
    subprocess.run(
        cmd + [str(REPO / "recipes" / "train_vit.py"), "--output_dir", out, *COMMON, *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    report = load_throughput_report(os.path.join(out, "throughput.json"))
    with open(os.path.join(out, "all_results.json")) as f:
        results = json.load(f)
    return {
        "images_per_s": report["throughput"]["images_per_s"],
        "eval_accuracy": results.get("eval_accuracy"),
        "rank_batches": report["setup"]["rank_batches"],
        "sync_wait_s": [r["est_sync_wait_s"] for r in report["ranks"]["per_rank"]],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8, help="Training epochs for the naive/balanced arms.")
    parser.add_argument("--seeds", default="0,1,2", help="Seeds, comma-separated.")
    parser.add_argument("--per_device_batch", type=int, default=64, help="Micro-batch per rank when equal.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {"naive": [], "balanced": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for arm, extra in (("naive", []), ("balanced", ["--balance_batches", "calibrate"])):
                out = os.path.join(tmp, f"{arm}-{seed}")
                runs[arm].append(
                    launch(
                        2,
                        [
                            "--seed",
                            str(seed),
                            "--num_train_epochs",
                            str(args.epochs),
                            "--per_device_train_batch_size",
                            str(args.per_device_batch),
                            "--simulate_slow_ranks",
                            "1:2.0",
                            *extra,
                        ],
                        out,
                    )
                )
                print(arm, seed, runs[arm][-1], flush=True)
        alone = {}
        for tag, extra in (("fast", []), ("slow", ["--simulate_slow_ranks", "0:2.0"])):
            alone[tag] = launch(
                1,
                ["--max_steps", "60", "--per_device_train_batch_size", str(2 * args.per_device_batch), *extra],
                os.path.join(tmp, f"alone-{tag}"),
            )["images_per_s"]
    mean = {arm: statistics.fmean(r["images_per_s"] for r in rs) for arm, rs in runs.items()}
    ideal = alone["fast"] + alone["slow"]
    result = {
        "setup": "2 processes x 1 thread, plain DDP (gloo), vit-tiny-cpu 32 px, global batch "
        f"{2 * args.per_device_batch}, "
        "rank 1 slowed 2x "
        f"(simulated), {args.epochs} epochs of digits, seeds {seeds}",
        "images_per_s": {**mean, "ideal": ideal, "alone_fast": alone["fast"], "alone_slow": alone["slow"]},
        "balanced_over_naive": mean["balanced"] / mean["naive"],
        "balanced_over_ideal": mean["balanced"] / ideal,
        "eval_accuracy": {arm: [r["eval_accuracy"] for r in rs] for arm, rs in runs.items()},
        "rank_batches_balanced": [r["rank_batches"] for r in runs["balanced"]],
        "runs": runs,
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
