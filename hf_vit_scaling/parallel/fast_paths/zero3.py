"""ZeRO-3's fast paths: replacements that `registry` pins and installs (what each does and why it computes
DeepSpeed's numbers: this folder's README.md and the registry's docstring)."""

from __future__ import annotations

from hf_vit_scaling.parallel.fast_paths.common import RAN, norms_in, start_gather_rank_by_rank


def _zero3_local_square_sum(optimizer, gradients, params):
    """This rank's part of a ZeRO-3 group's squared L2 gradient norm, as DeepSpeed's `get_grad_norm_direct` sums it
    before its all-reduce, with the group it is all-reduced over and whether every rank's part counts (DeepSpeed's
    `_grad_norm_counts_every_rank`); None where its selection keeps no gradient."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.utils import is_model_parallel_parameter
    from deepspeed.runtime.zero.utils import get_norm_dtype

    optimizer._assert_same_partition_group(params)
    process_group = optimizer._get_param_partition_group(params[0])
    counts_every_rank = optimizer._grad_norm_counts_every_rank(params, process_group)
    device, dtype = get_accelerator().device_name(), get_norm_dtype()
    here = torch.device(get_accelerator().current_device_name())  # where .to(device) puts a tensor
    selected = [
        g if g.device == here else g.to(device, non_blocking=True)
        for g, p in zip(gradients, params)
        if counts_every_rank or is_model_parallel_parameter(p) or optimizer.model_parallel_rank == 0
    ]
    if not selected:
        return None
    return torch.sum(torch.pow(torch.stack(norms_in(selected, dtype)), 2.0)), process_group, counts_every_rank


def _zero3_norms_from_sums(optimizer, sums):
    """DeepSpeed's end of `get_grad_norm_direct` on the all-reduced sums: the square root, and -1 for inf/NaN."""
    import torch

    total_norm = sums ** (1.0 / 2.0)
    inf_or_nan = total_norm.isnan().logical_or(total_norm.isinf())
    return torch.where(inf_or_nan, torch.tensor(-1.0, device=optimizer.device, dtype=torch.float), total_norm)


def make_zero3_grad_norm(original):
    from deepspeed import comm as dist
    from deepspeed.comm import pg_utils

    def get_grad_norm_direct(self, gradients, params, norm_type=2):
        if float(norm_type) != 2.0:
            return original(self, gradients, params, norm_type)
        local = _zero3_local_square_sum(self, gradients, params)
        if local is None:
            return original(self, gradients, params, norm_type)
        total_norm_cuda, process_group, counts_every_rank = local
        RAN["zero3_grad_norm"] += 1
        if dist.get_world_size(group=process_group) > 1:  # a sum over one rank is the rank's own
            dist.all_reduce(total_norm_cuda, op=dist.ReduceOp.SUM, group=process_group)
        if not counts_every_rank:
            self._model_parallel_all_reduce(tensor=total_norm_cuda, op=dist.ReduceOp.SUM)
        autoep_ep_group = self._autoep_expert_parallel_group(params)
        if pg_utils.is_parallel(autoep_ep_group):
            dist.all_reduce(total_norm_cuda, op=dist.ReduceOp.SUM, group=autoep_ep_group)
        return _zero3_norms_from_sums(self, total_norm_cuda)

    return get_grad_norm_direct


def make_zero3_single_rank_reduce_scatter(original):
    import torch
    from deepspeed import comm as dist

    def reduce_scatter_coalesced(tensors, group=None):
        if dist.get_world_size(group) != 1:
            return original(tensors, group)
        RAN["zero3_single_rank_reduce_scatter"] += 1
        # DeepSpeed's result on one rank: each tensor's values (divided by 1, reduced over one rank) as views of one
        # flat buffer; the buffer is the tensor itself when there is one (DeepSpeed's own shortcut), else a copy.
        flat = tensors[0].view(-1) if len(tensors) == 1 else torch.cat([t.view(-1) for t in tensors])
        outputs, offset = [], 0
        for tensor in tensors:
            outputs.append(flat.narrow(0, offset, tensor.numel()))
            offset += tensor.numel()
        return outputs

    return reduce_scatter_coalesced


def make_zero3_whole_module_hooks(original):
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    def setup_zero_stage3_hooks(self):
        original(self)
        params = list(self.module.parameters())
        whole = (
            self.offload_device is None
            and not self.zenflow
            and params
            and all(getattr(p, "ds_persist", False) for p in params)
        )
        if not whole:
            return
        RAN["zero3_whole_module_hooks"] += 1
        # Every parameter persistent (the recipe's resolution on one process, and on several for a model whose tensors
        # are all under DeepSpeed's persistence threshold): the per-module hooks would fetch and release nothing, so
        # they go, as DeepSpeed's own `unwrap_model_for_generation` removes them while every weight is gathered. One
        # hook on the root gathers what is released before the forward reads it: the parameters start released, and a
        # step releases all of them and gathers them back in `_post_step`, which a skipped step (a NaN norm) never
        # reaches. (DeepSpeed's parameter getter would gather them too, one at a time, each registered as an
        # external parameter of the root.)
        for hook in self.forward_hooks + self.backward_hooks:
            hook.remove()

        def gather_released(module, *args):
            released = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
            if released:
                released[0].all_gather(released)

        self.forward_hooks = [self.module.register_forward_pre_hook(gather_released)]
        self.backward_hooks = []
        setattr(self, WHOLE_MODULE, True)  # what `zero3_whole_through_step` asks

    return setup_zero_stage3_hooks


