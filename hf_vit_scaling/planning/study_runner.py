"""recipes/scaling_study.py's work: `StudyArguments`, the grid of cells (`build_grid`), each cell's launched command
(`cell_command`, through `parallel/launch.py`), running a cell and reading its row (`run_cell`, `row_from_run`), and
the report (`write_report`: results.csv, report.md, plots). The study runs from a checkout: each cell launches
recipes/train_vit.py beside this package."""

import csv
import json
import os
import platform
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_vit_scaling.arguments.field_checks import require_in_range
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.launch import launch_command
from hf_vit_scaling.planning.studies import (
    RESULT_FIELDS,
    STUDY_COLUMNS,
    add_scaling_columns,
    markdown_table,
    plot_study,
)
from hf_vit_scaling.throughput.schema import REPORT_FILENAME, throughput_row

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "train_vit.py"
STUDIES = ("batch", "accumulation", "strong", "weak", "zero")


@dataclass
class StudyArguments:
    study: str = field(metadata={"help": "Which experiment: " + ", ".join(STUDIES) + ".", "choices": list(STUDIES)})
    output_dir: str = field(metadata={"help": "Folder for results.csv, report.md, plots and runs/<cell>/."})
    processes: str = field(default="1,2", metadata={"help": "Processes per node to try, comma-separated."})
    batch_sizes: str = field(
        default="16,32,64,128,256", metadata={"help": "Per-device batch sizes for --study batch (the study: 16-256)."}
    )
    accumulation_steps: str = field(
        default="1,2,4,8", metadata={"help": "Accumulation steps for --study accumulation."}
    )
    per_device_batch_size: int = field(default=32, metadata={"help": "Per-device batch (weak, zero, accumulation)."})
    global_batch_size: int = field(default=64, metadata={"help": "Global batch held fixed in --study strong."})
    max_per_device_batch: int = field(
        default=256, metadata={"help": "--study strong: above this per-device batch, accumulate instead (memory)."}
    )
    weak_fraction_per_process: float = field(
        default=0.1, metadata={"help": "Share of the training data per process in --study weak (the study: 0.1)."}
    )
    ds_configs: str = field(
        default="zero0",
        metadata={
            "help": "Engines, comma-separated: ds_configs/ names, fsdp_configs/ names (FSDP2, 2+ processes only) or "
            "'none' (plain Trainer). --study zero default: zero0,zero1,zero2,zero2_offload,zero3,zero3_offload,"
            "fsdp2,fsdp2_offload."
        },
    )
    simulate_slow_ranks: str = field(
        default="",
        metadata={
            "help": "Heterogeneity dimension: ';'-separated --simulate_slow_ranks values, 'none' "
            "for an unslowed cell, e.g. 'none;1:2.0'. Default: off."
        },
    )
    launcher: str = field(
        default="torchrun", metadata={"help": "torchrun or accelerate.", "choices": ["torchrun", "accelerate"]}
    )
    threads_per_process: int = field(default=1, metadata={"help": "OMP_NUM_THREADS for every process."})
    pin_cores: bool = field(
        default=True,
        metadata={
            "help": "Pin each run to its first N x threads cores (taskset), "
            "so 1- and N-process runs get fair CPU shares."
        },
    )
    nnodes: int = field(default=1, metadata={"help": "Nodes per run (multi-node: run this script on every node)."})
    node_rank: int = field(default=0, metadata={"help": "This node's rank; only node 0 writes results."})
    master_addr: str = field(default="127.0.0.1", metadata={"help": "Address of node 0 (multi-node)."})
    master_port: int = field(default=29400, metadata={"help": "Base port; cell k uses master_port + k."})
    timeout_s: int = field(default=1800, metadata={"help": "Per-run time limit; a run past it is recorded as failed."})

    def __post_init__(self):
        require_in_range(vars(self), {
            "per_device_batch_size": (1, None, False, 32), "global_batch_size": (1, None, False, 64),
            "max_per_device_batch": (1, None, False, 256), "threads_per_process": (1, None, False, 1),
            "nnodes": (1, None, False, 1), "node_rank": (0, None, False, 0), "master_port": (1, None, False, 29400),
            "timeout_s": (1, None, False, 1800),
        })  # fmt: skip
        if not 0.0 < self.weak_fraction_per_process <= 1.0:
            raise UserInputError(
                f"--weak_fraction_per_process must be in (0, 1], got {self.weak_fraction_per_process}. "
                "Fix: e.g. 0.1 (the study's share per process)."
            )
        for flag in ("processes", "batch_sizes", "accumulation_steps"):
            check_positive_int_list(flag, getattr(self, flag))
        check_engine_names(self.ds_configs)
        for spec in self.simulate_slow_ranks.split(";"):
            if spec.strip() not in ("", "none"):
                from hf_vit_scaling.parallel.hetero import parse_slow_ranks  # torch: only when a cell is slowed

                parse_slow_ranks(spec.strip())


