"""From every rank's measured figures to the report: pure arithmetic, testable without a Trainer.

`summarize(per_rank, setup)` takes what `ThroughputCallback` gathered from each rank (`RankFigures` keys below) and
what the run was and returns the report whose schema is `schema.REPORT_SCHEMA`. `setup` keys (the callback fills
them from TrainingArguments, the model and the engine): engine, per_device_train_batch_size,
gradient_accumulation_steps, zero_stage, offload, precision, image_size, patch_size, tokens_per_image,
num_parameters, forward_macs_per_image, train_flops_per_image, teacher_forward_flops_per_image (None without a
distillation teacher), versions, simulated_slow_ranks, rank_batches, sequence_parallel_size,
warmup_steps, peak_tflops, peak_source, memory_kind, torch_compile (the flag), compile_backend.

Per-rank figures (one dict per rank, in rank order): steps, images, measured_time, compute_mean, data_wait_mean,
forward_mean, input_mean, step_time_mean, step_time_median, step_time_p90, own_work (per measured step), memory
({allocated_peak_bytes, reserved_peak_bytes, rss_peak_bytes}), device, hostname, node, compile
({graphs, graphs_after_warmup, last_compile_step, compile_time_s, warmup_time_s, recompile_steps,
graphs_on_new_batch_size}: `compilation.CompileWatch`).
"""

import numpy as np

from hf_vit_scaling.models.flops import mfu
from hf_vit_scaling.parallel.distributed import global_batch_size
from hf_vit_scaling.throughput.schema import SCHEMA_VERSION


def estimate_sync_wait(work_per_rank: list[list[float]]) -> list[float]:
    """Seconds each rank waits at gradient synchronisation, summed over steps.

    At every step all ranks leave the all-reduce together, so a rank waits for the slowest one:
    wait[r] = sum over steps of (max_r' work[r'][s] - work[r][s]).
    """
    work = np.asarray(work_per_rank, dtype=np.float64)  # (ranks, steps)
    if work.size == 0:
        return [0.0] * len(work_per_rank)
    return (work.max(axis=0, keepdims=True) - work).sum(axis=1).tolist()


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _rank_rows(per_rank: list[dict]) -> tuple[list[dict], list[float], list[float]]:
    waits = estimate_sync_wait([r["own_work"] for r in per_rank])
    own_means = [_mean(r["own_work"]) or 0.0 for r in per_rank]
    rows = [
        {
            "rank": rank, "hostname": r["hostname"], "device": r["device"], "images": r["images"],
            "step_compute_mean_s": r["compute_mean"], "forward_mean_s": r["forward_mean"],
            "input_hooks_mean_s": r["input_mean"], "data_wait_mean_s": r["data_wait_mean"],
            "est_own_work_mean_s": own, "est_sync_wait_s": wait,
            "est_sync_wait_fraction": wait / r["measured_time"] if r["measured_time"] > 0 else None,
        }
        for rank, (r, wait, own) in enumerate(zip(per_rank, waits, own_means))
    ]  # fmt: skip
    return rows, waits, own_means


def _ranks_section(per_rank: list[dict]) -> dict:
    rows, waits, own_means = _rank_rows(per_rank)
    fastest = int(np.argmin(own_means)) if own_means else 0
    slowest = int(np.argmax(own_means)) if own_means else 0
    return {
        "per_rank": rows,
        "fastest_rank": fastest,
        "slowest_rank": slowest,
        "spread": own_means[slowest] / own_means[fastest] if own_means and own_means[fastest] > 0 else None,
        "est_sync_wait_s_total": float(sum(waits)),
    }


def _memory_section(per_rank: list[dict], kind: str) -> dict:
    rows = [{"rank": i, **r["memory"]} for i, r in enumerate(per_rank)]
    return {"per_rank": rows, "kind": kind, "max_bytes": max((m[kind] or 0) for m in rows)}


def est_sync_and_optimizer(compute: float | None, input_hooks: float | None, forward: float | None) -> float | None:
    """compute - input hooks - 3 x forward: gradient communication (incl. waiting), optimizer step, ZeRO gathers.

    None when there is nothing measured, or when the difference is negative: backward ~ 2x forward is an estimate,
    and where backward is cheaper (tiny models, CPU) the remainder is not measurable, not a negative time.
    """
    if compute is None or forward is None:
        return None
    remainder = compute - (input_hooks or 0.0) - 3.0 * forward
    return remainder if remainder >= 0.0 else None


def _step_time_section(main: dict) -> dict:
    mean, wait, compute = main["step_time_mean"], main["data_wait_mean"], main["compute_mean"]
    return {
        "mean": mean,
        "median": main["step_time_median"],
        "p90": main["step_time_p90"],
        "compute_mean": compute,
        "data_wait_mean": wait,
        "data_wait_fraction": wait / mean if wait is not None and mean else None,
        "est_sync_and_optimizer_mean": est_sync_and_optimizer(compute, main["input_mean"], main["forward_mean"]),
    }


def counted_flops_per_image(setup: dict) -> int:
    """The FLOPs one training image costs, as MFU counts them: the student's forward + backward, plus a
    distillation teacher's forward (no backward: it runs under no_grad). vit-tiny-cpu with a distillation token at
    16 px, resnet-tiny-cpu teacher: 33,797,376 + 2,112,000 = 35,909,376 FLOPs, the teacher 5.9% of them."""
    return setup["train_flops_per_image"] + (setup["teacher_forward_flops_per_image"] or 0)