def make_zero3_one_param_gather(original):
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus, get_allgather_dtype

    def _allgather_params_coalesced(self, param_list, hierarchy=0, quantize=False):
        one = (
            not quantize
            and len(param_list) > 1
            and not self.use_all_reduce_for_fetch_params  # an all-reduce would turn -0.0 into 0.0
            and self.zero_param_process_group is None
            and all(
                p.ds_status == ZeroParamStatus.NOT_AVAILABLE
                and p.ds_secondary_tensor is None
                and get_allgather_dtype(p, p.ds_tensor) == p.ds_tensor.dtype
                and self._partition_world_size(p) > 1
                for p in param_list
            )
        )
        if not one:
            return original(self, param_list, hierarchy, quantize)
        RAN["zero3_one_param_gather"] += 1
        # DeepSpeed's blocking gather (`param.all_gather(list)`: the persistent parameters after every step, a
        # `GatheredParameters` block) launches one collective per parameter; gloo runs them one after another, a round
        # trip each. DeepSpeed's own coalesced gather, the one its forward prefetch uses, moves the same partitions in
        # one collective and gives each parameter its full tensor.
        param_list[0].all_gather_coalesced(param_list).wait()
        if not get_accelerator().resolves_data_dependency():  # as DeepSpeed's ends: the data ready for the caller
            get_accelerator().synchronize()

    return _allgather_params_coalesced


# ----------------------------------------------------------------- ZeRO-3: every parameter whole through a step

WHOLE_MODULE = "_hf_vit_scaling_whole_module"  # on DeepSpeedZeRoOffload: `zero3_whole_module_hooks` took its hooks
THROUGH_STEP = "_hf_vit_scaling_whole_through_step"  # on the optimizer: None, "keep" (step began), "kept"


def _stays_whole_through_step(optimizer) -> bool:
    """Every parameter persistent and gathered, the root hook in place of the module hooks, nothing offloaded,
    quantized or kept a second time (ZeRO++), one partition group: DeepSpeed's release of every parameter at a step's
    start and its gather of all of them at its end can be one in-place refresh."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus, get_allgather_dtype

    params = optimizer.persistent_parameters
    group = optimizer._get_param_partition_group(params[0]) if params else None
    return (
        bool(params)
        and getattr(optimizer.parameter_offload, WHOLE_MODULE, False)
        and not (optimizer.offload_optimizer or optimizer.offload_param or optimizer.swap_optimizer)
        and len(params) == sum(1 for _ in optimizer.module.parameters())
        and all(
            p.ds_status == ZeroParamStatus.AVAILABLE
            and p.ds_secondary_tensor is None
            and not hasattr(p.ds_tensor, "ds_quant_scale")
            and get_allgather_dtype(p, p.ds_tensor) == p.ds_tensor.dtype
            and p.data.is_contiguous()
            and optimizer._get_param_partition_group(p) is group
            for p in params
        )
    )


def refresh_whole_parameters(optimizer) -> None:
    """Each persistent parameter's full tensor, written in place from every rank's updated partition: what DeepSpeed's
    gather after the step gives it (the partitions laid end to end, rank by rank, cut to the parameter's size), in one
    collective, without freeing and allocating every tensor."""
    from deepspeed import comm as dist

    params = optimizer.persistent_parameters
    shards = [p.ds_tensor.data.view(-1) for p in params]
    group = optimizer._get_param_partition_group(params[0])
    if dist.get_world_size(group=group) == 1:  # the partition is the whole tensor
        for p, shard in zip(params, shards):
            if p.data.data_ptr() != shard.data_ptr():  # DeepSpeed's world-of-one gather makes it a view of it
                p.data.view(-1).copy_(shard[: p.ds_numel])
        return
    for p, by_rank in zip(params, gather_rank_by_rank(shards, group)):
        # rank 0's partition, rank 1's, ..., the padding of the last partition cut off
        p.data.view(-1).copy_(by_rank.reshape(-1)[: p.ds_numel])


def gather_rank_by_rank(parts, group) -> list:
    """This rank's 1-D `parts` and every other rank's, in one all-gather: for each part a (world, its size) view of
    the result, row r holding rank r's."""
    work, views = start_gather_rank_by_rank(parts, group)
    work.wait()
    return views


def make_zero3_step_begins_whole(original, other_halves_installed):
    def _pre_step(self):
        original(self)
        keep = other_halves_installed() and _stays_whole_through_step(self)  # never the release without the refresh
        setattr(self, THROUGH_STEP, "keep" if keep else None)
        RAN["zero3_whole_through_step"] += keep

    return _pre_step


def make_zero3_step_keeps_whole(original):
    def _partition_all_parameters(self):
        if getattr(self, THROUGH_STEP, None) == "keep":  # the step's own call, right after `_pre_step`
            # DeepSpeed releases every parameter here and gathers the persistent ones (here: all) back in
            # `_post_step`; they stay, and `_post_step` refreshes them in place. A step skipped for a NaN norm ends
            # before `_post_step`, its parameters unchanged and still whole. Any other caller (a checkpoint's
            # save or load) gets DeepSpeed's release.
            setattr(self, THROUGH_STEP, "kept")
            RAN["zero3_whole_through_step_release"] += 1
            return
        original(self)

    return _partition_all_parameters


def make_zero3_step_ends_whole(original):
    def _post_step(self, timer_names):
        if getattr(self, THROUGH_STEP, None) == "kept":
            RAN["zero3_whole_through_step_gather"] += 1
            refresh_whole_parameters(self)  # DeepSpeed's gather below then finds every parameter whole: no-op
        setattr(self, THROUGH_STEP, None)
        original(self, timer_names)

    return _post_step
