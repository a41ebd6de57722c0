"""The planner against published large-ViT runs, and its projection to 1,024 GPUs.

Each published run is planned with a `recipes/plan.py` command, run in process through the functions plan.py calls
(`parse_plan_flags`, `plan`); the command is recorded beside the row, so `python recipes/plan.py <flags>` reproduces
every planner figure here (tests/repo/test_planner_published.py re-runs them). Every input figure names its source:
the run's report, model card, repository or documentation page, and the hardware's datasheet. Nothing is measured
here: the published figures are the measurements, the planner's are its estimates with its default assumptions
(40% of the datasheet's dense peak as the GEMMs' achievable FLOP/s, the datasheet's memory bandwidth for the layers'
non-GEMM work, the named link presets of `planning/shapes.py`).

    python benchmarks/planner_published.py --output benchmarks/results/planner_published.json \
        --plot docs/planner_projection.png
"""

import argparse
import shlex
import sys
from pathlib import Path

from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's package

from hf_vit_scaling.models.flops import HBM_GBPS, PEAK_TFLOPS, train_flops_per_image  # noqa: E402
from hf_vit_scaling.planning.memory import largest_batch  # noqa: E402
from hf_vit_scaling.planning.plan import plan  # noqa: E402
from hf_vit_scaling.planning.plan_arguments import parse_plan_flags  # noqa: E402
from hf_vit_scaling.planning.plan_report import format_plan  # noqa: E402
from hf_vit_scaling.planning.shapes import ENGINE_NAMES, GiB  # noqa: E402

DS_CONFIGS = REPO / "ds_configs"

# The hardware figures the commands use, each with its source. The planner's link presets are bus bandwidths set
# below the line rate (planning/shapes.py: INTERCONNECTS, NETWORKS), stated here beside the line rate they come from.
HARDWARE = {
    "A100 peak": {"value": PEAK_TFLOPS["A100"]["bf16"], "unit": "TFLOP/s bf16/fp16 dense",
                  "source": "NVIDIA A100 Tensor Core GPU datasheet (312 TFLOPS BF16/FP16, 624 with sparsity)"},
    "H100 SXM peak": {"value": PEAK_TFLOPS["H100"]["bf16"], "unit": "TFLOP/s bf16 dense",
                      "source": "NVIDIA H100 Tensor Core GPU Architecture whitepaper, Table 2 (H100 SXM5 dense "
                                "BF16 989.4; the datasheet's 1,979 is with sparsity)"},
    "achievable share of peak": {"value": 0.4, "unit": "fraction, GEMMs only",
                                 "source": "the planner's default --mfu: an assumption, not a measurement"},
    "A100 40GB memory bandwidth": {"value": HBM_GBPS["A100"][40], "unit": "GB/s HBM2",
                                   "source": "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB: 1,555 GB/s)"},
    "A100 80GB SXM memory bandwidth": {"value": HBM_GBPS["A100"][80], "unit": "GB/s HBM2e",
                                       "source": "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: 2,039 GB/s)"},
    "H100 SXM memory bandwidth": {"value": HBM_GBPS["H100"][80], "unit": "GB/s HBM3",
                                  "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 3.35 TB/s)"},
    "NVLink A100 (nvlink3)": {"value": 230.0, "unit": "GB/s bus bandwidth assumed",
                              "source": "A100 datasheet: NVLink 600 GB/s (300 GB/s per direction)"},
    "NVLink H100 (nvlink4)": {"value": 360.0, "unit": "GB/s bus bandwidth assumed",
                              "source": "H100 SXM datasheet: NVLink 900 GB/s (450 GB/s per direction)"},
    "DGX A100 network (8x-ib-hdr)": {"value": 180.0, "unit": "GB/s per node assumed",
                                     "source": "DGX A100 datasheet: 8 x 200 Gb/s HDR InfiniBand (ConnectX-6), "
                                               "one per GPU: 200 GB/s per node"},
    "DGX H100 network (8x-ib-ndr)": {"value": 360.0, "unit": "GB/s per node assumed",
                                     "source": "DGX H100 datasheet: 8 x 400 Gb/s NDR InfiniBand (ConnectX-7), "
                                               "one per GPU: 400 GB/s per node"},
    "one NIC per node (ib-ndr)": {"value": 45.0, "unit": "GB/s per node assumed",
                                  "source": "one 400 Gb/s NDR port (50 GB/s) per node: the projection's slow network"},
}  # fmt: skip