def teacher_flops_fraction(setup: dict) -> float | None:
    """The teacher's share of `counted_flops_per_image`; None without a teacher."""
    teacher = setup["teacher_forward_flops_per_image"]
    return teacher / counted_flops_per_image(setup) if teacher is not None else None


def compile_section(per_rank: list[dict], setup: dict) -> dict:
    """What torch.compile did, from every rank's dynamo counters (`compilation.CompileWatch`): compiled only when
    every rank compiled a graph inside its training steps, whatever the flag said; the largest count of graphs
    compiled after warm-up (recompilations); whether every compile fell inside the warm-up steps, which the
    steady-state figures leave out."""
    figures = [r["compile"] for r in per_rank]
    steps = [f["last_compile_step"] for f in figures if f["last_compile_step"] is not None]
    last = max(steps) if steps else None
    return {
        "requested": setup["torch_compile"],
        "backend": setup["compile_backend"],
        "compiled": all(f["graphs"] > 0 for f in figures),
        "graphs_per_rank": [f["graphs"] for f in figures],
        "recompiles_after_warmup": max(f["graphs_after_warmup"] for f in figures),
        "recompiles_on_new_batch_size": max(f.get("graphs_on_new_batch_size", 0) for f in figures),
        "recompile_steps": max((f.get("recompile_steps", []) for f in figures), key=len),
        "last_compile_step": last,
        "compile_time_s": max(f["compile_time_s"] for f in figures),
        "warmup_time_s": max(f["warmup_time_s"] for f in figures),
        "compiled_within_warmup": last <= setup["warmup_steps"] if last is not None else None,
    }


def summarize(per_rank: list[dict], setup: dict) -> dict:
    """The report (schema `REPORT_SCHEMA`) from every rank's figures and the run's setup."""
    world, sp = len(per_rank), setup["sequence_parallel_size"]
    per_device, gas = setup["per_device_train_batch_size"], setup["gradient_accumulation_steps"]
    measured_time = max(r["measured_time"] for r in per_rank)
    images = sum(r["images"] for r in per_rank) // sp  # each image entered forward on its N SP ranks
    images_per_s = images / measured_time if measured_time > 0 else None
    counted = counted_flops_per_image(setup)
    achieved_total = images_per_s * counted / 1e12 if images_per_s else None
    achieved_per_device = achieved_total / world if achieved_total is not None else None
    tokens = setup["tokens_per_image"]  # None: a CNN
    batch = global_batch_size(per_device, gas, world, sp)
    return {
        "schema_version": SCHEMA_VERSION,
        "setup": {
            "engine": setup["engine"],
            "engine_route": setup.get("engine_route"),
            "world_size": world,
            "num_nodes": len({r["node"] for r in per_rank}),
            "per_device_train_batch_size": per_device,
            "gradient_accumulation_steps": gas,
            "global_batch_size": batch,
            "zero_stage": setup["zero_stage"],
            "offload": setup["offload"],
            "deepspeed_resolved": setup.get("deepspeed_resolved", {}),
            "deepspeed_fast_paths": setup.get("deepspeed_fast_paths", {}),
            "deepspeed_fast_paths_ran": setup.get("deepspeed_fast_paths_ran", {}),
            "precision": setup["precision"],
            "image_size": setup["image_size"],
            "patch_size": setup["patch_size"],
            "tokens_per_image": tokens,
            "num_parameters": setup["num_parameters"],
            "devices": sorted({r["device"] for r in per_rank}),
            "hostnames": sorted({r["hostname"] for r in per_rank}),
            "versions": setup["versions"],
            "simulated_slow_ranks": {str(k): v for k, v in setup["simulated_slow_ranks"].items()},
            "rank_batches": setup["rank_batches"],
            "sequence_parallel_size": sp,
            "tokens_per_rank": -(-tokens // sp) if tokens else None,
        },
        "throughput": {
            "images_per_s": images_per_s,
            "images_per_s_per_device": images_per_s / world if images_per_s else None,
            "images_measured": images,
            "steps_measured": per_rank[0]["steps"],
            "warmup_steps": setup["warmup_steps"],
            "measured_time_s": measured_time,
            "nominal_images_per_step": batch,
        },
        "step_time_s": _step_time_section(per_rank[0]),
        "flops": {
            "forward_macs_per_image": setup["forward_macs_per_image"],
            "train_flops_per_image": setup["train_flops_per_image"],
            "teacher_forward_flops_per_image": setup["teacher_forward_flops_per_image"],
            "teacher_flops_fraction": teacher_flops_fraction(setup),
            "achieved_tflops_per_device": achieved_per_device,
            "achieved_tflops_total": achieved_total,
            "peak_tflops_per_device": setup["peak_tflops"],
            "peak_source": setup["peak_source"],
            "mfu": mfu(achieved_per_device, setup["peak_tflops"]) if achieved_per_device is not None else None,
        },
        "memory": _memory_section(per_rank, setup["memory_kind"]),
        "ranks": _ranks_section(per_rank),
        "compile": compile_section(per_rank, setup),
    }
