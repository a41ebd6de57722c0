"""ZeRO-1/2's fast paths: replacements that `hf_vit_scaling.parallel.fast_paths.registry` pins and installs (what
each does and why it computes DeepSpeed's numbers: that module's docstring)."""

from __future__ import annotations

from collections.abc import Callable

from hf_vit_scaling.parallel.fast_paths.common import RAN, norms_in, start_gather_rank_by_rank
from hf_vit_scaling.parallel.fast_paths.weight_gathers import IN_FLIGHT, MAY_LEAVE_IN_FLIGHT


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


def make_zero12_grad_norm(original):
    from deepspeed import comm as dist
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace

    def get_grad_norm_direct(self, gradients, params, norm_type=2):
        if float(norm_type) != 2.0:
            return original(self, gradients, params, norm_type)
        total_norm = _zero12_local_square_sum(self, gradients, params)
        if total_norm is None:
            return original(self, gradients, params, norm_type)
        RAN["zero12_grad_norm"] += 1
        if dist.get_world_size(group=self.dp_process_group) > 1:  # a sum over one rank is the rank's own
            dist.all_reduce(total_norm, op=dist.ReduceOp.SUM, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=total_norm, op=dist.ReduceOp.SUM)
        total_norm = total_norm.pow(1.0 / 2.0)
        mask_nan_or_inf_with_val_inplace(total_norm, device=self.device)
        return total_norm

    return get_grad_norm_direct


def make_zero12_grouped_norm(original):
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
        RAN["zero12_grouped_norm"] += 1
        # Each group's sum is all-reduced on its own by DeepSpeed (`get_grad_norm_direct`): the same sums, elementwise,
        # in one all-reduce of the stacked group sums; then each group's square root and -1 for inf/NaN, as there.
        totals = torch.stack(sums)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=totals, op=dist.ReduceOp.SUM)
        totals = totals.pow(1.0 / 2.0)
        mask_nan_or_inf_with_val_inplace(totals, device=self.device)
        return combine_grad_norm_groups(list(totals.unbind()), norm_type=norm_type)

    return scaled_global_norm


def make_zero12_bit16_views(original):
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
                RAN["zero12_bit16_views"] += 1
                return  # every parameter already is its slice of the flat buffer: DeepSpeed's loops change nothing
        original(self, group_index)

    return _update_model_bit16_weights


def make_zero12_single_rank_reduce(original):
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
        RAN["zero12_single_rank_reduce"] += 1
        # x / 1 all-reduced over one rank is x: what DeepSpeed would copy back into each gradient is the gradient.
        for buf, output in zip(small_bucket, output_bucket or [None] * len(small_bucket)):
            self._add_to_grad_partition_buffer(output, buf)

    return allreduce_and_copy


def make_zero12_one_param_gather(original):
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
        RAN["zero12_one_param_gather"] += 1
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


def file_every_gradient(self, counting_the_micro_step: bool) -> bool:
    """ZeRO-1/2's filing of each gradient in the reduction bucket, for all of them in one loop: DeepSpeed's
    `reduce_independent_p_g_buckets_and_remove_grads` (under `reduce_ready_partitions_and_remove_grads`, and for
    ZeRO-2 `process_gradients`, whose `setup_buckets` counts the micro step) is a dozen Python calls per tensor, every
    one of which but the filing does nothing where this holds: no accumulation attribute, contiguous buffer, overlap,
    offload, autocast, MoE or tensor-parallel folding, an accumulation boundary, every gradient ready (no tiled
    computation's transient one), and one bucket that starts empty and holds every gradient. False, with nothing
    done, where one of those does not hold."""
    from deepspeed.runtime.torch_autocast import is_autocast_initialized

    filed = [  # DeepSpeed returns at once for an empty parameter
        (i, param) for i, group in enumerate(self.bit16_groups) for param in group
        if param.grad is not None and param.numel()
    ]  # fmt: skip
    bucket = self.ipg_buckets.get(self.communication_data_type)
    if (
        bucket is None
        or not all(getattr(param, "ds_grad_is_ready", True) for _, param in filed)
        or bucket.elements
        or sum(param.numel() for _, param in filed) > self.reduce_bucket_size
        or self.use_grad_accum_attribute
        or self.contiguous_gradients
        or self.overlap_comm
        or self._offload_gradient_safety_enabled
        or self.zenflow
        or self.has_moe_layers
        or self.autoep_folding_tp_group is not None
        or is_autocast_initialized()
        or not self.is_gradient_accumulation_boundary()
        or (counting_the_micro_step and self._coalesce_grad_reduction)
    ):
        return False
    if counting_the_micro_step and filed:
        self.setup_buckets()
    for i, param in filed:
        param_id = self.get_param_id(param)
        assert not self.params_already_reduced[param_id], f"parameter {param_id}'s gradient was reduced already"
        bucket.grads.append(param.grad)
        bucket.params.append((i, param.param_idx_in_group, param_id))
        bucket.elements += param.numel()
    return True