NEMO = ("NVIDIA NeMo Framework user guide, Vision Transformer 'Performance' page "
        "(https://docs.nvidia.com/nemo-framework/user-guide/latest/MultimodalModels/VisionLanguageFoundation/Vit/"
        "Perf.html): samples per second on 1, 2, 4, 8, 16 DGX nodes; per-GPU micro-batch 64 for g/14 from its 'Vision "
        "Transformer Training' page, BF16 O2")  # fmt: skip
NEMO_A100 = {1: 693, 2: 1347, 4: 2642, 8: 5454, 16: 10644}
NEMO_H100 = {1: 1428, 2: 2846, 4: 5737, 8: 11222, 16: 21561}


def nemo_runs(gpu: str, published: dict[int, int], link: str, network: str) -> list[dict]:
    return [
        {"run": f"NeMo ViT g/14, {nodes} x 8 {gpu} 80GB", "group": f"nemo-{gpu.lower()}", "nodes": nodes,
         "setup": f"ViT g/14 (1,011 M), 224 px, bf16 O2, 64 per GPU, {nodes} DGX {gpu} node(s)",
         "source": NEMO, "reported": {"images_per_s": published[nodes]},
         "engine": None,  # the planner's recommendation (NeMo's data parallelism: DDP-style gradient all-reduce)
         "flags": ["--model_preset", "vit-g-14", "--per_device_train_batch_size", "64", "--gpus", "8", "--nodes",
                   str(nodes), "--gpu_memory", "80GB", "--gpu_name", gpu, "--precision", "bf16", "--interconnect",
                   link, "--network", network]}
        for nodes in published
    ]  # fmt: skip


# DINOv2 trains on multi-crop images: 2 global crops at 224 px (257 tokens) + 8 local crops at 98 px (7 x 7 + 1 = 50
# tokens), dinov2/configs/ssl_default_config.yaml; the planner's batch is the crops' tokens in 224 px images:
# ViT-g/14, 12 images: 12 x (2 x 257 + 8 x 50) / 257 = 42.7 -> 43; ViT-L/14, 32 images: 113.8 -> 114.
DINOV2 = "DINOv2 (Oquab et al. 2023, arXiv 2304.07193); facebookresearch/dinov2 MODEL_CARD.md, README.md, configs"
EVA = (
    "EVA-CLIP (Sun et al. 2023, arXiv 2303.15389); baaivision/EVA EVA-CLIP/README.md: model card, pre-training scripts"
)
INTERN = ("InternVL (Chen et al. 2023, arXiv 2312.14238) and the OpenGVLab/InternViT-6B-448px-V1-5 model card, as "
          "quoted in the planner's issue: not re-read here")  # fmt: skip

