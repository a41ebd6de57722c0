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
  squares on its own (2 groups under the Trainer: decay and no decay); one all-reduce of the stacked sums instead;
- `zero3_grouped_norm`: the same for ZeRO-3's sub-groups (`_get_norm_groups`). Both grouped norms add the same
  sums over the ranks: bit for bit on two processes (tested); on more, an all-reduce of two elements may add the
  ranks' sums in another order than one of one element, a difference in the last bit at most;
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
- `zero3_whole_through_step` (with its `_release` and `_gather` parts): the same ZeRO-3 case as
  `zero3_whole_module_hooks`: DeepSpeed releases every parameter at a step's start and gathers all of them back into
  new tensors at its end; they stay, and the updated partitions are gathered into them in place, one collective (the
  same bytes). Only the step's own release is left out (a checkpoint's is DeepSpeed's); the first part marks the step
  only while the other two are installed;
- `cpu_numa_cores_once`: DeepSpeed's CPU accelerator starts `numactl --hardware` at every `device_count()`
  (ZeRO-3 asks once a step); asked once.

Each is installed only over the DeepSpeed source it was written and tested against (`FastPath.source_sha` pins a hash
of the original's source): after a DeepSpeed upgrade that changes a method, its fast path stays off and the run
reports so, and `tests/unit/parallel/test_deepspeed_fast_paths.py` fails until the replacement is reviewed. Set
`HF_VIT_SCALING_DEEPSPEED_FAST_PATHS=0` to run DeepSpeed's own code unchanged.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

from hf_vit_scaling.parallel.weight_gathers import IN_FLIGHT, MAY_LEAVE_IN_FLIGHT
from hf_vit_scaling.parallel.zero3_fast_paths import (
    make_zero3_grad_norm,
    make_zero3_grouped_norm,
    make_zero3_one_param_gather,
    make_zero3_single_rank_reduce_scatter,
    make_zero3_step_begins_whole,
    make_zero3_step_ends_whole,
    make_zero3_step_keeps_whole,
    make_zero3_whole_module_hooks,
    norms_in,
    start_gather_rank_by_rank,
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


def _zero12_local_square_sum(optimizer, gradients, params):
    """This rank's part of a ZeRO-1/2 group's squared L2 gradient norm, as DeepSpeed's `get_grad_norm_direct` sums
    it before its all-reduce (a float32 scalar), or None where its selection keeps no gradient."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.constants import PIPE_REPLICATED
    from deepspeed.runtime.utils import is_model_parallel_parameter
    from deepspeed.runtime.zero.utils import get_norm_dtype

    # DeepSpeed's selection, unchanged: padding gradients out, pipeline-replicated parameters out, a parameter that is
    # not model-parallel counted on model-parallel rank 0 only.
    param_gradients = (g for g in gradients if not getattr(g, "_zero_padding", False))
    selected = [
        g.data.detach()
        for g, p in zip(param_gradients, params)
        if not (hasattr(p, PIPE_REPLICATED) and p.ds_pipe_replicated)
        and (is_model_parallel_parameter(p) or optimizer.model_parallel_rank == 0)
    ]
    if not selected:
        return None
    device = torch.device(get_accelerator().current_device_name())
    norms = [n if n.device == device else n.to(device) for n in norms_in(selected, get_norm_dtype())]
    return torch.stack(norms).pow(2.0).sum().float()


def _make_zero12_grad_norm(original):
    from deepspeed import comm as dist
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace

    def get_grad_norm_direct(self, gradients, params, norm_type=2):
        if float(norm_type) != 2.0:
            return original(self, gradients, params, norm_type)
        total_norm = _zero12_local_square_sum(self, gradients, params)
        if total_norm is None:
            return original(self, gradients, params, norm_type)
        if dist.get_world_size(group=self.dp_process_group) > 1:  # a sum over one rank is the rank's own
            dist.all_reduce(total_norm, op=dist.ReduceOp.SUM, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=total_norm, op=dist.ReduceOp.SUM)
        total_norm = total_norm.pow(1.0 / 2.0)
        mask_nan_or_inf_with_val_inplace(total_norm, device=self.device)
        return total_norm

    return get_grad_norm_direct


def _make_zero12_grouped_norm(original):
    import torch
    from deepspeed import comm as dist
    from deepspeed.runtime.utils import combine_grad_norm_groups, mask_nan_or_inf_with_val_inplace

    def scaled_global_norm(self, norm_type=2):
        groups = range(len(self.bit16_groups))
        plain = (
            norm_type == 2
            and len(groups) > 1
            and dist.get_world_size(group=self.dp_process_group) > 1
            and not self.cpu_offload
            and not self.has_moe_layers
            and not any(self._muon_update_lacks_loss_scale(i) for i in groups)
        )
        if not plain:
            return original(self, norm_type)
        grads, params = self.averaged_gradients, self.params_in_partition
        sums = [_zero12_local_square_sum(self, grads[i], params[i]) for i in groups]
        if any(s is None for s in sums):
            return original(self, norm_type)
        # Each group's sum is all-reduced on its own by DeepSpeed (`get_grad_norm_direct`): the same sums, elementwise,
        # in one all-reduce of the stacked group sums; then each group's square root and -1 for inf/NaN, as there.
        totals = torch.stack(sums)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=totals, op=dist.ReduceOp.SUM)
        totals = totals.pow(1.0 / 2.0)
        mask_nan_or_inf_with_val_inplace(totals, device=self.device)
        return combine_grad_norm_groups(list(totals.unbind()), norm_type=norm_type)

    return scaled_global_norm


def _make_zero12_bit16_views(original):
    def _update_model_bit16_weights(self, group_index):
        flat = self.bit16_groups_flat[group_index]
        base, size = flat.data_ptr(), flat.element_size()
        slots = zip(
            self.round_robin_bit16_groups[group_index],
            self.round_robin_bit16_meta[group_index],
            self.round_robin_bit16_offsets[group_index],
        )
        if all(p.data_ptr() == base + offset * size and p.shape == meta.shape for p, meta, offset in slots):
            in_place = {id(p) for p in self.round_robin_bit16_groups[group_index]}
            if all(id(p) in in_place for p in self.bit16_groups[group_index]):
                return  # every parameter already is its slice of the flat buffer: DeepSpeed's loops change nothing
        original(self, group_index)

    return _update_model_bit16_weights


def _make_zero12_single_rank_reduce(original):
    from deepspeed import comm as dist
    from deepspeed.runtime.zero import stage_1_and_2

    def allreduce_and_copy(
        self,
        small_bucket,
        communication_data_type,
        rank=None,
        log=None,
        divide=True,
        process_group=None,
        output_bucket=None,
    ):
        group = self.dp_process_group if process_group is None else process_group
        identity = (
            not self.overlap_comm
            and dist.get_world_size(group=group) == 1
            and self.sequence_parallel_size == 1
            and not stage_1_and_2.pg_correctness_test
            and all(t.dtype == communication_data_type for t in small_bucket)
        )
        if not identity:
            return original(
                self, small_bucket, communication_data_type, rank, log, divide, process_group, output_bucket
            )
        # x / 1 all-reduced over one rank is x: what DeepSpeed would copy back into each gradient is the gradient.
        for buf, output in zip(small_bucket, output_bucket or [None] * len(small_bucket)):
            self._add_to_grad_partition_buffer(output, buf)

    return allreduce_and_copy


def _make_zero12_one_param_gather(original):
    from deepspeed import comm as dist

    def all_gather_dp_groups(
        groups_flat, partitioned_param_groups, dp_process_group, start_alignment_factor, allgather_bucket_size
    ):
        shared = [i for i, group in enumerate(dp_process_group) if dist.get_world_size(group=group) > 1]
        flats = [groups_flat[i] for i in shared]
        in_flight = id(groups_flat) in MAY_LEAVE_IN_FLIGHT
        one = (
            (len(shared) > 1 or (in_flight and shared))
            and dist.has_all_gather_into_tensor()
            and all(dp_process_group[i] is dp_process_group[shared[0]] for i in shared)
            and all(f.device.type == "cpu" and f.dtype == flats[0].dtype for f in flats)
        )
        if not one:
            return original(
                groups_flat, partitioned_param_groups, dp_process_group, start_alignment_factor, allgather_bucket_size
            )
        # DeepSpeed gathers each group's flat buffer in its own collective (`all_gather_into_tensor_dp_groups`): on
        # gloo every collective is a round trip between the processes. One gather of this rank's partitions of all
        # groups, laid out rank by rank, then copied into each group's flat buffer (world x partition, rank-major,
        # as the per-group gather writes it): the same bytes, one round trip.
        group = dp_process_group[shared[0]]
        world, rank = dist.get_world_size(group=group), dist.get_rank(group=group)
        mine = [partitioned_param_groups[i][rank] for i in shared]
        work, gathered = start_gather_rank_by_rank(mine, group)

        def finish():
            work.wait()
            for flat, part, by_rank in zip(flats, mine, gathered):
                flat.view(world, part.numel()).copy_(by_rank)

        if in_flight:  # `weight_gathers.weights_gathered_late`: finished before anything reads the weights
            IN_FLIGHT.append(finish)
        else:
            finish()

    return all_gather_dp_groups


def _make_zero2_reduce_at_epilogue(original):
    def overlapping_partition_gradients_reduce_epilogue(self):
        if getattr(self, REDUCE_AT_EPILOGUE, False):
            # No gradient hook ran (`zero2_no_gradient_hooks`): what each would have done as its gradient arrived,
            # done here for every gradient the backward made, in ZeRO-1's order (its `reduce_gradients`).
            for i, group in enumerate(self.bit16_groups):
                for param in group:
                    if param.requires_grad and self.get_gradient_for_reduction(param) is not None:
                        self.process_gradients(param, i)
        original(self)

    return overlapping_partition_gradients_reduce_epilogue


REDUCE_AT_EPILOGUE = "_hf_vit_scaling_reduce_at_epilogue"


def _make_zero2_no_gradient_hooks(original):
    def create_gradient_handling_hooks(self):
        elements = sum(p.numel() for group in self.bit16_groups for p in group if p.requires_grad)
        at_epilogue = (
            "zero2_reduce_at_epilogue" in _INSTALLED  # the other half: it does the hooks' work
            and self.partition_gradients
            and not (self.overlap_comm or self.contiguous_gradients or self.use_grad_accum_attribute)
            and not (self.cpu_offload or self.zenflow or self.has_moe_layers)
            and self.gradient_accumulation_steps == 1
            and elements <= self.reduce_bucket_size
        )
        if not at_epilogue:
            return original(self)
        # ZeRO-2 hooks every gradient so that a full bucket is reduced (and other ranks' gradients freed) while the
        # backward goes on. With nothing to overlap (no side stream, `overlap_comm` off) and one bucket holding every
        # gradient, no bucket fills before the backward ends: each hook only files its gradient, and the engine's
        # epilogue reduces the bucket. The epilogue files them all instead (`zero2_reduce_at_epilogue`), as ZeRO-1
        # does, with the same reductions and the same peak memory; one accumulation step a step, so every gradient
        # present was made by this backward.
        setattr(self, REDUCE_AT_EPILOGUE, True)
        self._remaining_grad_acc_hooks = 0

    return create_gradient_handling_hooks


def _make_cpu_numa_cores_once(original):
    import copy

    found = []

    def get_numa_cores():
        # DeepSpeed's CPU accelerator asks on every `device_count()` (ZeRO-3: once a step), each time by starting
        # `numactl --hardware`; the machine's NUMA layout is the same all run long: asked once, a copy each time.
        if not found:
            found.append(original())
        return copy.deepcopy(found[0])

    return get_numa_cores


def _other_halves_installed() -> bool:
    return {"zero3_whole_through_step_release", "zero3_whole_through_step_gather"} <= _INSTALLED.keys()


STAGE12 = "deepspeed.runtime.zero.stage_1_and_2"
STAGE3 = "deepspeed.runtime.zero.stage3"
FAST_PATHS = (
    FastPath("zero12_grad_norm", STAGE12, "DeepSpeedZeroOptimizer", "get_grad_norm_direct",
             "72af0993ad8cde2c", _make_zero12_grad_norm),
    FastPath("zero3_grad_norm", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "get_grad_norm_direct",
             "5ba2252d5f16b541", make_zero3_grad_norm),
    FastPath("zero12_bit16_views", STAGE12, "DeepSpeedZeroOptimizer", "_update_model_bit16_weights",
             "f6e3c0c53b4a7e06", _make_zero12_bit16_views),
    FastPath("zero12_single_rank_reduce", STAGE12, "DeepSpeedZeroOptimizer", "allreduce_and_copy",
             "1db38d57186c09f4", _make_zero12_single_rank_reduce),
    FastPath("zero3_single_rank_reduce_scatter", STAGE3, None, "reduce_scatter_coalesced",
             "d05c7b944514f710", make_zero3_single_rank_reduce_scatter),
    FastPath("zero12_grouped_norm", STAGE12, "DeepSpeedZeroOptimizer", "scaled_global_norm",
             "63c6a6fe100c4e49", _make_zero12_grouped_norm),
    FastPath("zero12_one_param_gather", STAGE12, None, "all_gather_dp_groups",
             "87c5e3c4215b8194", _make_zero12_one_param_gather),
    FastPath("zero3_one_param_gather", "deepspeed.runtime.zero.partition_parameters", "Init",
             "_allgather_params_coalesced", "774cce0650d208bb", make_zero3_one_param_gather),
    FastPath("zero3_grouped_norm", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_get_norm_groups",
             "6a068faa3149b1f4", make_zero3_grouped_norm),
    FastPath("zero3_whole_module_hooks", "deepspeed.runtime.zero.parameter_offload", "DeepSpeedZeRoOffload",
             "setup_zero_stage3_hooks", "1ec65cef74df86a1", make_zero3_whole_module_hooks),
    FastPath("zero2_reduce_at_epilogue", STAGE12, "DeepSpeedZeroOptimizer",
             "overlapping_partition_gradients_reduce_epilogue", "7a5f8e7981c0e2c9", _make_zero2_reduce_at_epilogue),
    FastPath("zero2_no_gradient_hooks", STAGE12, "DeepSpeedZeroOptimizer", "create_gradient_handling_hooks",
             "b84ceb8d3356fbed", _make_zero2_no_gradient_hooks),  # after zero2_reduce_at_epilogue, which it needs
    FastPath("zero3_whole_through_step", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_pre_step",
             "6a560fa097ab03bb", lambda original: make_zero3_step_begins_whole(original, _other_halves_installed)),
    FastPath("zero3_whole_through_step_release", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_partition_all_parameters",
             "5612df89a66654a6", make_zero3_step_keeps_whole),
    FastPath("zero3_whole_through_step_gather", STAGE3, "DeepSpeedZeroOptimizer_Stage3", "_post_step",
             "d993f8fa66f06633", make_zero3_step_ends_whole),
    FastPath("cpu_numa_cores_once", "deepspeed.utils.numa", None, "get_numa_cores",
             "96d75b0d4ea6627e", _make_cpu_numa_cores_once),
)  # fmt: skip

_INSTALLED: dict[str, tuple[object, object]] = {}  # name -> (owner, original)


def owner_of(path: FastPath):
    import importlib

    module = importlib.import_module(path.module)
    return getattr(module, path.owner) if path.owner else module


def install_deepspeed_fast_paths() -> dict[str, str]:
    """Install every fast path whose original's source matches its pin (idempotent): {name: "on" or why it is
    off}, for the throughput report."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return {path.name: f"off ({ENV_SWITCH}=0)" for path in FAST_PATHS}
    status = {}
    for path in FAST_PATHS:
        if path.name in _INSTALLED:
            status[path.name] = "on"
            continue
        owner = owner_of(path)
        original = getattr(owner, path.attribute)
        if source_sha(original) != path.source_sha:
            status[path.name] = f"off (DeepSpeed's {path.attribute} is not the reviewed version)"
            continue
        replacement = path.make(original)
        if undecorated(original) is not original:  # keep DeepSpeed's NVTX range around it (GPU profiles)
            from deepspeed.utils.nvtx import instrument_w_nvtx

            replacement = instrument_w_nvtx(replacement)
        setattr(owner, path.attribute, replacement)
        _INSTALLED[path.name] = (owner, original)
        status[path.name] = "on"
    return status


def uninstall_deepspeed_fast_paths() -> None:
    """Put DeepSpeed's own methods back (tests compare both)."""
    for name, (owner, original) in list(_INSTALLED.items()):
        path = next(p for p in FAST_PATHS if p.name == name)
        setattr(owner, path.attribute, original)
        del _INSTALLED[name]
