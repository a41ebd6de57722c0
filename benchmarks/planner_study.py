"""The planner's speed model against the study's published strong scaling (ViT-B/16, fp32, 64 images per T4).

Only the single-GPU epoch is used to calibrate: it gives the achievable TFLOP/s (no communication in it). Every
other row is predicted from the collective volumes and two bandwidths that the study does not state, so they are
ASSUMPTIONS: inside a node NCCL used its SHM transport between the 8 T4s (the logs say "via SHM/direct/direct",
PCIe 3.0, no peer-to-peer), taken as the `pcie3` preset; between nodes RoCE on Mellanox mlx5 NICs of unstated speed,
taken as 100 Gb/s. `--intra_node_gbps` shows how the prediction moves with the first (the second never binds here).

    python benchmarks/planner_study.py --output benchmarks/results/planner_study.json
"""

import argparse
import sys
from pathlib import Path

from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's package

from hf_vit_scaling.models.presets import MODEL_PRESETS  # noqa: E402
from hf_vit_scaling.planning.memory import PlanSettings  # noqa: E402
from hf_vit_scaling.planning.shapes import INTERCONNECTS, NETWORKS, vit_shape  # noqa: E402
from hf_vit_scaling.planning.speed import achievable_tflops_from_epoch, epoch_seconds  # noqa: E402

# The study's strong scaling on CIFAR-100 (50,000 training images), 64 images per GPU, fp32, 8 T4 per node.
TRAIN_IMAGES = 50_000
GPUS_PER_NODE = 8
PUBLISHED = {1: 1817.65, 2: 869.35, 4: 482.73, 8: 238.07, 16: 122.50, 32: 61.32}


def predict(intra_gbps: float, inter_gbps: float) -> dict:
    shape = vit_shape(MODEL_PRESETS["vit-b-16"], num_labels=100)
    tflops = achievable_tflops_from_epoch(shape, TRAIN_IMAGES, PUBLISHED[1])
    rows = []
    for gpus, published in PUBLISHED.items():
        settings = PlanSettings(
            shape=shape,
            per_device_batch=64,
            gpus_per_node=min(gpus, GPUS_PER_NODE),
            nodes=max(1, gpus // GPUS_PER_NODE),
            gpu_memory_bytes=16 * 1024**3,
            precision="fp32",
            achievable_tflops=tflops,
            intra_node_gbps=intra_gbps,
            inter_node_gbps=inter_gbps,
        )
        # The study ran DeepSpeed ZeRO stage 0: one all-reduce of the fp32 gradients per step, the planner's "ddp"
        # volume (2(N-1)/N x 4Ψ). ZeRO-0 reduces after backward, so the no-overlap sum is its schedule too.
        epoch = epoch_seconds("ddp", settings, TRAIN_IMAGES)
        rows.append(
            {
                "gpus": gpus,
                "nodes": settings.nodes,
                "published_s": published,
                "predicted_s": round(epoch["epoch_s"], 2),
                "compute_s": round(epoch["compute_s"], 2),
                "communication_s": round(epoch["communication_s"], 2),
                "steps": epoch["steps"],
                "error": round(epoch["epoch_s"] / published - 1, 4),
            }
        )
    return {
        "achievable_tflops": round(tflops, 4),
        "intra_node_gbps": intra_gbps,
        "inter_node_gbps": inter_gbps,
        "parameters": shape.num_parameters,
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--intra_node_gbps",
        type=float,
        nargs="*",
        default=[INTERCONNECTS["pcie3"], 5.0],
        help="Bus bandwidths inside a node to try (GB/s); the first is the headline.",
    )
    parser.add_argument("--inter_node_gbps", type=float, default=NETWORKS["roce100"])
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    results = [predict(intra, args.inter_node_gbps) for intra in args.intra_node_gbps]
    for result in results:
        print(
            f"\nintra-node {result['intra_node_gbps']:g} GB/s, inter-node {result['inter_node_gbps']:g} GB/s, "
            f"calibrated {result['achievable_tflops']:.3f} TFLOP/s",
            file=sys.stderr,
        )
        print(
            "| GPUs | nodes | published epoch (s) | predicted (s) | compute (s) | communication (s) | error |",
            file=sys.stderr,
        )
        print("|---|---|---|---|---|---|---|", file=sys.stderr)
        for r in result["rows"]:
            print(
                f"| {r['gpus']} | {r['nodes']} | {r['published_s']:.2f} | {r['predicted_s']:.2f} | "
                f"{r['compute_s']:.2f} | {r['communication_s']:.2f} | {r['error']:+.1%} |",
                file=sys.stderr,
            )
    report_result(
        {
            "study": "strong scaling, ViT-B/16 fp32, CIFAR-100, 64 per T4",
            "train_images": TRAIN_IMAGES,
            "runs": results,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
