"""The one description of `throughput.json`: its sections, keys and what each means; and its loader.

docs/throughput.md is checked against `REPORT_SCHEMA` by the tests, so the page and the file cannot drift apart.
"""

import json

SCHEMA_VERSION = 7
REPORT_FILENAME = "throughput.json"

REPORT_SCHEMA: dict[str, dict[str, str]] = {
    "setup": {
        "engine": "deepspeed, fsdp (FSDP2) or trainer (the plain Trainer: DDP with several processes)",
        "engine_route": "how the engine was named: a flag (--ds_config FILE, --deepspeed FILE, --fsdp), accelerate's "
        "DeepSpeed or FSDP plugin (its config or launch flags), or none",
        "world_size": "processes in the run",
        "num_nodes": "distinct nodes (host + launcher node rank)",
        "per_device_train_batch_size": "micro-batch per process",
        "gradient_accumulation_steps": "micro-batches per optimizer step",
        "global_batch_size": "per-device batch x accumulation x world / sequence-parallel size",
        "zero_stage": "ZeRO stage, null without DeepSpeed",
        "offload": "offloaded states and their device, e.g. {optimizer: cpu}",
        "deepspeed_resolved": "{dotted key: {value, reason}}: every DeepSpeed value the project set (bucket sizes, "
        "ZeRO-3 persistence and leaf modules, timers, the scaled lr, ...); {} without DeepSpeed",
        "deepspeed_fast_paths": "{name: on, or why off}: DeepSpeed ZeRO per-tensor loops replaced by exact "
        "equivalents (hf_vit_scaling/parallel/fast_paths/registry.py), as installed; {} without DeepSpeed",
        "deepspeed_fast_paths_ran": "{name: times its own code ran in the measured steps (a path that acts when the "
        "engine is built: since then)}: the installed paths whose conditions held; {} without DeepSpeed",
        "precision": "fp32, bf16, fp16 or tf32",
        "image_size": "input side in pixels",
        "patch_size": "patch side in pixels (null for a CNN)",
        "tokens_per_image": "(image / patch)^2 + 1 (CLS), + 2 with a distillation token; null for a CNN",
        "num_parameters": "model parameters (full count under ZeRO-3)",
        "devices": "device names",
        "hostnames": "host names",
        "versions": "torch, transformers, deepspeed",
        "simulated_slow_ranks": "{rank: factor}; a SIMULATION when non-empty",
        "rank_batches": "per-rank micro-batches when balanced, else null",
        "sequence_parallel_size": "N ranks share each image",
        "tokens_per_rank": "ceil(tokens_per_image / N); null for a CNN",
    },
    "throughput": {
        "images_per_s": "images over the measured steps / the slowest rank's measured time",
        "images_per_s_per_device": "images_per_s / world size",
        "images_measured": "images that entered training forwards after warm-up (each image once)",
        "steps_measured": "optimizer steps after warm-up",
        "warmup_steps": "optimizer steps excluded at the start",
        "measured_time_s": "the slowest rank's compute + data wait over the measured steps",
        "nominal_images_per_step": "per-device batch x accumulation x world / N",
    },
    "step_time_s": {
        "mean": "mean step time (compute + data wait) of rank 0",
        "median": "median step time of rank 0",
        "p90": "90th percentile step time of rank 0",
        "compute_mean": "on_step_begin -> on_step_end: forward, backward, optimizer",
        "data_wait_mean": "previous on_step_end -> on_step_begin (eval/save intervals excluded)",
        "data_wait_fraction": "data_wait_mean / mean",
        "est_sync_and_optimizer_mean": "compute - input hooks - 3 x forward: gradient communication, optimizer, "
        "ZeRO gathers; null when negative (backward cheaper than 2 x forward)",
    },
    "flops": {
        "forward_macs_per_image": "the student's forward multiply-accumulates per image (ViT formula, or counted "
        "by FlopCounterMode for a CNN)",
        "train_flops_per_image": "the student's 3 x 2 x forward MACs (Kaplan et al. 2020)",
        "teacher_forward_flops_per_image": "a distillation teacher's forward FLOPs per image at the run's image "
        "size (no backward); null without a teacher",
        "teacher_flops_fraction": "teacher forward FLOPs / (train FLOPs + teacher forward FLOPs); null without a "
        "teacher",
        "achieved_tflops_per_device": "images/s x (train FLOPs + teacher forward FLOPs) / world / 1e12",
        "achieved_tflops_total": "images/s x (train FLOPs + teacher forward FLOPs) / 1e12",
        "peak_tflops_per_device": "dense peak for the precision used",
        "peak_source": "user, table, matmul-probe or none",
        "mfu": "achieved / peak per device",
    },
    "memory": {
        "per_rank": "[{rank, allocated_peak_bytes, reserved_peak_bytes, rss_peak_bytes}]",
        "kind": "allocated_peak_bytes on CUDA, rss_peak_bytes elsewhere",
        "max_bytes": "largest per-rank peak of that kind",
    },
    "ranks": {
        "per_rank": "[{rank, hostname, device, images, step_compute_mean_s, forward_mean_s, input_hooks_mean_s, "
        "data_wait_mean_s, est_own_work_mean_s, est_sync_wait_s, est_sync_wait_fraction}]",
        "fastest_rank": "rank with the least own work per step",
        "slowest_rank": "rank with the most own work per step",
        "spread": "slowest / fastest own work",
        "est_sync_wait_s_total": "seconds all ranks waited at gradient synchronisation",
    },
    "compile": {
        "requested": "--torch_compile was given (the flag; what happened is `compiled`)",
        "backend": "the torch.compile backend asked for (e.g. inductor); null when not requested",
        "compiled": "dynamo compiled a graph inside the training steps of every rank (its counters, not the flag)",
        "graphs_per_rank": "graphs dynamo compiled inside training steps, per rank (forward and backward graphs "
        "count as one; an evaluation's graphs are not counted)",
        "recompiles_after_warmup": "graphs compiled after the warm-up steps, on the rank with the most: 0 on a "
        "fixed shape, more after a shape or guard change",
        "recompiles_on_new_batch_size": "of those, the graphs compiled in a step whose batch size no warm-up step had "
        "(a shape change, e.g. an epoch's last partial batch), on the rank with the most",
        "recompile_steps": "[step, images] of each step after warm-up that compiled a graph (the rank with the most)",
        "last_compile_step": "the last optimizer step (1-based) in which a rank compiled a graph; null: none",
        "compile_time_s": "seconds dynamo and its backend spent compiling inside training steps (slowest rank)",
        "warmup_time_s": "wall seconds of the warm-up steps (slowest rank), left out of every steady-state figure",
        "compiled_within_warmup": "last_compile_step <= warmup_steps: no compile time in the steady-state figures; "
        "null when nothing was compiled",
    },
}


