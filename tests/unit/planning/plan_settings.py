"""The planner settings the planning tests start from: ViT-B/16, 32 images per GPU, 8 GPUs of 40 GiB per node,
bf16; each test overrides what it varies."""

from hf_vit_scaling.models.presets import MODEL_PRESETS
from hf_vit_scaling.planning.memory import PlanSettings
from hf_vit_scaling.planning.shapes import GiB, vit_shape


def settings(**overrides) -> PlanSettings:
    values = dict(
        shape=vit_shape(MODEL_PRESETS["vit-b-16"]),
        per_device_batch=32,
        gpus_per_node=8,
        gpu_memory_bytes=40 * GiB,
        precision="bf16",
        ds_configs={},
    )
    values.update(overrides)
    return PlanSettings(**values)