PUBLISHED = [
    {"run": "DINOv2 ViT-g/14", "group": "dinov2", "nodes": 12,
     "setup": "1.1 B, SwiGLU, fp16, FSDP SHARD_GRAD_OP (planned as ZeRO-2), 12 images per A100 (multi-crop: 43 "
              "224 px-equivalents); GPU count not stated, 96 assumed",
     "source": DINOV2, "reported": {"gpu_hours": 22000, "fits": True},
     "engine": "zero2",
     "flags": ["--model_preset", "dinov2-g-14", "--per_device_train_batch_size", "43", "--gpus", "8", "--nodes", "12",
               "--gpu_memory", "80GB", "--gpu_name", "A100", "--precision", "fp16", "--interconnect", "nvlink3",
               "--network", "8x-ib-hdr"]},
    {"run": "DINOv2 ViT-L/14", "group": "dinov2", "nodes": 12,
     "setup": "0.3 B, SwiGLU, fp16, FSDP SHARD_GRAD_OP (planned as ZeRO-2), 32 images per GPU (114 "
              "224 px-equivalents), 96 A100-80GB, about 3.3 days",
     "source": DINOV2, "reported": {"gpu_hours": round(96 * 3.3 * 24), "fits": True},
     "engine": "zero2",
     "flags": ["--model_preset", "dinov2-l-14", "--per_device_train_batch_size", "114", "--gpus", "8", "--nodes", "12",
               "--gpu_memory", "80GB", "--gpu_name", "A100", "--precision", "fp16", "--interconnect", "nvlink3",
               "--network", "8x-ib-hdr"]},
    {"run": "EVA01-CLIP-g/14", "group": "eva", "nodes": 32,
     "setup": "vision tower 1.0 B (of 1.1 B with the text tower), fp16, DeepSpeed ZeRO-1, gradient checkpointing, "
              "global 41K on 256 A100-40GB: 160 per GPU",
     "source": EVA, "reported": {"fits": True},
     "engine": "zero1",
     "flags": ["--model_preset", "vit-g-14", "--per_device_train_batch_size", "160", "--gpus", "8", "--nodes", "32",
               "--gpu_memory", "40GB", "--gpu_name", "A100", "--precision", "fp16", "--gradient_checkpointing",
               "--interconnect", "nvlink3", "--network", "8x-ib-hdr"]},
    {"run": "EVA02-CLIP-E/14", "group": "eva", "nodes": 18,
     "setup": "vision tower 4.4 B (of 4.7 B), fp16, DeepSpeed ZeRO-1, gradient checkpointing, patch dropout 0.5, "
              "800 per GPU on 144 A100-80GB (global 115K)",
     "source": EVA, "reported": {"fits": True},
     "engine": "zero1",
     "flags": ["--model_preset", "eva02-e-14", "--per_device_train_batch_size", "800", "--patch_dropout", "0.5",
               "--gpus", "8", "--nodes", "18", "--gpu_memory", "80GB", "--gpu_name", "A100", "--precision", "fp16",
               "--gradient_checkpointing", "--interconnect", "nvlink3", "--network", "8x-ib-hdr"]},
    *nemo_runs("A100", NEMO_A100, "nvlink3", "8x-ib-hdr"),
    *nemo_runs("H100", NEMO_H100, "nvlink4", "8x-ib-ndr"),
    {"run": "InternViT-6B (448 px, 45 blocks)", "group": "internvit", "nodes": 63,
     "setup": "5.5 B vision encoder only (the run also trained a language model), bf16, ZeRO-1, gradient "
              "checkpointing, 4 per device on 504 GPUs (global 8064 with 4 accumulation steps); A100-80GB assumed",
     "source": INTERN, "reported": {"fits": True},
     "engine": "zero1",
     "flags": ["--model_preset", "internvit-6b-448", "--per_device_train_batch_size", "4", "--gpus", "8", "--nodes",
               "63", "--gpu_memory", "80GB", "--gpu_name", "A100", "--precision", "bf16", "--gradient_checkpointing",
               "--interconnect", "nvlink3", "--network", "8x-ib-hdr"]},
]  # fmt: skip


def command(flags: list[str]) -> str:
    return "python recipes/plan.py " + shlex.join(flags)