def schema_markdown() -> str:
    """The schema as the Markdown table docs/throughput.md carries (a test keeps the page equal to this)."""
    rows = ["| section | key | meaning |", "|---|---|---|"]
    for section, keys in REPORT_SCHEMA.items():
        rows += [f"| `{section}` | `{key}` | {meaning} |" for key, meaning in keys.items()]
    return "\n".join(rows)


def upgrade_v1(report: dict) -> dict:
    """Version 1 files (before sequence parallelism and the engine name) read as version 2: one rank per image,
    and the engine follows from the ZeRO stage (null: the plain Trainer)."""
    setup = report.get("setup", {})
    setup.setdefault("sequence_parallel_size", 1)
    if "tokens_per_image" in setup:
        setup.setdefault("tokens_per_rank", setup["tokens_per_image"])
    setup.setdefault("engine", "trainer" if setup.get("zero_stage") is None else "deepspeed")
    report["schema_version"] = 2
    return report


def upgrade_v2(report: dict) -> dict:
    """Version 2 files (before a distillation teacher's FLOPs were counted) read as version 3: no teacher counted,
    so the teacher's figures are null and the MFU is the student's alone, as it was."""
    report.setdefault("flops", {})
    report["flops"].setdefault("teacher_forward_flops_per_image", None)
    report["flops"].setdefault("teacher_flops_fraction", None)
    report["schema_version"] = 3
    return report