def check_positive_int_list(flag: str, text: str) -> None:
    """`--flag` is comma-separated whole numbers >= 1 ('1,2,4'): each is a cell of the grid, checked before any run
    starts (a bad one would otherwise be a traceback, or a cell launched with batch 0)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(item.isdigit() and int(item) >= 1 for item in items):
        raise UserInputError(f"--{flag} {text!r} is not comma-separated whole numbers >= 1. Fix: e.g. --{flag} 1,2,4.")


def engine_names() -> list[str]:
    """The names --ds_configs takes: the configs in ds_configs/ and fsdp_configs/, and none (the plain Trainer)."""
    folders = (RECIPE.parents[1] / "ds_configs", RECIPE.parents[1] / "fsdp_configs")
    return ["none", *sorted(path.stem for folder in folders for path in folder.glob("*.json"))]


def check_engine_names(text: str) -> None:
    """Each comma-separated name of --ds_configs is a config of ds_configs/ or fsdp_configs/, or none: an unknown one
    would fail every cell it is part of, after the cells before it ran."""
    known = engine_names()
    unknown = [name for name in text.split(",") if name and name not in known]
    if unknown or not text.strip(","):
        raise UserInputError(
            f"--ds_configs {text!r}: {', '.join(unknown) or 'no name'} is not an engine. Fix: use names from "
            f"{', '.join(known)}."
        )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _once(values: list, flag: str, text: str) -> list:
    """`values` (parsed from `flag`'s `text`), refused when one repeats: each value is a cell, with its own run folder
    and row. Two cells of one name would be one folder: node 0 skips the second as finished, the other nodes launch
    it again and wait for a rendezvous that never comes."""
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise SystemExit(
            f"error: {flag} {text} lists {', '.join(repeated)} more than once. Fix: list each value once."
        )
    return values


def is_fsdp(name: str) -> bool:
    return name.startswith("fsdp")


def engine_flags(name: str) -> list[str]:
    """The recipe's flags for one engine name of --ds_configs."""
    if name == "none":
        return []
    if is_fsdp(name):
        return ["--fsdp", "--fsdp_config", str(RECIPE.parents[1] / "fsdp_configs" / f"{name}.json")]
    return ["--ds_config", str(RECIPE.parents[1] / "ds_configs" / f"{name}.json")]


def build_grid(a: StudyArguments) -> list[dict]:
    """One dict per run: processes, per-device batch, accumulation, ds_config, slow ranks, data fraction."""
    configs = _once([c for c in a.ds_configs.split(",") if c], "--ds_configs", a.ds_configs)
    if a.study == "zero" and a.ds_configs == "zero0":
        configs = ["zero0", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp2", "fsdp2_offload"]
    slow = _once(
        [s.strip() for s in a.simulate_slow_ranks.split(";") if s.strip()],
        "--simulate_slow_ranks",
        a.simulate_slow_ranks,
    )
    slow = [("" if s == "none" else s) for s in slow] or [""]
    batch_sizes = _once(_ints(a.batch_sizes), "--batch_sizes", a.batch_sizes)
    accumulation_steps = _once(_ints(a.accumulation_steps), "--accumulation_steps", a.accumulation_steps)
    grid = []
    for n in _once(_ints(a.processes), "--processes", a.processes):
        world = n * a.nnodes
        for ds in configs:
            if is_fsdp(ds) and world < 2:
                continue  # FSDP2 shards over processes: the recipe refuses it on one
            for sl in slow:
                base = dict(
                    processes=n,
                    world=world,
                    ds_config=ds,
                    slow=sl,
                    grad_accum=1,
                    per_device_batch=a.per_device_batch_size,
                    fraction=None,
                )
                if a.study == "batch":
                    grid += [dict(base, per_device_batch=b) for b in batch_sizes]
                elif a.study == "accumulation":
                    grid += [dict(base, grad_accum=k) for k in accumulation_steps]
                elif a.study == "strong":
                    if a.global_batch_size % world:
                        raise SystemExit(
                            f"error: --global_batch_size {a.global_batch_size} does not divide over "
                            f"{world} processes. Fix: pick a multiple of every process count."
                        )
                    per_device, accum = a.global_batch_size // world, 1
                    while per_device > a.max_per_device_batch and per_device % 2 == 0:
                        per_device, accum = per_device // 2, accum * 2  # same global batch, less memory
                    grid.append(dict(base, per_device_batch=per_device, grad_accum=accum))
                elif a.study == "weak":
                    grid.append(dict(base, fraction=min(1.0, a.weak_fraction_per_process * world)))
                else:
                    grid.append(base)
    for cell in grid:
        cell["global_batch"] = cell["per_device_batch"] * cell["grad_accum"] * cell["world"]
        slow_tag = f"-slow{cell['slow'].replace(':', 'x').replace(',', '_')}" if cell["slow"] else ""
        cell["name"] = (
            f"{a.study}-n{cell['processes']}x{a.nnodes}-b{cell['per_device_batch']}-a{cell['grad_accum']}"
            f"-{cell['ds_config']}{slow_tag}"
        )
    return grid


def count_train_images(extra: list[str]) -> int:
    """Training-split size for the data the extra arguments name (before weak-scaling subsampling)."""
    from hf_vit_scaling import DataArguments, load_image_classification_data

    data_args, _ = HfArgumentParser(DataArguments).parse_known_args(extra)
    return len(load_image_classification_data(data_args).splits["train"])


def cell_command(a: StudyArguments, cell: dict, index: int, run_dir: str, extra: list[str], n_train: int) -> list:
    n, threads = cell["processes"], a.threads_per_process
    port = a.master_port + index
    launch = launch_command(a.launcher, n, port, a.nnodes, a.node_rank, a.master_addr)
    pin = ["taskset", "-c", f"0-{n * threads - 1}"] if a.pin_cores and n * threads <= (os.cpu_count() or 1) else []
    args = [
        "--output_dir",
        run_dir,
        "--per_device_train_batch_size",
        str(cell["per_device_batch"]),
        "--gradient_accumulation_steps",
        str(cell["grad_accum"]),
        *"--save_strategy no --report_to none --disable_tqdm true".split(),
    ]
    args += engine_flags(cell["ds_config"])
    if cell["fraction"] is not None:
        args += ["--max_train_samples", str(max(1, int(cell["fraction"] * n_train)))]
    if cell["slow"]:
        args += ["--simulate_slow_ranks", cell["slow"]]
    return pin + launch + [str(RECIPE)] + args + extra


def row_from_run(cell: dict, a: StudyArguments, run_dir: str) -> dict:
    """results.csv's row of a finished cell: its throughput.json's figures (`throughput.schema.throughput_row`) and
    its all_results.json's sample count and accuracy."""
    row = throughput_row(os.path.join(run_dir, REPORT_FILENAME))
    with open(os.path.join(run_dir, "all_results.json")) as f:
        results = json.load(f)
    train_samples, ips = results.get("train_samples"), row["images_per_s"]
    return dict(
        status="ok",
        reason="",
        **{key: value for key, value in row.items() if key in RESULT_FIELDS},  # the columns results.csv has
        train_samples=train_samples,
        # Epoch time from the measured rate (warm-up excluded): training images / images per second.
        epoch_time_s=train_samples / ips if ips and train_samples else None,
        eval_accuracy=results.get("eval_accuracy"),
    )


def failure_reason(proc: subprocess.CompletedProcess | None, timed_out: bool, timeout: int) -> str:
    if timed_out:
        return f"timeout after {timeout} s"
    text = (proc.stderr or "") + (proc.stdout or "")
    lines = [
        line.split("]:", 1)[-1].strip() if line.startswith("[rank") else line.strip() for line in text.splitlines()
    ]
    ours = [line for line in lines if line.startswith("error:")]  # the recipe's own message names flag and fix
    if ours:
        return ours[0][:300]
    for marker in ("out of memory", "OutOfMemoryError", "Killed"):
        if marker in text:
            return f"out of memory ({marker})"
    errors = [line for line in lines if "Error" in line and "ChildFailedError" not in line]
    return (errors[-1] if errors else f"exit code {proc.returncode}")[:300]


def launch_log(node_rank: int) -> str:
    """This node's launcher log in a cell's run folder. Every node runs every cell into the same folder (a shared
    file system), so one name for all would keep only the last node's output: often not the node that failed."""
    return f"launch.node{node_rank}.log"


def launch_logs(cell_name: str, nnodes: int) -> str:
    """Every node's log of a cell, relative to --output_dir; the brace form expands in bash (`tail runs/...`)."""
    nodes = "0" if nnodes == 1 else f"{{0..{nnodes - 1}}}"
    return f"runs/{cell_name}/launch.node{nodes}.log"


def run_cell(a, cell, index, total, extra, n_train) -> dict:
    run_dir = os.path.join(a.output_dir, "runs", cell["name"])
    base = dict(
        cell=cell["name"],
        study=a.study,
        processes=cell["processes"],
        per_device_batch=cell["per_device_batch"],
        grad_accum=cell["grad_accum"],
        global_batch=cell["global_batch"],
        ds_config=cell["ds_config"],
        simulated_slow_ranks=cell["slow"],
    )
    done = os.path.join(run_dir, REPORT_FILENAME)
    if a.node_rank == 0 and os.path.isfile(done) and os.path.isfile(os.path.join(run_dir, "all_results.json")):
        print(f"[{index + 1}/{total}] {cell['name']}: finished earlier, skipped", flush=True)
        return dict(base, **row_from_run(cell, a, run_dir), wall_s=None)
    cmd = cell_command(a, cell, index, run_dir, extra, n_train)
    print(
        f"[{index + 1}/{total}] {cell['name']}: {cell['processes']} process(es) x {a.nnodes} node(s), batch "
        f"{cell['per_device_batch']} x accum {cell['grad_accum']} = {cell['global_batch']}, {cell['ds_config']}",
        flush=True,
    )
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads_per_process))
    start, proc, timed_out = time.time(), None, False
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=a.timeout_s, env=env)
    except subprocess.TimeoutExpired:
        timed_out = True
    wall = time.time() - start
    with open(os.path.join(run_dir, launch_log(a.node_rank)), "w") as f:
        f.write(shlex.join(str(c) for c in cmd) + "\n")
        if proc is not None:
            f.write(proc.stdout + "\n" + proc.stderr)
    if a.node_rank != 0:
        return dict(base, status="ok" if proc is not None and proc.returncode == 0 else "failed", wall_s=wall)
    if proc is not None and proc.returncode == 0 and os.path.isfile(done):
        return dict(base, **row_from_run(cell, a, run_dir), wall_s=wall)
    reason = failure_reason(proc, timed_out, a.timeout_s)
    print(f"    failed: {reason}", flush=True)
    return dict(base, status="failed", reason=reason, wall_s=wall)


