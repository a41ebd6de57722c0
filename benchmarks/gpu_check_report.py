"""The GPU check's table (OUT/gpu_check.md) and the packed run folders. Part of benchmarks/gpu_check.py."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

# --------------------------------------------------------------------------- the table


def _note(record: dict, default: str = "") -> str:
    """Why an item did not give figures: its skip reason, else its error's last line."""
    lines = (record.get("error") or "").splitlines()
    return (record.get("reason") or (lines[-1] if lines else default))[:160]


def _pct(value) -> str:
    return "" if value is None else f"{value:.1%}"


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


ITEM_ORDER = ["ddp", "zero1", "zero2", "zero3", "fsdp2", "zero2_auto", "zero3_auto", "zero2_own", "zero3_own"]
VARIANTS = ("eager", "compiled", "max-autotune")


def markdown(result: dict) -> str:
    """One table: a row per recipe run (a), the data-wait check (b), the floor (c), the planner grid (d); then the
    profile (e) as its own table."""
    s, items, parts = result["settings"], result["items"], result["parts"]
    device = next((r["figures"]["device"] for r in items.values() if r.get("figures", {}).get("device")), "?")
    kinds = [r["figures"]["memory_kind"] for r in items.values() if r.get("figures", {}).get("memory_kind")]
    memory_kind = kinds[0] if kinds else "allocated_peak_bytes"
    lines = [
        f"gpu_check ({result['mode']}) on {device}; torch {result['versions']['torch']}; {s['model_preset']} at "
        f"{s['image_size']} px, batch {s['batch_size']}, {s['precision']}; eager {s['eager_steps']} steps "
        f"({s['eager_warmup']} warm-up excluded), compiled ({s['compile_backend']}) {s['compiled_steps']} "
        f"({s['compiled_warmup']}); prepared "
        f"shards at {s['shard_size']} px with {s['workers']} loader worker(s); wall time {result['wall_s']:.0f} s of "
        f"a {s['budget_s']:.0f} s budget; setup {result['setup'].get('status', '?')}"
        f"{' (' + str(result['setup'].get('seconds')) + ' s)' if result['setup'].get('seconds') else ''}.",
        "",
        "| part | run | status | images/s | MFU | data wait | step ms | x floor | peak GiB (planner) | s | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    kind = "" if memory_kind == "allocated_peak_bytes" else " RSS"
    names = [f"{e}-{v}" for v in VARIANTS for e in ITEM_ORDER]
    for name in names:
        r = items.get(name)
        if r is None:
            continue
        label = f"{r.get('label', name)} {'compiled' if r.get('compiled') else 'eager'}"
        if r.get("compile_mode"):
            label += f" {r['compile_mode']}"
        if r.get("processes", 1) > 1:
            label += f", {r['processes']} processes"
        f = r.get("figures") or {}
        if r["status"] != "ok" or not f:
            lines.append(f"| a | {label} | {r['status']} | | | | | | | {r['seconds']:.0f} | {_note(r)} |")
            continue
        memory = f"{f['memory_bytes'] / 2**30:.2f}{kind}"
        if f.get("predicted_peak_bytes"):
            memory += f" ({f['predicted_peak_bytes'] / 2**30:.2f})"
        mfu = _pct(f.get("mfu")) + (f" ({f['peak_source']})" if f.get("peak_source") not in (None, "table") else "")
        lines.append(
            f"| a | {label} | ok | {_num(f['images_per_s'], ',.0f')} | {mfu} | {_pct(f['data_wait_fraction'])} | "
            f"{_num(f['step_time_s'] and f['step_time_s'] * 1000, '.1f')} | {_num(f.get('floor_ratio'), '.2f')} | "
            f"{memory} | {r['seconds']:.0f} | {r.get('input', '')} |"
        )
    b = parts["b"]
    shards = items.get("shards", {})
    if b.get("figures"):
        fb = b["figures"]
        verdict = "pass" if fb["passed"] else "MISSED"
        lines.append(
            f"| b | data wait, plain Trainer compiled, {fb['rows']} rows of {fb['shard_size']} px shards, "
            f"{fb['workers']} worker(s) | ok | {_num(fb['images_per_s'], ',.0f')} | | "
            f"{_pct(fb['data_wait_fraction'])} | {_num(fb['step_time_s'] * 1000, '.1f')} | | | "
            f"{shards.get('seconds', 0):.0f} | target < {fb['target']:.0%}: {verdict} |"
        )
    else:
        why = _note(shards) if shards.get("status") != "ok" else "the compiled plain-Trainer run gave no figures"
        lines.append(f"| b | data wait on prepared shards | {b['status']} | | | | | | | "
                     f"{shards.get('seconds', 0):.0f} | {why} |")  # fmt: skip
    floor = items.get("floor", {})
    if floor.get("figures"):
        f = floor["figures"]
        predicted = f.get("predicted_peak_bytes")
        for variant in ("eager", "compiled"):
            v = f.get(variant, {"error": "not reached (the item stopped first)"})
            if "error" in v:
                lines.append(f"| c | floor {variant} | failed | | | | | | | | {v['error'].splitlines()[-1][:160]} |")
                continue
            memory = "" if v["peak_allocated_bytes"] is None else f"{v['peak_allocated_bytes'] / 2**30:.2f}"
            if memory and predicted:
                memory += f" ({predicted / 2**30:.2f})"
            mfu = _pct(v.get("mfu")) + (f" ({f['peak_source']})" if f.get("peak_source") != "table" else "")
            lines.append(
                f"| c | floor {variant}: plain loop, one batch on the device | ok | {_num(v['images_per_s'], ',.0f')} "
                f"| {mfu} | | {v['step_s'] * 1000:.1f} | 1.00 | {memory} | | {v['steps_per_s']:.1f} steps/s |"
            )
    else:
        lines.append(f"| c | floor | {floor.get('status', 'skipped')} | | | | | | | "
                     f"{floor.get('seconds', 0):.0f} | {_note(floor)} |")  # fmt: skip
    grid = items.get("planner-grid", {})
    if grid.get("status") == "ok":
        errors = [row["peak_error"] for row in grid["figures"]["rows"]]
        lines.append(
            f"| d | planner_memory_gpu.py, {len(errors)} configurations | ok | | | | | | | {grid['seconds']:.0f} | "
            f"planner peak error {min(errors):+.1%} to {max(errors):+.1%} |"
        )
    elif grid:
        lines.append(f"| d | planner_memory_gpu.py | {grid['status']} | | | | | | | {grid['seconds']:.0f} | "
                     f"{_note(grid)} |")  # fmt: skip
    return "\n".join(lines + profile_lines(items.get("profile"))) + "\n"


def profile_lines(record: dict | None, top: int = 5) -> list[str]:
    """Part e: per profiled run its step time under the profiler, the device-busy fraction and its top kernels
    (all 10 are in gpu_check.json)."""
    if record is None:
        return []
    lines = ["", f"Profile (part e, torch.profiler, {record.get('steps', '?')} steps per run): {record['status']}"
             f"{': ' + _note(record) if record['status'] != 'ok' else ''}", ""]  # fmt: skip
    runs = record.get("figures") or {}
    if not runs:
        return lines
    lines += [
        "| run | device | step ms (profiled) | device busy | kernel time / wall | top kernels, self ms per step |",
        "|---|---|---|---|---|---|",
    ]
    for run, f in runs.items():
        steps = f["steps"]
        kernels = "; ".join(f"{k['name'][:60]} {k['self_s'] * 1000 / steps:.2f}" for k in f["top_kernels"][:top])
        lines.append(
            f"| {run} | {f['device']} | {f['step_s'] * 1000:.1f} | {_pct(f['device_busy_fraction'])} | "
            f"{_pct(f['kernel_time_sum_s'] / f['wall_s'])} | {kernels.replace('|', '/')} |"
        )
    return lines


def pack_runs(out: Path, remove: bool) -> None:
    """OUT/runs/ as one OUT/runs.tar.gz; `remove`: delete the folders after (the GPU machine returns 8 files)."""
    runs = out / "runs"
    if not runs.is_dir():
        return
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        tar.add(runs, arcname="runs")
    if remove:
        shutil.rmtree(runs)
