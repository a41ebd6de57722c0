"""Which training engine runs a recipe, and the setup it needs before the model is built.

One code path per engine, all through the Trainer:
- DeepSpeed ZeRO 0-3 (and offload): `--ds_config` resolved into `TrainingArguments.deepspeed`; the Trainer builds
  the DeepSpeed engine from that config, with every "auto" value filled from the flags.
- FSDP2: the Trainer's own `--fsdp --fsdp_config fsdp_configs/fsdp2.json` (TrainingArguments.fsdp_plugin_args ->
  accelerate's FullyShardedDataParallelPlugin -> torch's `fully_shard` on every `ViTLayer` and the root).
- the plain Trainer: one process, or DDP when several processes are launched.

`engine_of` makes the run's engine from what TrainingArguments built (`parse_args` hands it those values once), and
every later reader (the checks, the world's setup, the learning-rate scaling, the resume, the reports) uses that
`Engine`. Its `ds_config` is the very dict the Trainer builds DeepSpeed from; the values the project reads from it are
read once, when the Engine is made (`Engine.reading`, `deepspeed_config.read_config`), and every value the project
sets in it is written here: `Engine.set_values` (the scaled lr, sequence parallelism's batch arithmetic, universal
loading) or `Engine.resolve_for_model` (bucket sizes, ZeRO-3 persistence, leaf modules and linear, timers: chosen
from the model's tensors), each recorded with its reason in `Engine.resolved`, which the throughput report and the
model card print. transformers' `trainer_config_finalize` then fills only the "auto" values left (batch, precision,
clipping).
"""

from dataclasses import dataclass, field
from typing import Any

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.deepspeed_config import ConfigReading, model_sized_values, read_config
from hf_vit_scaling.parallel.distributed import init_deepspeed_comm
from hf_vit_scaling.parallel.engine_routes import NO_ROUTE, EngineRoute, section_of


@dataclass(frozen=True)
class Engine:
    """The engine of this run: `kind` is "deepspeed", "fsdp" or "trainer" (plain Trainer: DDP with several
    processes)."""

    kind: str
    ds_config: dict[str, Any] | None = None  # the config TrainingArguments loaded, "auto" values filled
    ds_config_path: str | None = None
    route: str = EngineRoute.route  # how the user named the engine (`engine_routes`): a flag, or accelerate's plugin
    fsdp_plugin_args: dict[str, Any] = field(default_factory=dict)  # TrainingArguments.fsdp_plugin_args
    ds_config_mismatches: tuple[str, ...] = ()  # config values that contradict the flags (transformers' list)
    resolved: dict[str, dict] = field(default_factory=dict, compare=False)  # {dotted key: {"value", "reason"}}
    # DeepSpeed's per-tensor loops replaced in this process (`deepspeed_fast_paths`): {name: "on" or why off}
    fast_paths: dict[str, str] = field(default_factory=dict, compare=False)
    # Read once from the config (nothing the project sets changes them): what the project reads from the DeepSpeed
    # dict (`ConfigReading`: the stage, the offload, the sections DeepSpeed builds itself, ...), and from it the ZeRO
    # stage (None without DeepSpeed) and which states are offloaded where, e.g. {"optimizer": "cpu"}.
    reading: ConfigReading = field(init=False, default_factory=ConfigReading, compare=False)
    zero_stage: int | None = field(init=False, default=None)
    offload: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self):
        reading = read_config(self.ds_config)
        if self.kind == "fsdp":  # CPUOffloadPolicy offloads both
            offload = {"optimizer": "cpu", "param": "cpu"} if self.fsdp_cpu_offload else {}
        else:
            offload = reading.offload
        object.__setattr__(self, "reading", reading)
        object.__setattr__(self, "zero_stage", reading.zero_stage)
        object.__setattr__(self, "offload", offload)

    def set_values(self, values: dict[str, Any], reason: str) -> None:
        """Write {dotted key: value} into the run's DeepSpeed dict ("zero_optimization.reduce_bucket_size"; nothing
        without DeepSpeed), recording why."""
        if self.ds_config is None or not values:
            return
        for dotted, value in values.items():
            node, key = section_of(self.ds_config, dotted, create=True)
            node[key] = value
        self.resolved.update({key: {"value": value, "reason": reason} for key, value in values.items()})

    def resolve_for_model(self, model, world_size: int, on_gpu: bool = True) -> None:
        """The DeepSpeed values that depend on the model, from its trainable tensors
        (`deepspeed_config.model_sized_values`): call once the model is built, before the Trainer."""
        if self.ds_config is None:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        numels = [int(getattr(p, "ds_numel", p.numel())) for p in params]  # ZeRO-3 built it partitioned
        frozen = [int(getattr(p, "ds_numel", p.numel())) for p in model.parameters() if not p.requires_grad]
        small = [n for p, n in zip(params, numels) if len(getattr(p, "ds_shape", p.shape)) < 2]
        layer = encoder_layer_class(model)
        for key, (value, reason) in model_sized_values(
            self.reading, numels, max(small, default=0), world_size, layer, on_gpu, max(frozen, default=0)
        ).items():
            self.set_values({key: value}, reason)
        if self.resolved.get("zero_optimization.memory_efficient_linear", {}).get("value") is False:
            restore_torch_linear()

    def fast_paths_summary(self) -> str:
        """One line on DeepSpeed's fast paths in this process: "12 of 17 on: a, b, ...; off: c (why), ..."."""
        on = [name for name, status in self.fast_paths.items() if status == "on"]
        off = [f"{name} {status}" for name, status in self.fast_paths.items() if status != "on"]
        return (
            f"{len(on)} of {len(self.fast_paths)} on"
            + (f": {', '.join(on)}" if on else "")
            + (f"; {'; '.join(off)}" if off else "")
        )

    @property
    def fsdp_cpu_offload(self) -> bool:
        return bool(self.fsdp_plugin_args.get("cpu_offload"))

    def label(self) -> str:
        """Short name for the done line and the reports: "ZeRO-2", "FSDP2", or "no DeepSpeed" (plain Trainer)."""
        if self.kind == "deepspeed":
            return f"ZeRO-{self.zero_stage}"
        if self.kind == "fsdp":
            return "FSDP2" + (" + CPU offload" if self.fsdp_cpu_offload else "")
        return "no DeepSpeed"

    def describe(self) -> str:
        """What the model card's engine row says trained the model (its ds_config row names the file)."""
        if self.kind == "deepspeed":
            offload = ", ".join(f"{state} to {device}" for state, device in self.offload.items())
            return f"DeepSpeed {self.label()}" + (f" (offload: {offload})" if offload else "")
        if self.kind == "fsdp":
            args = self.fsdp_plugin_args
            resharded = "resharded after forward" if args.get("reshard_after_forward", True) else "kept after forward"
            return f"{self.label()} (fully_shard per ViTLayer, parameters {resharded}, {args.get('state_dict_type')})"
        return "none (plain Trainer)"