def caption(a: StudyArguments, rows: list[dict], extra: list[str]) -> str:
    import torch
    import transformers

    try:
        import deepspeed

        ds_version = deepspeed.__version__
    except ImportError:
        ds_version = "n/a"
    return (
        f"Hardware: {platform.node()}, {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"{a.threads_per_process} thread(s) per process{', pinned' if a.pin_cores else ''}, {a.nnodes} node(s). "
        f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, deepspeed {ds_version}. "
        f"Engine: {a.ds_configs if a.study != 'zero' else 'per row'}. "
        f"Run arguments: {' '.join(extra) or '(defaults)'}. "
        "Method: each cell is a separate launched run; images/s from its throughput report (warm-up steps "
        "excluded); epoch time = training images / images/s."
    )


def write_report(a: StudyArguments, rows: list[dict], extra: list[str]) -> None:
    kind = a.study
    rows = add_scaling_columns(rows, kind)
    for row in rows:
        mem = row.get("memory_max_bytes")
        row["memory_mib"] = mem / 2**20 if isinstance(mem, (int, float)) else None
    with open(os.path.join(a.output_dir, "results.csv"), "w", newline="") as f:
        fields = RESULT_FIELDS + ["speedup", "efficiency"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    cap = caption(a, rows, extra)
    plot = plot_study(rows, kind, os.path.join(a.output_dir, f"{kind}.png"), cap)
    definition = {
        "strong": "Strong scaling: fixed global batch and data; efficiency = T1 / (N x TN).",
        "weak": "Weak scaling: fixed per-device batch, data grows with N; efficiency = T1 / TN.",
        "batch": "Batch-size sweep: speedup and efficiency against 1 process at the same per-device batch.",
        "accumulation": "Accumulation sweep: images/s as accumulation steps grow.",
        "zero": "Engine comparison (ZeRO 0-3 and offload, FSDP2) at fixed settings: throughput and peak memory per "
        "device.",
    }[kind]
    failed = [r for r in rows if r.get("status") != "ok"]
    text = [f"# {kind} study", "", definition, "", markdown_table(rows, STUDY_COLUMNS), ""]
    if failed:
        text += ["Failed runs (each node's launcher output in its log):", ""]
        text += [f"- `{r['cell']}`: {r.get('reason')} (`{launch_logs(r['cell'], a.nnodes)}`)" for r in failed] + [""]
    if plot:
        text += [f"![{kind}]({os.path.basename(plot)})", ""]
    text += [f"*{cap}*", ""]
    with open(os.path.join(a.output_dir, "report.md"), "w") as f:
        f.write("\n".join(text))
