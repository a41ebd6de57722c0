"""The renderers of the planner's results files (benchmarks/planner_memory.py, planner_study.py,
planner_published.py): its memory error per engine and configuration, and published runs against its predictions."""

from .cells import table

ENGINES = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero2_offload": "ZeRO-2 offload",
    "zero3": "ZeRO-3",
    "zero3_offload": "ZeRO-3 offload",
    "fsdp2": "FSDP2",
}
ENGINES_ALL = {**ENGINES, "hsdp": "HSDP"}  # planner_projection recommends HSDP too


def planner_memory_by_engine(result: dict) -> str:
    """Per engine: how many rows in fp32 and bf16, and the range of the planner's error in each."""

    def rows(engine: str, precision: str) -> list[dict]:
        return [r for r in result["rows"] if r["engine"] == engine and r["precision"] == precision]

    def error_range(found: list[dict]) -> str:
        errors = [r["peak_error"] for r in found]
        low, high = f"{min(errors):+.1%}", f"{max(errors):+.1%}"
        return low if low == high else f"{low} to {high}"

    return table(
        ["engine", "rows (fp32 + bf16)", "error, fp32", "error, bf16"],
        [
            [
                label,
                f"{len(rows(engine, 'fp32'))} + {len(rows(engine, 'bf16'))}",
                error_range(rows(engine, "fp32")),
                error_range(rows(engine, "bf16")),
            ]
            for engine, label in ENGINES.items()
        ],
    )


def planner_memory_rows(result: dict) -> str:
    """Each configuration: predicted and measured peak (MiB per rank), the error, and both at step start."""
    mib = 2**20

    def row(r: dict) -> list[str]:
        predicted, measured = r["predicted"], r["measured"]
        engine = ENGINES[r["engine"]] + (" + checkpointing" if r["gradient_checkpointing"] else "")
        return [
            f"`{r['name']}`",
            r["group"],
            engine,
            r["precision"],
            f"{r['preset']}, {r['image_size']} px, {r['batch']}",
            f"{predicted['peak'] / mib:,.1f}",
            f"{measured['peak'] / mib:,.1f}",
            f"{r['peak_error']:+.1%}",
            f"{predicted['static'] / mib:,.1f} / {measured['static'] / mib:,.1f}",
        ]

    return table(
        [
            "configuration",
            "group",
            "engine",
            "precision",
            "model, image, batch",
            "predicted",
            "measured",
            "error",
            "predicted / measured at step start",
        ],
        [row(r) for r in result["rows"]],
    )


def planner_study(result: dict) -> str:
    """The first run's bandwidths (10 GB/s inside a node): each GPU count's published and predicted epoch."""
    return table(
        ["GPUs", "nodes", "published epoch (s)", "predicted (s)", "compute (s)", "communication (s)", "error"],
        [
            [
                str(r["gpus"]),
                str(r["nodes"]),
                *(f"{r[key]:.2f}" for key in ("published_s", "predicted_s", "compute_s", "communication_s")),
                f"{r['error']:+.1%}",
            ]
            for r in result["runs"][0]["rows"]
        ],
    )


# planner_published.json's groups, as the table names each run's source (the file holds the full reference).
PUBLISHED_SOURCES = {
    "dinov2": "DINOv2 paper (arXiv 2304.07193), repo",
    "eva": "EVA-CLIP paper (arXiv 2303.15389), repo",
    "nemo-a100": "NeMo ViT performance doc",
    "nemo-h100": "NeMo ViT performance doc",
    "internvit": "InternVL paper (arXiv 2312.14238), model card",
}


def published_reported(row: dict) -> str:
    reported = row["reported"]
    if "images_per_s" in reported:
        per_node = reported["images_per_s"] / row["nodes"]
        return f"{reported['images_per_s']:,} img/s ({per_node:,.0f} per node; MFU {reported['implied_mfu']:.1%})"
    said = "trained (fits)"
    return said + (f", {reported['gpu_hours']:,} GPU-hours" if "gpu_hours" in reported else "")


def planner_published(result: dict) -> str:
    """Each published run: its setup, what its source reports, the planner's memory per GPU (and whether twice the
    batch fits), its images/s per node and the ratio planner / reported."""

    def row(r: dict) -> list[str]:
        p = r["planner"]
        speed = f"{p['images_per_s_per_node']:,.0f}" if "ratio" in r else "not compared"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "—"
        return [
            r["run"],
            r["setup"],
            f"{published_reported(r)}; {PUBLISHED_SOURCES[r['group']]}",
            p["engine_name"],
            f"{p['peak_gib']:.1f} / {p['usable_gib']:.0f}",
            f"{'yes' if p['fits'] else 'no'} ({'yes' if p['double_batch_fits'] else 'no'}; max {p['max_batch']})",
            speed,
            ratio,
        ]

    return table(
        [
            "run",
            "setup",
            "reported; source",
            "engine planned",
            "peak / usable GiB per GPU",
            "fits (2x batch; largest)",
            "planner img/s per node",
            "planner / reported",
        ],
        [row(r) for r in result["runs"]],
    )


def planner_published_scaling(result: dict) -> str:
    """The 16-node scaling efficiency (16 nodes' throughput over 16 x one node's), published and planned."""
    names = {"nemo-a100": "NeMo ViT g/14, DGX A100", "nemo-h100": "NeMo ViT g/14, DGX H100"}
    return table(
        ["run", "published", "planner", "difference"],
        [
            [names[key], f"{e['published']:.1%}", f"{e['planner']:.1%}", f"{e['difference_points']:+.1f} points"]
            for key, e in result["scaling_efficiency"].items()
        ],
    )


def planner_published_inputs(result: dict) -> str:
    """The hardware figures the commands use, each with its source."""
    return table(
        ["input", "value", "source"],
        [[name, f"{h['value']:g} {h['unit']}", h["source"]] for name, h in result["hardware"].items()],
    )


def planner_published_commands(result: dict) -> str:
    """The recipes/plan.py command behind each row (add --json for every figure, communication terms included)."""
    return table(["run", "command"], [[r["run"], f"`{r['command']}`"] for r in result["runs"]])


def planner_projection(result: dict) -> str:
    """ViT-H/14 and ViT-g/14 on 64 to 1,024 H100s: the recommended engine's step, whether it is communication-bound,
    its images/s, and the fastest option that fits."""
    return table(
        [
            "network",
            "model",
            "scaling",
            "GPUs",
            "per GPU",
            "recommended",
            "step s (compute + comm)",
            "comm-bound",
            "img/s",
            "fastest fitting: img/s",
        ],
        [
            [
                r["network"],
                r["model"],
                r["scaling"],
                f"{r['gpus']:,}",
                str(r["batch"]),
                ENGINES_ALL[r["recommended"]],
                f"{r['step_s']:.3f} ({r['compute_s']:.3f} + {r['communication_s']:.3f})",
                "**yes**" if r["communication_bound"] else "no",
                f"{r['images_per_s']:,.0f}",
                f"{ENGINES_ALL[r['fastest']]}: {r['fastest_images_per_s']:,.0f}",
            ]
            for r in result["projection"]
        ],
    )


def planner_worked_example(result: dict) -> str:
    """The worked example: its recipes/plan.py command and the plan it prints."""
    example = result["worked_example"]
    return f"```\n{example['command']}\n```\n\n```\n{example['output']}\n```"