def planned(flags: list[str], engine: str | None) -> dict:
    """The planner's figures for one command: the engine (the given one, or the recommendation), its peak memory
    per GPU, whether it fits, the largest batch, and its speed with the communication terms."""
    args, settings = parse_plan_flags(flags, str(DS_CONFIGS))
    result = plan(settings)
    chosen = engine or result.recommended
    option = next(o for o in result.options if o.engine == chosen)
    speed = option.speed
    return {
        "engine": chosen,
        "engine_name": ENGINE_NAMES[chosen],
        "recommended": result.recommended,
        "peak_gib": round(option.memory.peak / GiB, 2),
        "usable_gib": round(option.memory.usable / GiB, 2),
        "fits": option.memory.fits,
        "max_batch": option.max_batch,
        "double_batch_fits": largest_batch(chosen, settings) >= 2 * settings.per_device_batch,
        "step_s": round(speed.step_s, 4),
        "compute_s": round(speed.device_s, 4),
        "gemm_s": round(speed.seconds["compute"], 4),
        "non_gemm_s": round(speed.seconds["non_gemm"], 4),
        "communication_s": round(speed.communication_s, 4),
        "images_per_s": round(speed.images_per_s, 1),
        "achievable_tflops": round(settings.achievable_tflops, 2),
        "hbm_gbps": settings.hbm_gbps,
        "peak_tflops": round(settings.achievable_tflops / args.mfu, 2),
        "train_gflop_per_image": round(train_flops_per_image(settings.shape) / 1e9, 2),
        "communication": [
            {
                "collective": t.collective,
                "what": t.what,
                "gb_per_rank": round(t.bytes_per_rank / 1e9, 4),
                "link": t.link,
                "gbps": t.gbps,
                "seconds": round(t.seconds, 5),
            }
            for t in speed.terms
        ],  # fmt: skip
    }


def compare(run: dict) -> dict:
    row = {key: run[key] for key in ("run", "group", "nodes", "setup", "source", "reported")}
    row["command"] = command(run["flags"])
    row["planner"] = planned(run["flags"], run["engine"])
    reported = run["reported"].get("images_per_s")
    if reported:
        per_node = row["planner"]["images_per_s"] / run["nodes"]
        row["planner"]["images_per_s_per_node"] = round(per_node, 1)
        row["ratio"] = round(per_node / (reported / run["nodes"]), 4)
        # The model-FLOPs utilisation the published throughput implies, at the planner's FLOPs per image:
        # images/s per GPU x FLOPs per image / the datasheet's dense peak.
        gpus = run["nodes"] * 8
        flops = reported / gpus * row["planner"]["train_gflop_per_image"] * 1e9
        row["reported"]["implied_mfu"] = round(flops / (row["planner"]["peak_tflops"] * 1e12), 4)
    return row


def scaling_efficiency(rows: list[dict], group: str) -> dict:
    """16 nodes' throughput over 16 x one node's, published and planned."""
    by_nodes = {r["nodes"]: r for r in rows if r["group"] == group}
    one, many = by_nodes[1], by_nodes[16]
    published = many["reported"]["images_per_s"] / (16 * one["reported"]["images_per_s"])
    predicted = many["planner"]["images_per_s"] / (16 * one["planner"]["images_per_s"])
    return {"published": round(published, 4), "planner": round(predicted, 4),
            "difference_points": round(100 * (predicted - published), 2)}  # fmt: skip


# The projection: H100 SXM 80GB nodes of 8, NVLink 4, and two networks; NeMo's micro-batches (H/14 128, g/14 64)
# for weak scaling, NeMo's global batch 4096 for strong scaling.
PROJECTION_MODELS = {"vit-h-14": 128, "vit-g-14": 64}
PROJECTION_GPUS = (64, 256, 1024)
PROJECTION_NETWORKS = ("8x-ib-ndr", "ib-ndr")
GLOBAL_BATCH = 4096