def upgrade_v3(report: dict) -> dict:
    """Version 3 files (before torch.compile was reported) read as version 4: what compile did was not recorded, so
    every figure of the `compile` section is null."""
    report.setdefault("compile", dict.fromkeys(REPORT_SCHEMA["compile"]))
    report["schema_version"] = 4
    return report


def upgrade_v4(report: dict) -> dict:
    """Version 4 files (before the DeepSpeed values were resolved and recorded) read as version 5: nothing
    recorded, so `deepspeed_resolved` is empty."""
    report.setdefault("setup", {}).setdefault("deepspeed_resolved", {})
    report["schema_version"] = 5
    return report


def upgrade_v5(report: dict) -> dict:
    """Version 5 files (before DeepSpeed's fast paths were recorded) read as version 6: nothing recorded, so
    `deepspeed_fast_paths` is empty."""
    report.setdefault("setup", {}).setdefault("deepspeed_fast_paths", {})
    report["schema_version"] = 6
    return report


def upgrade_v6(report: dict) -> dict:
    """Version 6 files (before the engine's route and the fast paths that ran were recorded) read as version 7: the
    route is unknown (null), no fast path recorded as ran."""
    report.setdefault("setup", {}).setdefault("engine_route", None)
    report["setup"].setdefault("deepspeed_fast_paths_ran", {})
    report["schema_version"] = 7
    return report


def load_throughput_report(path: str) -> dict:
    """Read a throughput.json (version 7, or versions 1 to 6 upgraded), checking every section and key."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    version = report.get("schema_version")
    if version == 1:
        report = upgrade_v1(report)
        version = 2
    if version == 2:
        report = upgrade_v2(report)
        version = 3
    if version == 3:
        report = upgrade_v3(report)
        version = 4
    if version == 4:
        report = upgrade_v4(report)
        version = 5
    if version == 5:
        report = upgrade_v5(report)
        version = 6
    if version == 6:
        report = upgrade_v6(report)
    elif version != SCHEMA_VERSION:
        raise ValueError(f"{path}: throughput report schema {version!r}; this version reads 1 to {SCHEMA_VERSION}")
    missing = [
        f"{section}.{key}"
        for section, keys in REPORT_SCHEMA.items()
        for key in keys
        if key not in report.get(section, {})
    ]
    if missing:
        raise ValueError(f"{path}: throughput report lacks {', '.join(missing)}")
    return report


def throughput_row(path: str) -> dict:
    """One finished run's figures from its throughput.json, flat, for a table row: the scaling study's results.csv
    and the GPU benchmark's cells read them here (one reader, the schema's key names)."""
    report = load_throughput_report(path)
    setup, flops, step, memory, ranks = (report[k] for k in ("setup", "flops", "step_time_s", "memory", "ranks"))
    return {
        "nodes": setup["num_nodes"],
        "world_size": setup["world_size"],
        "zero_stage": setup["zero_stage"],
        "device": setup["devices"][0],
        "images_per_s": report["throughput"]["images_per_s"],
        "images_per_s_per_device": report["throughput"]["images_per_s_per_device"],
        "step_time_mean_s": step["mean"],
        "step_time_median_s": step["median"],
        "data_wait_fraction": step["data_wait_fraction"],
        "tflops_per_device": flops["achieved_tflops_per_device"],
        "peak_tflops": flops["peak_tflops_per_device"],
        "peak_source": flops["peak_source"],
        "mfu": flops["mfu"],
        "memory_max_bytes": memory["max_bytes"],
        "memory_kind": memory["kind"],
        "est_sync_wait_s_total": ranks["est_sync_wait_s_total"],
        "slowest_rank": ranks["slowest_rank"],
    }
