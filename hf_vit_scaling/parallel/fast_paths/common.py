"""What the ZeRO-1/2 and ZeRO-3 fast paths share: the count of each one's runs, the multi-tensor norm and the
all-gather of every rank's parts started without waiting."""

from __future__ import annotations

from collections import Counter

# fast path -> times its own code ran in this process (not DeepSpeed's, to which it hands a case it does not cover):
# the throughput report says which ran in the measured steps (`throughput/timing.py`), not only which are installed.
RAN: Counter[str] = Counter()


def norms_in(tensors, dtype):
    """Each tensor's L2 norm computed in `dtype` (DeepSpeed's `get_norm_dtype()`: fp64 where the device has it), as
    DeepSpeed's `vector_norm(t.to(dtype))` per tensor gives it, without the fp64 copy of every gradient: one
    multi-tensor norm that accumulates in `dtype` (bit for bit the same on the CPU: the unit test)."""
    import torch

    if all(t.dtype == tensors[0].dtype for t in tensors) and tensors[0].dtype in (torch.float32, torch.float64):
        return torch._foreach_norm(tensors, 2.0, dtype=dtype)
    return torch._foreach_norm([t.to(dtype) for t in tensors], 2.0)


def start_gather_rank_by_rank(parts, group) -> tuple:
    """`gather_rank_by_rank` started and not waited for: (the collective's work, the views), the views holding every
    rank's parts once `work.wait()` has returned."""
    import torch
    from deepspeed import comm as dist

    world = dist.get_world_size(group=group)
    mine = torch.cat(parts)
    gathered = torch.empty(world * mine.numel(), dtype=mine.dtype, device=mine.device)
    work = dist.all_gather_into_tensor(gathered, mine, group=group, async_op=True)
    by_rank, views, offset = gathered.view(world, -1), [], 0
    for part in parts:
        views.append(by_rank[:, offset : offset + part.numel()])
        offset += part.numel()
    return work, views