def restore_torch_linear() -> None:
    """Put torch's `torch.nn.functional.linear` back where ZeRO-3's `zero.Init` replaced it for the whole process with
    DeepSpeed's memory-efficient linear while the model was built (`Init._enable_mem_efficient_linear`, "This will
    persist unless manually reset"): reset as DeepSpeed's own DeepCompile does (deepspeed/compile/init_z3.py). Called
    once `memory_efficient_linear` is resolved off; a later `zero.Init` reads it off from the same dict."""
    import torch
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as Init

    original = getattr(Init, "linear_bk", None)
    if original is not None and torch.nn.functional.linear is zero3_linear_wrap:
        torch.nn.functional.linear = original


def encoder_layer_class(model) -> str | None:
    """The fully qualified class of the repeated block in a model's encoder (transformers' `ViTLayer`, ...): the
    modules of its largest `ModuleList`; None when it has none (a CNN's stages hold no such list)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return None
    block = type(max(lists, key=len)[0])
    return f"{block.__module__}.{block.__qualname__}"


def engine_of(
    hf_deepspeed_config=None,
    fsdp_plugin_args: dict | None = None,
    ds_config_path: str | None = None,
    route: EngineRoute = NO_ROUTE,
) -> Engine:
    """The engine of a run, from what TrainingArguments built (parse_args already checked and loaded any DeepSpeed/FSDP
    config, and hands over these values once): `hf_deepspeed_config`, transformers' DeepSpeed config when DeepSpeed
    runs (its `config` is the dict the Trainer will use, not a copy; its `mismatches`, config values that contradict
    the flags); else `fsdp_plugin_args` when FSDP runs. `ds_config_path`: the file the DeepSpeed dict was read from;
    `route`: how the user named the engine, and the Trainer-owned keys the config left out (set to "auto", so the
    Trainer filled them: recorded in `resolved`)."""
    if hf_deepspeed_config is not None:
        mismatches = tuple(m.strip("- ").strip() for m in getattr(hf_deepspeed_config, "mismatches", []))
        engine = Engine(
            "deepspeed", hf_deepspeed_config.config, ds_config_path, route.route, ds_config_mismatches=mismatches
        )
        for dotted, reason in route.filled:  # their values as the Trainer filled them
            node, key = section_of(engine.ds_config, dotted)
            engine.resolved[dotted] = {"value": node.get(key), "reason": reason}
        return engine
    if fsdp_plugin_args:
        return Engine("fsdp", fsdp_plugin_args=dict(fsdp_plugin_args), route=route.route)
    return Engine("trainer", route=route.route)


def start_engine(engine: Engine, device_type: str, mixed_precision: str) -> None:
    """What must exist before the model is built: ZeRO-3 builds it partitioned, so DeepSpeed must know the world (and
    DeepSpeed's fast paths are installed in this process before the Trainer builds the engine);
    FSDP2 on a CPU world (`device_type` "cpu") needs accelerate told, with the Trainer's `mixed_precision` (see
    `select_fsdp_on_cpu`)."""
    if engine.kind == "deepspeed":
        from hf_vit_scaling.parallel.fast_paths.registry import (  # DeepSpeed runs only
            ENV_SWITCH,
            install_deepspeed_fast_paths,
        )

        check_deepspeed_version()
        init_deepspeed_comm()
        engine.fast_paths.update(install_deepspeed_fast_paths())
        logger.info(
            f"DeepSpeed {engine.label()} from {engine.route}; fast paths "
            f"(hf_vit_scaling/parallel/fast_paths/README.md, {ENV_SWITCH}=0 turns them off): "
            f"{engine.fast_paths_summary()}"
        )
    elif engine.kind == "fsdp" and device_type == "cpu":
        select_fsdp_on_cpu(engine.fsdp_plugin_args, mixed_precision)


def tested_deepspeed_range() -> str | None:
    """The DeepSpeed versions the installed package allows (setup.cfg's `deepspeed>=...,<=...`, as pip recorded it
    in the package's metadata); None when the package is not installed (a checkout on the path)."""
    import importlib.metadata

    try:
        requirements = importlib.metadata.requires("hf-vit-scaling") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [r.split(";")[0].strip()[len("deepspeed") :] for r in requirements if r.startswith("deepspeed")]
    return found[0] if found else None


def check_deepspeed_version(installed: str | None = None, allowed: str | None = None) -> None:
    """One error line, before the model is built, when the DeepSpeed this process imports is outside the range the
    project tests (a wheel installed with --no-deps, or one changed after `pip install -e .`): the fast paths are
    pinned to that range's source, and DeepSpeed's own behaviour differs across versions (ds_configs/README.md)."""
    from packaging.specifiers import SpecifierSet

    if installed is None:
        import deepspeed

        installed = deepspeed.__version__
    allowed = allowed if allowed is not None else tested_deepspeed_range()
    if allowed and installed not in SpecifierSet(allowed):
        raise UserInputError(
            f"DeepSpeed {installed} is outside the versions this project tests (deepspeed{allowed}). Fix: "
            f"pip install 'deepspeed{allowed}'."
        )


def select_fsdp_on_cpu(fsdp_plugin_args: dict, mixed_precision: str) -> None:
    """Make accelerate run FSDP2 on a CPU (gloo) world, as it does on GPUs.

    accelerate turns FSDP on only for accelerator worlds (the version read: docs/recipe.md, "torch.compile"):
    `AcceleratorState.__init__` checks the FSDP plugin inside `elif distributed_type in [MULTI_GPU, MULTI_XPU, ...]`,
    which leaves out MULTI_CPU, so on a CPU the Trainer trains plain DDP while `--fsdp` is set (measured:
    `DistributedDataParallel` wraps the model). torch's FSDP2
    (`fully_shard`) itself runs on CPU over gloo. So we do what that branch does, once, before the Trainer: build the
    shared state with the plugin (the mixed precision the Trainer will ask for) and mark it FSDP, in AcceleratorState
    and in PartialState as accelerate does at the end of `AcceleratorState.__init__`. The Trainer's Accelerator then
    finds the state set up, and everything after (fully_shard, optimizer re-binding, sharded saves) is accelerate's
    and transformers' own FSDP2 code. On GPUs this function is not called.
    """
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**fsdp_plugin_args)
    state = Accelerator(mixed_precision=mixed_precision, fsdp_plugin=plugin).state
    if state.distributed_type == DistributedType.FSDP:
        return  # accelerate selected it itself (a newer version)
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