def projection() -> list[dict]:
    rows = []
    for network in PROJECTION_NETWORKS:
        for model, micro in PROJECTION_MODELS.items():
            for scaling in ("strong", "weak"):
                for gpus in PROJECTION_GPUS:
                    batch = GLOBAL_BATCH // gpus if scaling == "strong" else micro
                    flags = ["--model_preset", model, "--per_device_train_batch_size", str(batch), "--gpus", "8",
                             "--nodes", str(gpus // 8), "--gpu_memory", "80GB", "--gpu_name", "H100",
                             "--precision", "bf16", "--interconnect", "nvlink4", "--network", network]  # fmt: skip
                    args, settings = parse_plan_flags(flags, str(DS_CONFIGS))
                    result = plan(settings)
                    fitting = [o for o in result.options if o.memory.fits]
                    fastest = min(fitting, key=lambda o: o.speed.step_s)
                    chosen = next(o for o in result.options if o.engine == result.recommended)
                    rows.append({
                        "model": model, "scaling": scaling, "network": network, "gpus": gpus, "batch": batch,
                        "command": command(flags), "recommended": result.recommended, "fastest": fastest.engine,
                        "step_s": round(chosen.speed.step_s, 4),
                        "compute_s": round(chosen.speed.device_s, 4),
                        "communication_s": round(chosen.speed.communication_s, 4),
                        "communication_bound": chosen.speed.communication_bound,
                        "images_per_s": round(chosen.speed.images_per_s, 1),
                        "fastest_images_per_s": round(fastest.speed.images_per_s, 1),
                        "fastest_communication_bound": fastest.speed.communication_bound,
                        "fastest_over_recommended": round(fastest.speed.images_per_s / chosen.speed.images_per_s, 4),
                    })  # fmt: skip
    return rows


# docs/planner.md's worked example: ViT-g/14 on 32 DGX H100 nodes at NeMo's global batch 4096 (16 per GPU).
WORKED_EXAMPLE = [
    "--model_preset",
    "vit-g-14",
    "--per_device_train_batch_size",
    "16",
    "--gpus",
    "8",
    "--nodes",
    "32",
    "--gpu_memory",
    "80GB",
    "--gpu_name",
    "H100",
    "--interconnect",
    "nvlink4",
    "--network",
    "8x-ib-ndr",
]


def worked_example() -> dict:
    """The example's command and what recipes/plan.py prints for it (the same functions, in process)."""
    args, settings = parse_plan_flags(WORKED_EXAMPLE, str(DS_CONFIGS))
    return {"command": command(WORKED_EXAMPLE), "output": format_plan(plan(settings))}


def plot(rows: list[dict], path: str) -> None:
    """Images/s per GPU against GPUs: the recommended engine (solid) and the fastest that fits (dotted), both
    networks, both models, strong and weak scaling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, network in zip(axes, PROJECTION_NETWORKS):
        for model in PROJECTION_MODELS:
            for scaling, marker in (("strong", "o"), ("weak", "s")):
                cut = [r for r in rows if (r["network"], r["model"], r["scaling"]) == (network, model, scaling)]
                gpus = [r["gpus"] for r in cut]
                line = ax.plot(gpus, [r["images_per_s"] / r["gpus"] for r in cut], marker=marker,
                               label=f"{model}, {scaling}")[0]  # fmt: skip
                ax.plot(gpus, [r["fastest_images_per_s"] / r["gpus"] for r in cut], ":", color=line.get_color())
                for r in cut:
                    if r["communication_bound"]:
                        ax.annotate("comm-bound", (r["gpus"], r["images_per_s"] / r["gpus"]), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(PROJECTION_GPUS, [str(g) for g in PROJECTION_GPUS])
        ax.set_xlabel("H100 GPUs (8 per node)")
        ax.set_title(f"network {network}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("planned images/s per GPU")
    axes[0].legend(fontsize=8)
    fig.suptitle("Planner projection (estimates): recommended engine solid, fastest fitting dotted", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None)
    parser.add_argument("--plot", default=None, help="Write the projection's plot (PNG) here.")
    args = parser.parse_args()
    rows = [compare(run) for run in PUBLISHED]
    projected = projection()
    if args.plot:
        plot(projected, args.plot)
    report_result(
        {
            "what": "the planner against published large-ViT runs, and its projection to 1,024 GPUs",
            "hardware": HARDWARE,
            "runs": rows,
            "scaling_efficiency": {g: scaling_efficiency(rows, g) for g in ("nemo-a100", "nemo-h100")},
            "projection": projected,
            "worked_example": worked_example(),
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
