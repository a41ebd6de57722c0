"""Plan a ViT training run before launching it: memory per rank, the largest batch that fits and the step time
for each engine the project runs, and which engine to use (`recommend`, with its reasons and sources).

Memory comes from `memory.engine_memory` and `memory.largest_batch`, speed from `speed.engine_speed`, the model
and the engines from `shapes`. recipes/plan.py is the command line that prints a plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hf_vit_scaling.models.flops import train_flops_per_image
from hf_vit_scaling.planning.memory import MemoryEstimate, PlanSettings, engine_memory, largest_batch
from hf_vit_scaling.planning.shapes import ALL_ENGINES, ENGINE_FLAGS, ENGINE_NAMES, ENGINES, HSDP, GiB
from hf_vit_scaling.planning.speed import SpeedEstimate, engine_speed


@dataclass
class EngineOption:
    engine: str
    name: str
    flags: str
    memory: MemoryEstimate
    speed: SpeedEstimate
    max_batch: int


@dataclass
class Plan:
    settings: PlanSettings
    options: list[EngineOption]
    recommended: str | None
    reason: str

    def to_dict(self) -> dict:
        settings = asdict(self.settings)
        settings.pop("ds_configs")
        settings["shape"]["tokens"] = self.settings.shape.tokens
        settings["shape"]["num_parameters"] = self.settings.shape.num_parameters
        settings["world_size"] = self.settings.world_size
        settings["train_flops_per_image"] = train_flops_per_image(self.settings.shape)
        if self.settings.teacher is not None:
            settings["teacher"]["weight_bytes"] = self.settings.teacher.weight_bytes(self.settings.precision)
        return {
            "version": 1,
            "settings": settings,
            "options": [asdict(option) for option in self.options],
            "recommended": self.recommended,
            "reason": self.reason,
            "notes": [
                "Estimates, not measurements. Step time = compute (GEMM FLOPs at the achievable TFLOP/s + non-GEMM "
                "bytes at the HBM bandwidth) + communication with no overlap; bandwidths, achievable TFLOP/s and CPU "
                "Adam speed are stated inputs (assumptions unless you measured them).",
                "Peak memory = static + max(end of forward, start of backward, end of backward, optimizer step); the "
                "margin is kept free for the CUDA context, NCCL buffers and allocator fragmentation.",
            ],
        }


def recommend(options: list[EngineOption]) -> tuple[str | None, str]:
    """The engine to use and why.

    Plain data parallelism first whenever it fits: it has the least communication and no sharding machinery, and
    DeepSpeed's maintainers advise ZeRO only when the model or batch does not fit (deepspeedai/DeepSpeed issue 1436,
    a maintainer: "ZeRO is best used when model size ... or batch size will not [fit in] the available GPU memory.
    The techniques that ZeRO uses to reduce memory consumption do make backward() slower"; the Transformers
    multi-GPU guide likewise lists DDP first when the model fits on one GPU). Otherwise the fastest
    estimated option that fits (ties go to the simpler engine, in `ENGINES` order). When nothing fits at the
    requested batch: the option that fits the largest batch, with gradient accumulation to keep the global batch.
    """
    by_engine = {o.engine: o for o in options}
    if "ddp" in by_engine and by_engine["ddp"].memory.fits:
        ddp = by_engine["ddp"]
        return "ddp", (
            f"DDP fits ({ddp.memory.peak / GiB:.1f} of {ddp.memory.usable / GiB:.1f} GiB usable): plain "
            "data parallelism has the least communication; ZeRO/FSDP only save memory you do not need "
            "(DeepSpeed's maintainers advise ZeRO when the model or batch does not fit)."
        )
    fitting = [o for o in options if o.memory.fits]
    if fitting:
        best = min(fitting, key=lambda o: (round(o.speed.step_s, 9), ALL_ENGINES.index(o.engine)))
        why_not_ddp = ""
        if "ddp" in by_engine:
            why_not_ddp = (
                f"DDP needs {by_engine['ddp'].memory.peak / GiB:.1f} GiB > "
                f"{by_engine['ddp'].memory.usable / GiB:.1f} GiB usable; "
            )
        return best.engine, (
            f"{why_not_ddp}{best.name} is the fastest option that fits "
            f"({best.speed.step_s:.3f} s/step, {best.memory.peak / GiB:.1f} GiB)."
        )
    best = max(options, key=lambda o: (o.max_batch, -o.speed.step_s), default=None)
    if best is None or best.max_batch == 0:
        return None, (
            "Nothing fits even at batch 1. Fix: --gradient_checkpointing, more GPUs (ZeRO-3/FSDP shard "
            "over them), --sequence_parallel_size for long sequences, bf16, or a smaller model/image."
        )
    return best.engine, (
        f"Nothing fits at the requested batch; {best.name} fits up to {best.max_batch} per device: use "
        "--per_device_train_batch_size with --gradient_accumulation_steps to keep the global batch, "
        "or add --gradient_checkpointing."
    )


def plan(settings: PlanSettings, engines: tuple[str, ...] | None = None) -> Plan:
    """Memory, speed and the largest batch for every engine (HSDP too on more than one node: on one it is FSDP2
    full sharding), and the recommendation."""
    if engines is None:
        engines = ENGINES + ((HSDP,) if settings.nodes > 1 else ())
    options = []
    for engine in engines:
        if settings.sequence_parallel_size > 1 and engine in ("ddp", "fsdp2", HSDP):
            continue  # this project's sequence parallelism runs on DeepSpeed's process groups only
        options.append(
            EngineOption(
                engine=engine,
                name=ENGINE_NAMES[engine],
                flags=ENGINE_FLAGS[engine],
                memory=engine_memory(engine, settings),
                speed=engine_speed(engine, settings),
                max_batch=largest_batch(engine, settings),
            )
        )
    recommended, reason = recommend(options)
    return Plan(settings=settings, options=options, recommended=recommended, reason=reason)
