"""DeepSpeed ZeRO's per-tensor Python loops, replaced where an exact equivalent is cheaper.

A ViT has many small tensors (72 in the tiny preset, 200 in ViT-B/16), and DeepSpeed's ZeRO optimizers walk them
one by one in Python every step: the gradient norm (an fp64 copy, a `vector_norm` and a `.to()` per tensor), the
re-pointing of every parameter at the slice of the flat buffer it already points at, and, on a world of one, a
flatten, an all-reduce and a copy back of every gradient (ZeRO-3: a reduce-scatter). What each cost and what is left:
benchmarks/README.md, "Engine overhead". Each replacement below computes the same values as the DeepSpeed method it
stands for (tests/launched/test_deepspeed_fast_paths.py compares whole runs bit for bit on the CPU on one process and
on two) and calls the original where its condition does not hold:

- `zero12_grad_norm`, `zero3_grad_norm`: the L2 norm of the gradients with torch's multi-tensor norm
  (`torch._foreach_norm`, what `torch.nn.utils.clip_grad_norm_` and so the plain Trainer use) instead of one
  `vector_norm` per tensor. On the CPU it equals DeepSpeed's per-tensor norm bit for bit; on CUDA the multi-tensor
  kernel may differ from it in the last bits, as the plain Trainer's norm does. On a world of one the sum is not
  all-reduced: a sum over one rank is that rank's own;
- `zero12_bit16_views`: `_update_model_bit16_weights` skipped when every parameter already is its slice of the flat
  buffer (same address and shape), as it is after the first step;
- `zero12_single_rank_reduce`: on a data-parallel world of one, with no sequence parallelism and the gradients
  already in the communication dtype, the all-reduce of a gradient bucket is x / 1 summed over one rank: x. The
  bucket is left as it is instead of flattened, reduced and copied back;
- `zero3_single_rank_reduce_scatter`: the same for ZeRO-3's coalesced reduce-scatter: one flat copy of the
  gradients (DeepSpeed's output buffer), without the divide by one and the collective;
- `zero3_whole_module_hooks`: ZeRO-3 with every parameter persistent (what the recipe resolves on one process,
  nothing to shard over, and on several for a model whose tensors are all under DeepSpeed's persistence threshold)
  and nothing offloaded: DeepSpeed's four hooks on every module, which would gather and release nothing, are removed
  once the engine has made them (as its own `unwrap_model_for_generation` does), and one hook on the root gathers
  whatever a step left released;
- `zero12_grouped_norm`: on several processes, ZeRO-1/2's gradient norm all-reduces each parameter group's sum of
  squares on its own (2 groups under the Trainer: decay and no decay); one all-reduce of the stacked sums instead. It
  adds the same sums over the ranks: bit for bit on two processes (tested); on more, an all-reduce of two elements
  may add the ranks' sums in another order than one of one element, a difference in the last bit at most (ZeRO-3's
  counterpart saved less than the leave-one-out rule asks wherever it was measured and was removed:
  benchmarks/README.md, "What each fast path saves");
- `zero12_one_param_gather`: on several CPU processes (gloo: every collective a round trip), the updated weights of
  all groups in one all-gather instead of one per group. Inside `weight_gathers.weights_gathered_late` (the recipe's
  Trainer, when no callback reads the weights at a step's edges) the gather is left in flight while the Trainer
  loads the next batch, and finished before anything reads a weight;
- `zero3_one_param_gather`: ZeRO-3's blocking gather of a list of parameters (the persistent ones after every step,
  a `GatheredParameters` block) in DeepSpeed's own coalesced gather, one collective, instead of one per parameter;
- `zero2_no_gradient_hooks` with `zero2_reduce_at_epilogue`: ZeRO-2 with one bucket for every gradient and nothing to
  overlap (one process or a CPU), no offload, one accumulation step: no hook per gradient; the engine's epilogue files
  every gradient, as ZeRO-1 does, and reduces the bucket as before. On two processes each element is still the sum
  of the same two values (tested bit for bit); on more, the bucket's other order may give the ring's sum another
  order, a difference in the last bit at most, as for the grouped norms;
- `zero12_file_at_once`: ZeRO-1's reduction, and ZeRO-2's at the epilogue, file every gradient in the bucket in one
  loop instead of a chain of a dozen Python calls per tensor (`reduce_independent_p_g_buckets_and_remove_grads` and
  its callers, pinned too), where every branch of that chain but the filing does nothing
  (`zero12.file_every_gradient`): the same bucket, in the same order;
- `zero3_whole_through_step` (with its `_release` and `_gather` parts): the same ZeRO-3 case as
  `zero3_whole_module_hooks`: DeepSpeed releases every parameter at a step's start and gathers all of them back into
  new tensors at its end; they stay, and the updated partitions are gathered into them in place, one collective (the
  same bytes). Only the step's own release is left out (a checkpoint's is DeepSpeed's); the first part marks the step
  only while the other two are installed;
- `cpu_numa_cores_once`: DeepSpeed's CPU accelerator starts `numactl --hardware` at every `device_count()`
  (ZeRO-3 asks once a step); asked once.

Each is installed only over the DeepSpeed source it was written and tested against (`FastPath.source_sha` pins a hash
of the original's source, `also_pins` those of the methods whose work it does itself): after a DeepSpeed upgrade that
changes a method, its fast path stays off and the run reports so, and
`tests/unit/parallel/test_fast_paths.py` fails until the replacement is reviewed; a method that is missing
(another DeepSpeed version) turns its path off the same way, never an error. A path made of parts (`requires`) is
installed whole or not at all. Set `HF_VIT_SCALING_DEEPSPEED_FAST_PATHS=0` to run DeepSpeed's own code unchanged (it
also puts back any method replaced earlier in the process). The replacements:
`fast_paths/zero12.py` and `fast_paths/zero3.py`.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.fast_paths.common import RAN
from hf_vit_scaling.parallel.fast_paths.zero3 import (
    make_zero3_grad_norm,
    make_zero3_one_param_gather,
    make_zero3_single_rank_reduce_scatter,
    make_zero3_step_begins_whole,
    make_zero3_step_ends_whole,
    make_zero3_step_keeps_whole,
    make_zero3_whole_module_hooks,
)
from hf_vit_scaling.parallel.fast_paths.zero12 import (
    make_zero2_no_gradient_hooks,
    make_zero2_reduce_at_epilogue,
    make_zero12_bit16_views,
    make_zero12_file_at_once,
    make_zero12_grad_norm,
    make_zero12_grouped_norm,
    make_zero12_one_param_gather,
    make_zero12_single_rank_reduce,
)

ENV_SWITCH = "HF_VIT_SCALING_DEEPSPEED_FAST_PATHS"


@dataclass(frozen=True)
class FastPath:
    name: str
    module: str  # where the replaced attribute lives
    owner: str | None  # a class in `module`, or None for a module-level function
    attribute: str
    source_sha: str  # sha256 of the original's source, first 16 hex digits
    make: Callable  # make(original) -> replacement
    also_pins: tuple[tuple[str, str], ...] = ()  # (attribute of the owner, sha): methods whose work it does itself
    requires: tuple[str, ...] = ()  # fast paths without which this one is not installed either (its other parts)


def undecorated(function):
    """The function under DeepSpeed's `instrument_w_nvtx` (a closure over it named `wrapped_fn`), else itself."""
    if function.__name__ == "wrapped_fn" and function.__closure__:
        inner = [cell.cell_contents for cell in function.__closure__ if inspect.isfunction(cell.cell_contents)]
        return inner[0] if len(inner) == 1 else function
    return function


