#!/usr/bin/env python
"""ViT-B/16 at 224 px in bf16 on one GPU: images/s, TFLOP/s and MFU for ZeRO 0/2/3, fast input path on and off.

On a GPU (targets on one H200: >= 50% MFU with ZeRO-0, the input path not the bottleneck, i.e. data wait < 5%):

    python benchmarks/gpu_vit_b16.py --output_dir outputs/bench-h200

On this project's CPU machines, the same grid end to end with a tiny preset (so the script is known to work):

    python benchmarks/gpu_vit_b16.py --cpu_smoke --output_dir outputs/bench-cpu

Method: each cell is one `recipes/train_vit.py` run in its own process (no launcher, 1 device) on the built-in
digits upscaled to the model size (no network needed), `--max_steps` steps of which the first `--warmup` are
excluded by the throughput report; figures come from each run's throughput.json. The whole grid (6 cells) is
sized to finish within 8 minutes on one H200.
"""

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cell_command(
    args, ds_config: str | None, input_path: str, out: str, launcher: list[str] | None = None
) -> list[str]:
    """One cell's recipe command. `ds_config` None: no DeepSpeed (the plain Trainer); `launcher`: what starts the
    recipe (default this Python, one process; benchmarks/gpu_check.py passes torchrun for FSDP2)."""
    cmd = [
        *(launcher or [sys.executable]),
        str(REPO / "recipes" / "train_vit.py"),
        "--output_dir",
        out,
        "--model_preset",
        args.model_preset,
        "--per_device_train_batch_size",
        str(args.batch_size),
        "--max_steps",
        str(args.steps),
        "--throughput_warmup_steps",
        str(args.warmup),
        "--input_path",
        input_path,
        *"--eval_strategy no --save_strategy no --report_to none --disable_tqdm true".split(),
        "--logging_steps",
        str(args.steps),
        "--dataloader_num_workers",
        str(args.workers),
        "--max_eval_samples",
        "64",
        "--learning_rate",
        "1e-4",
    ]
    if ds_config:
        cmd += ["--ds_config", str(REPO / "ds_configs" / ds_config)]
    if args.image_size:
        cmd += ["--image_size", str(args.image_size)]
    if args.bf16:
        cmd += ["--bf16", "true"]
    if not args.cpu_smoke:
        cmd += ["--optim", "adamw_torch_fused", "--dataloader_persistent_workers", "true"]
    return cmd


def read_cell(out: str) -> dict:
    """The figures of one finished run, from its throughput.json (the recipe's own report)."""
    # Imported here, not at the top: benchmarks/gpu_check.py imports this module before it has made sure the
    # package's dependencies (deepspeed, datasets) are installed, and the package's loader pulls them in.
    from hf_vit_scaling.throughput.schema import throughput_row

    row = throughput_row(os.path.join(out, "throughput.json"))
    kept = ("images_per_s", "tflops_per_device", "mfu", "peak_tflops", "peak_source", "data_wait_fraction")
    return dict(
        {key: row[key] for key in kept},
        step_time_s=row["step_time_mean_s"],
        memory_bytes=row["memory_max_bytes"],
        memory_kind=row["memory_kind"],
        memory_gib=row["memory_max_bytes"] / 2**30,
        device=row["device"],
        world_size=row["world_size"],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where results.csv, results.md and the runs go.")
    parser.add_argument("--cpu_smoke", action="store_true", help="Tiny preset, fp32, few steps: a CPU check.")
    parser.add_argument("--model_preset", default=None, help="Default vit-b-16 (vit-tiny-cpu with --cpu_smoke).")
    parser.add_argument("--image_size", type=int, default=None, help="Default: the preset's (16 with --cpu_smoke).")
    parser.add_argument("--batch_size", type=int, default=None, help="Per-device batch (default 256 GPU, 16 CPU).")
    parser.add_argument("--steps", type=int, default=None, help="Steps per cell (default 60 GPU, 12 CPU).")
    parser.add_argument("--warmup", type=int, default=None, help="Steps excluded (default 15 GPU, 2 CPU).")
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers (default 8 GPU, 0 CPU).")
    parser.add_argument("--stages", default="zero0,zero2,zero3", help="ds_configs to compare.")
    args = parser.parse_args()
    smoke = args.cpu_smoke
    args.model_preset = args.model_preset or ("vit-tiny-cpu" if smoke else "vit-b-16")
    args.image_size = args.image_size or (16 if smoke else None)
    args.batch_size = args.batch_size or (16 if smoke else 256)
    args.steps = args.steps or (12 if smoke else 60)
    args.warmup = args.warmup if args.warmup is not None else (2 if smoke else 15)
    args.workers = args.workers if args.workers is not None else (0 if smoke else 8)
    args.bf16 = not smoke
    os.makedirs(args.output_dir, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if smoke:
        env["DS_ACCELERATOR"] = "cpu"
    rows, start = [], time.time()
    for stage in args.stages.split(","):
        for input_path in ("device", "per_sample"):
            out = os.path.join(args.output_dir, f"{stage}-{input_path}")
            print(f"[{len(rows) + 1}/{2 * len(args.stages.split(','))}] {stage} input={input_path}", flush=True)
            proc = subprocess.run(
                cell_command(args, f"{stage}.json", input_path, out), capture_output=True, text=True, env=env
            )
            row = {"ds_config": stage, "input_path": input_path, "status": "ok" if proc.returncode == 0 else "failed"}
            if proc.returncode == 0:
                row.update(read_cell(out))
            else:
                row["error"] = proc.stderr.strip().splitlines()[-1][:200] if proc.stderr.strip() else "unknown"
            rows.append(row)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(os.path.join(args.output_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"{args.model_preset} at {args.image_size or 'preset'} px, batch {args.batch_size}, "
        f"{'bf16' if args.bf16 else 'fp32'}, {args.steps} steps ({args.warmup} warm-up excluded), "
        f"grid wall time {time.time() - start:.0f} s",
        "",
        "| ds_config | input path | images/s | TFLOP/s | MFU | data wait | peak mem GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['ds_config']} | {r['input_path']} | failed: {r.get('error')} | | | | |")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        wait = f"{r['data_wait_fraction']:.1%}" if r["data_wait_fraction"] is not None else "n/a"
        lines.append(
            f"| {r['ds_config']} | {r['input_path']} | {r['images_per_s']:.1f} | "
            f"{r['tflops_per_device']:.3g} | {mfu} | {wait} | {r['memory_gib']:.2f} |"
        )
    text = "\n".join(lines)
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
