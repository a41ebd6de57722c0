"""The throughput report as the table the main process prints once at the end of training."""

import json


def format_value(value, spec: str = ".3g", unit: str = "") -> str:
    """`value` formatted with `spec` and `unit`, or "n/a" for a figure that was not measured (null in the report)."""
    return "n/a" if value is None else f"{value:{spec}}{unit}"


_fmt = format_value  # the short name the table rows below use


def _sync_and_optimizer(step: dict) -> str:
    """The estimate, or why there is none (`summary.est_sync_and_optimizer` leaves it null rather than negative)."""
    if step["est_sync_and_optimizer_mean"] is None and step["compute_mean"] is not None:
        return "n/a (compute < input + 3 x forward)"
    return _fmt(step["est_sync_and_optimizer_mean"], ".4f", " s")


def _teacher_flops(flops: dict) -> str:
    """With a distillation teacher " + teacher 0.002 GFLOP forward/image (5.9% of those counted)", else ""."""
    teacher = flops["teacher_forward_flops_per_image"]
    if teacher is None:
        return ""
    share = flops["teacher_flops_fraction"]
    return f" + teacher {teacher / 1e9:.3f} GFLOP forward/image ({share:.1%} of those counted)"


# An epoch's last, partial batch is the usual new shape: dropping it keeps one batch size (measured: the recipe at
# batch 128 on digits recompiled 3 graphs at step 12, 119 images, and none with the flag; docs/recipe.md).
SAME_SHAPE_FIX = "--dataloader_drop_last true avoids it"


def recompile_cause(compile_facts: dict) -> str:
    """Why the graphs after warm-up were compiled, as far as the report knows: " (step 119 (90 images): a batch
    size the warm-up did not see, a shape change; --dataloader_drop_last true avoids it)"; the steps alone for a
    guard the batch size does not explain."""
    steps = compile_facts.get("recompile_steps") or []
    if not steps:
        return ""
    shown = ", ".join(f"{step} ({images} images)" for step, images in steps[:3]) + (", ..." if len(steps) > 3 else "")
    new = compile_facts.get("recompiles_on_new_batch_size", 0)
    if new == compile_facts["recompiles_after_warmup"]:
        return f" (step {shown}: a batch size the warm-up did not see, a shape change; {SAME_SHAPE_FIX})"
    if new:
        return (
            f" (step {shown}; {new} of them on a batch size the warm-up did not see, a shape change; {SAME_SHAPE_FIX})"
        )
    return f" (step {shown}: the warm-up's batch size, another guard)"


def compile_line(compile_facts: dict, warmup_steps: int) -> str | None:
    """What torch.compile did, for the table: None when it was neither asked for nor done; otherwise the graphs,
    the recompilations after warm-up and the compile time, said to be inside or outside the warm-up steps."""
    if not compile_facts.get("requested") and not any(compile_facts.get("graphs_per_rank") or []):
        return None
    c = compile_facts
    if not c["compiled"]:
        return f"compile      NOT COMPILED: a rank compiled no graph in training (per rank: {c['graphs_per_rank']})"
    where = "inside" if c["compiled_within_warmup"] else "NOT all inside"
    return (
        f"compile      {c['backend'] or 'default backend'}: {c['graphs_per_rank']} graph(s) per rank, "
        f"{c['recompiles_after_warmup']} recompiled after warm-up{recompile_cause(c)}; "
        f"{c['compile_time_s']:.1f} s compiling, last at "
        f"step {c['last_compile_step']}, {where} the {warmup_steps} warm-up steps ({c['warmup_time_s']:.1f} s, "
        "excluded)"
    )


def resolved_lines(resolved: dict) -> list[str]:
    """The DeepSpeed values the project set, grouped by reason: "deepspeed    reduce_bucket_size 120,832,
    allgather_bucket_size 120,832: 1 gradient flush a step ..." (none without DeepSpeed)."""
    by_reason: dict[str, list[str]] = {}
    for key, entry in resolved.items():
        value = entry["value"]
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else json.dumps(value)
        by_reason.setdefault(entry["reason"], []).append(f"{key.rsplit('.', 1)[-1]} {shown}")
    return [
        f"{'deepspeed' if i == 0 else '':<13}{', '.join(keys)}: {reason}"
        for i, (reason, keys) in enumerate(by_reason.items())
    ]


def fast_path_lines(fast_paths: dict, ran: dict) -> list[str]:
    """DeepSpeed's per-tensor loops the run replaced: those that ran in the measured steps, with how often ("fast
    paths   ran: zero12_grad_norm x60, ..."), those installed whose conditions never held, and those off, with why
    (none without DeepSpeed)."""
    if not fast_paths:
        return []
    idle = [name for name, status in fast_paths.items() if status == "on" and name not in ran]
    parts = (
        ([f"ran: {', '.join(f'{name} x{count}' for name, count in ran.items())}"] if ran else [])
        + ([f"installed, not run: {', '.join(idle)}"] if idle else [])
        + [f"{n} {s}" for n, s in fast_paths.items() if s != "on"]
    )
    return [f"{'fast paths':<13}{'; '.join(parts)}"]