def make_zero12_file_at_once(original):
    def reduce_gradients(self, pipeline_parallel=False):
        # ZeRO-1's reduction (DeepSpeed's engine calls it for stage 1): the gradients filed in one loop, then the
        # epilogue reduces the bucket, as DeepSpeed's own loop over the tensors does.
        if pipeline_parallel or self.overlap_comm or not file_every_gradient(self, counting_the_micro_step=False):
            return original(self, pipeline_parallel)
        RAN["zero12_file_at_once"] += 1
        self.overlapping_partition_gradients_reduce_epilogue()

    return reduce_gradients


def make_zero2_reduce_at_epilogue(original, filing_installed: Callable[[], bool]):
    def overlapping_partition_gradients_reduce_epilogue(self):
        if getattr(self, REDUCE_AT_EPILOGUE, False):
            RAN["zero2_reduce_at_epilogue"] += 1
            # No gradient hook ran (`zero2_no_gradient_hooks`): what each would have done as its gradient arrived,
            # done here for every gradient the backward made, in ZeRO-1's order (its `reduce_gradients`).
            if filing_installed() and file_every_gradient(self, counting_the_micro_step=True):
                RAN["zero12_file_at_once"] += 1
            else:
                for i, group in enumerate(self.bit16_groups):
                    for param in group:
                        if param.requires_grad and self.get_gradient_for_reduction(param) is not None:
                            self.process_gradients(param, i)
        original(self)

    return overlapping_partition_gradients_reduce_epilogue


REDUCE_AT_EPILOGUE = "_hf_vit_scaling_reduce_at_epilogue"


def make_zero2_no_gradient_hooks(original, epilogue_installed: Callable[[], bool]):
    def create_gradient_handling_hooks(self):
        elements = sum(p.numel() for group in self.bit16_groups for p in group if p.requires_grad)
        at_epilogue = (
            epilogue_installed()  # the other half: it does the hooks' work
            and self.partition_gradients
            and not (self.overlap_comm or self.contiguous_gradients or self.use_grad_accum_attribute)
            and not (self.cpu_offload or self.zenflow or self.has_moe_layers)
            and self.gradient_accumulation_steps == 1
            and elements <= self.reduce_bucket_size
        )
        if not at_epilogue:
            return original(self)
        RAN["zero2_no_gradient_hooks"] += 1
        # ZeRO-2 hooks every gradient so that a full bucket is reduced (and other ranks' gradients freed) while the
        # backward goes on. With nothing to overlap (no side stream, `overlap_comm` off) and one bucket holding every
        # gradient, no bucket fills before the backward ends: each hook only files its gradient, and the engine's
        # epilogue reduces the bucket. The epilogue files them all instead (`zero2_reduce_at_epilogue`), as ZeRO-1
        # does, with the same reductions and the same peak memory; one accumulation step a step, so every gradient
        # present was made by this backward.
        setattr(self, REDUCE_AT_EPILOGUE, True)
        self._remaining_grad_acc_hooks = 0

    return create_gradient_handling_hooks