def source_sha(function) -> str:
    """The pin of a DeepSpeed function: a hash of its own source, under any NVTX decorator."""
    return hashlib.sha256(inspect.getsource(undecorated(function)).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- the replacements


def _make_cpu_numa_cores_once(original):
    import copy

    found = []

    def get_numa_cores():
        # DeepSpeed's CPU accelerator asks on every `device_count()` (ZeRO-3: once a step), each time by starting
        # `numactl --hardware`; the machine's NUMA layout is the same all run long: asked once, a copy each time.
        if found:
            RAN["cpu_numa_cores_once"] += 1
        else:
            found.append(original())
        return copy.deepcopy(found[0])

    return get_numa_cores


def _installed(*names: str) -> Callable[[], bool]:
    """Whether the fast paths `names` are installed, asked when called: a replacement that needs another one's
    work (its other half) checks at each call."""
    return lambda: set(names) <= _INSTALLED.keys()


WHOLE_THROUGH_STEP_HALVES = _installed("zero3_whole_through_step_release", "zero3_whole_through_step_gather")
# The three parts of one fast path: installed together or not at all.
WHOLE_THROUGH_STEP_PARTS = (
    "zero3_whole_through_step",
    "zero3_whole_through_step_release",
    "zero3_whole_through_step_gather",
)
STAGE12 = "deepspeed.runtime.zero.stage_1_and_2"
STAGE3 = "deepspeed.runtime.zero.stage3"
FAST_PATHS = (
    FastPath("zero12_grad_norm", STAGE12, "DeepSpeedZeroOptimizer", "get_grad_norm_direct",
             "72af0993ad8cde2c", make_zero12_grad_norm),
    FastPath("zero3_grad_norm", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "get_grad_norm_direct",
             "5ba2252d5f16b541", make_zero3_grad_norm),
    FastPath("zero12_bit16_views", STAGE12, "DeepSpeedZeroOptimizer", "_update_model_bit16_weights",
             "f6e3c0c53b4a7e06", make_zero12_bit16_views),
    FastPath("zero12_single_rank_reduce", STAGE12, "DeepSpeedZeroOptimizer", "allreduce_and_copy",
             "1db38d57186c09f4", make_zero12_single_rank_reduce),
    FastPath("zero3_single_rank_reduce_scatter", STAGE3, None, "reduce_scatter_coalesced",
             "d05c7b944514f710", make_zero3_single_rank_reduce_scatter),
    FastPath("zero12_grouped_norm", STAGE12, "DeepSpeedZeroOptimizer", "scaled_global_norm",
             "63c6a6fe100c4e49", make_zero12_grouped_norm),
    FastPath("zero12_one_param_gather", STAGE12, None, "all_gather_dp_groups",
             "87c5e3c4215b8194", make_zero12_one_param_gather),
    FastPath("zero3_one_param_gather", "deepspeed.runtime.zero.partition_parameters", "Init",
             "_allgather_params_coalesced", "774cce0650d208bb", make_zero3_one_param_gather),
    FastPath("zero3_whole_module_hooks", "deepspeed.runtime.zero.parameter_offload", "DeepSpeedZeRoOffload",
             "setup_zero_stage3_hooks", "1ec65cef74df86a1", make_zero3_whole_module_hooks,
             requires=WHOLE_THROUGH_STEP_PARTS),  # alone its root hook regathers each step's release
    FastPath("zero2_reduce_at_epilogue", STAGE12, "DeepSpeedZeroOptimizer",
             "overlapping_partition_gradients_reduce_epilogue", "7a5f8e7981c0e2c9",
             lambda original: make_zero2_reduce_at_epilogue(original, _installed("zero12_file_at_once"))),
    FastPath("zero2_no_gradient_hooks", STAGE12, "DeepSpeedZeroOptimizer", "create_gradient_handling_hooks",
             "b84ceb8d3356fbed",  # after zero2_reduce_at_epilogue, which it needs
             lambda original: make_zero2_no_gradient_hooks(original, _installed("zero2_reduce_at_epilogue")),
             requires=("zero2_reduce_at_epilogue",)),
    FastPath("zero12_file_at_once", STAGE12, "DeepSpeedZeroOptimizer", "reduce_gradients",
             "385b8e94b1d3cee7", make_zero12_file_at_once,
             also_pins=(("process_gradients", "a05fe9cac73c6432"), ("setup_buckets", "82266aa4880f7d64"),
                        ("reduce_ready_partitions_and_remove_grads", "46ef5f92c1b87d6f"),
                        ("reduce_independent_p_g_buckets_and_remove_grads", "500839d3f30cd91b"))),
    FastPath("zero3_whole_through_step", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_pre_step",
             "6a560fa097ab03bb", lambda original: make_zero3_step_begins_whole(original, WHOLE_THROUGH_STEP_HALVES),
             requires=WHOLE_THROUGH_STEP_PARTS),
    FastPath("zero3_whole_through_step_release", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_partition_all_parameters",
             "5612df89a66654a6", make_zero3_step_keeps_whole, requires=WHOLE_THROUGH_STEP_PARTS),
    FastPath("zero3_whole_through_step_gather", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_post_step",
             "d993f8fa66f06633", make_zero3_step_ends_whole, requires=WHOLE_THROUGH_STEP_PARTS),
    FastPath("cpu_numa_cores_once", "deepspeed.utils.numa", None, "get_numa_cores",
             "96d75b0d4ea6627e", _make_cpu_numa_cores_once),
)  # fmt: skip

_INSTALLED: dict[str, tuple[object, object]] = {}  # name -> (owner, original)


def owner_of(path: FastPath):
    import importlib

    module = importlib.import_module(path.module)
    return getattr(module, path.owner) if path.owner else module


def reviewed_pins(path: FastPath) -> dict[str, str]:
    """{attribute: sha} of the DeepSpeed source a fast path was reviewed against: its original and `also_pins`."""
    return {path.attribute: path.source_sha, **dict(path.also_pins)}


def pins_of(path: FastPath, original) -> dict[str, str]:
    """{attribute: sha} of the installed DeepSpeed's source, for the same attributes (`original`: the replaced one)."""
    owner = owner_of(path)
    replaced = {path.attribute: original}
    return {name: source_sha(replaced.get(name) or getattr(owner, name)) for name in reviewed_pins(path)}


def why_off(path: FastPath) -> str | None:
    """Why a fast path cannot be installed over the DeepSpeed in this process, or None when it can: its original,
    or a method it pins, is missing (an older or newer DeepSpeed) or not the reviewed version. Never raises."""
    try:
        owner = owner_of(path)
        original = getattr(owner, path.attribute)
        installed = pins_of(path, original)
    except (ImportError, AttributeError, OSError, TypeError) as err:  # moved, renamed or source unreadable
        return f"off (not in this DeepSpeed: {' '.join(str(err).split())})"
    changed = [name for name, sha in installed.items() if sha != reviewed_pins(path)[name]]
    return f"off (DeepSpeed's {changed[0]} is not the reviewed version)" if changed else None


def installable(left_out: set[str] = frozenset()) -> dict[str, str | None]:
    """{name: None if it can be installed, else why not} for every fast path, a path whose required parts cannot be
    installed counted off with them; `left_out`: the ones the switch leaves out."""
    reasons = {
        path.name: f"off ({ENV_SWITCH} leaves it out)" if path.name in left_out else why_off(path)
        for path in FAST_PATHS
    }
    changed = True
    while changed:  # a part that is off turns off what requires it, and so on
        changed = False
        for path in FAST_PATHS:
            missing = [name for name in path.requires if reasons[name] is not None and name != path.name]
            if reasons[path.name] is None and missing:
                reasons[path.name] = f"off (its part {missing[0]} is off)"
                changed = True
    return reasons


def left_out_by_switch() -> set[str]:
    """The fast paths the switch leaves out: every one for "0", none for "1" or unset, the named ones for a list of
    `-name` (`HF_VIT_SCALING_DEEPSPEED_FAST_PATHS=-zero12_grad_norm,-cpu_numa_cores_once`: the rest stay on; what
    `benchmarks/engine_overhead.py --leave_one_out` measures). An unknown name is one error naming it."""
    value = os.environ.get(ENV_SWITCH, "1").strip()
    if value in ("", "1"):
        return set()
    if value == "0":
        return {path.name for path in FAST_PATHS}
    names = [part.strip() for part in value.split(",") if part.strip()]
    known = {path.name for path in FAST_PATHS}
    unknown = [name for name in names if not name.startswith("-") or name[1:] not in known]
    if unknown:
        raise UserInputError(
            f"{ENV_SWITCH}={value!r}: {unknown[0]!r} is not 0, 1 or -NAME of a fast path. Fix: use 0 (all off), 1 "
            "(all on) or a list such as -zero12_grad_norm,-cpu_numa_cores_once (names: "
            "hf_vit_scaling/parallel/fast_paths/README.md)."
        )
    return {name[1:] for name in names}


def install_deepspeed_fast_paths() -> dict[str, str]:
    """Install every fast path whose original's source matches its pin (idempotent): {name: "on" or why it is
    off}, for the report and the card. Never raises for DeepSpeed's sake: a missing or changed DeepSpeed method turns
    off the paths that need it. The switch (`left_out_by_switch`) leaves out all or some; a path it leaves out is put
    back to DeepSpeed's own method if an earlier call in this process installed it."""
    left_out = left_out_by_switch()
    uninstall_deepspeed_fast_paths(left_out)
    if left_out == {path.name for path in FAST_PATHS}:
        return {path.name: f"off ({ENV_SWITCH}=0)" for path in FAST_PATHS}
    reasons = installable(left_out)
    status = {}
    for path in FAST_PATHS:
        if path.name in _INSTALLED:
            status[path.name] = "on"
            continue
        if reasons[path.name] is not None:
            status[path.name] = reasons[path.name]
            continue
        owner = owner_of(path)
        original = getattr(owner, path.attribute)
        replacement = path.make(original)
        if undecorated(original) is not original:  # keep DeepSpeed's NVTX range around it (GPU profiles)
            from deepspeed.utils.nvtx import instrument_w_nvtx

            replacement = instrument_w_nvtx(replacement)
        setattr(owner, path.attribute, replacement)
        _INSTALLED[path.name] = (owner, original)
        status[path.name] = "on"
    return status


# Paths that act once, when DeepSpeed builds the engine (before any step): counted from the process's start.
ACT_AT_ENGINE_BUILD = ("zero2_no_gradient_hooks", "zero3_whole_module_hooks")


def fast_path_runs() -> dict[str, int]:
    """How many times each fast path's own code has run in this process so far (a copy)."""
    return dict(RAN)


def ran_since(before: dict[str, int]) -> dict[str, int]:
    """{name: times its own code ran since `before` (`fast_path_runs()` at the first measured step)}, for every path
    that ran: what the throughput report lists as ran in the measured steps; a path that acts when the engine is
    built counts from the start."""
    now = fast_path_runs()
    ran = {name: count - (0 if name in ACT_AT_ENGINE_BUILD else before.get(name, 0)) for name, count in now.items()}
    return {path.name: ran[path.name] for path in FAST_PATHS if ran.get(path.name, 0) > 0}


def uninstall_deepspeed_fast_paths(names: set[str] | None = None) -> None:
    """Put DeepSpeed's own methods back: every one replaced (tests compare both), or those of the paths `names` and
    of the paths that require them."""
    if names is not None:
        required = {path.name for path in FAST_PATHS if set(path.requires) & set(names)}
        names = set(names) | required
    for name, (owner, original) in list(_INSTALLED.items()):
        if names is not None and name not in names:
            continue
        path = next(p for p in FAST_PATHS if p.name == name)
        setattr(owner, path.attribute, original)
        del _INSTALLED[name]