def format_report(report: dict) -> str:
    """A readable table of the report, printed once by the main process."""
    s, t, st, fl, mem, rk = (report[k] for k in ("setup", "throughput", "step_time_s", "flops", "memory", "ranks"))
    sp = s["sequence_parallel_size"]
    engines = {"fsdp": "FSDP2", "trainer": "plain Trainer (DDP)" if s["world_size"] > 1 else "plain Trainer"}
    zero = f"ZeRO-{s['zero_stage']}" if s["zero_stage"] is not None else engines.get(s["engine"], s["engine"])
    if s["offload"]:
        zero += " + offload " + ", ".join(f"{k}->{v}" for k, v in s["offload"].items())
    lines = [
        "=" * 78,
        "Throughput report"
        + ("   [SIMULATED slow ranks: " + str(s["simulated_slow_ranks"]) + "]" if s["simulated_slow_ranks"] else ""),
        "-" * 78,
        f"setup        {s['world_size']} process(es) on {s['num_nodes']} node(s), {zero}, {s['precision']}, "
        + (
            f"{s['image_size']} px / patch {s['patch_size']} ({s['tokens_per_image']} tokens), "
            if s["patch_size"]
            else f"{s['image_size']} px (CNN), "
        )
        + f"{s['num_parameters'] / 1e6:.2f} M params"
        + (
            f"; sequence parallel over {s['sequence_parallel_size']} ranks ({s['tokens_per_rank']} tokens per rank)"
            if sp > 1
            else ""
        ),
        f"batch        {s['per_device_train_batch_size']} per device x {s['gradient_accumulation_steps']} "
        "accumulation "
        f"x {s['world_size'] // sp}{f' SP groups of {sp} ranks' if sp > 1 else ''} = {s['global_batch_size']} images "
        "per optimizer step" + (f" (balanced per rank: {s['rank_batches']})" if s["rank_batches"] else ""),
        f"images/s     {_fmt(t['images_per_s'], '.1f')} total, {_fmt(t['images_per_s_per_device'], '.1f')} per device "
        f"({t['images_measured']} images over {t['steps_measured']} steps, first {t['warmup_steps']} excluded)",
        f"step time    mean {_fmt(st['mean'], '.4f', ' s')}, median {_fmt(st['median'], '.4f', ' s')}, "
        f"p90 {_fmt(st['p90'], '.4f', ' s')}; compute {_fmt(st['compute_mean'], '.4f', ' s')} (of which est. "
        f"sync + optimizer {_sync_and_optimizer(st)}), data wait "
        f"{_fmt(st['data_wait_mean'], '.4f', ' s')}",
        f"FLOPs        {fl['forward_macs_per_image'] / 1e9:.3f} GMACs forward/image, "
        f"{fl['train_flops_per_image'] / 1e9:.3f} GFLOP train/image{_teacher_flops(fl)}; achieved "
        f"{_fmt(fl['achieved_tflops_per_device'], '.4g')} TFLOP/s per device; peak "
        f"{_fmt(fl['peak_tflops_per_device'], '.4g')} ({fl['peak_source']}); MFU {_fmt(fl['mfu'], '.1%')}",
        f"memory       peak {mem['max_bytes'] / 2**20:.0f} MiB per device ({mem['kind']})",
        f"ranks        fastest {rk['fastest_rank']}, slowest {rk['slowest_rank']}, spread "
        f"{_fmt(rk['spread'], '.2f', 'x')}, est. wait at gradient sync {rk['est_sync_wait_s_total']:.2f} s in all",
    ]
    if s.get("engine_route"):
        lines.append(f"{'engine from':<13}{s['engine_route']}")
    lines += resolved_lines(s.get("deepspeed_resolved") or {})
    lines += fast_path_lines(s.get("deepspeed_fast_paths") or {}, s.get("deepspeed_fast_paths_ran") or {})
    compiled = compile_line(report["compile"], t["warmup_steps"])
    if compiled is not None:
        lines.append(compiled)
    for row in rk["per_rank"]:
        lines.append(
            f"  rank {row['rank']:<3} {row['hostname'][:16]:<16} work/step "
            f"{_fmt(row['est_own_work_mean_s'], '.4f', ' s')}"
            f"  waits {_fmt(row['est_sync_wait_s'], '.2f', ' s')} ({_fmt(row['est_sync_wait_fraction'], '.0%')})"
            f"  images {row['images']}"
        )
    lines.append("=" * 78)
    return "\n".join(lines)
