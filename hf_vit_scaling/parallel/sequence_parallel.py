"""Sequence parallelism for Hugging Face ViT: each image's patch sequence is split across N ranks (DeepSpeed Ulysses).

What runs where, for one image of L tokens (CLS + patches) on an SP group of N ranks:
- the embeddings run on every rank; the sequence is padded to L_pad = ceil(L / N) x N and rank r keeps tokens
  [r x L_pad/N, (r + 1) x L_pad/N): ViT-B/16 at 1024 px has 64 x 64 + 1 = 4,097 tokens -> 4,098 padded, 2,049 per
  rank with N = 2;
- every layer's LayerNorm and MLP run on the local tokens only; attention goes through DeepSpeed's
  `UlyssesSPAttentionHF`: an all-to-all turns (L_pad/N tokens, all heads) into (L_pad tokens, heads/N), each rank
  attends over the whole sequence for its heads, and a second all-to-all turns it back. The padded keys are masked
  (the mask travels as negative `position_ids`, which Ulysses all-gathers anyway);
- before the final LayerNorm the sequence is all-gathered (padding dropped) and the head runs on every rank.

Gradients. The head after the gather is replicated, so each rank gets the head's full gradient, while each rank's
layer gradients are only its own tokens' share. The gather's backward returns this rank's slice times N, and the
logits' gradient (so that of any loss computed from them) is multiplied by `loss_grad_scale`, their values left
alone: with the 1/N of ZeRO 0-2 every rank then holds exactly a 1/N-th share of the full gradient for every
parameter, so a sum over the SP group is the exact gradient. DeepSpeed ZeRO 0-2
reduce gradients as a sum over the SP group and a mean over data-parallel replicas (they divide by world / N).
ZeRO-3 with `reduce_scatter` (its default) divides by the whole world instead, so there the loss scale is 1 (N x the
ZeRO 0-2 value). ZeRO-3 with `reduce_scatter: false` mixes both reductions depending on the bucket size, so it is
refused. Plain DDP (no DeepSpeed) is refused too: the process groups are DeepSpeed's.

Data. Ranks of one SP group must see the same images: the Trainer's training dataloader is sharded by data-parallel
rank (world / N replicas), and pixel values are broadcast from the group's first rank after augmentation, so random
crops drawn on different ranks cannot differ. Evaluation runs without SP (each rank its own images, full sequence,
no gradients).

Only the ViT glue is here; the all-to-all attention and the process groups (`parallel_state_sp`, DeepSpeed's mpu)
are DeepSpeed's own.
"""

import math
from typing import Any

import torch
import torch.distributed as dist

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.deepspeed_config import ConfigReading
from hf_vit_scaling.parallel.distributed import global_batch_size, init_deepspeed_comm

# sdpa only: overriding "eager" in transformers' registry would hand ViT's eager function to every other model type
# in the process (their own eager functions are the registry's per-model defaults).
SUPPORTED_ATTENTION = ("sdpa",)


# --------------------------------------------------------------------------- checks (before any expensive work)


def sequence_parallel_loss_grad_scale(sp_size: int, zero_stage: int | None) -> float:
    """Factor on the loss's gradient so that DeepSpeed's reduction gives the full-batch gradient (module docstring)."""
    return 1.0 if zero_stage == 3 else 1.0 / sp_size


def check_sequence_parallel(
    sp_size: int,
    world_size: int,
    ds_config: ConfigReading,
    num_attention_heads: int | None = None,
    attn_implementation: str = "sdpa",
    balance_batches: str = "off",
) -> None:
    """Refuse what sequence parallelism cannot do, naming the flag and the fix. `ds_config`: the run's DeepSpeed config
    as its Engine read it (`Engine.reading`; no stage without DeepSpeed)."""
    if sp_size < 1:
        raise UserInputError(f"--sequence_parallel_size must be >= 1, got {sp_size}.")
    if sp_size == 1:
        return
    if ds_config.zero_stage is None:
        raise UserInputError(
            "--sequence_parallel_size needs DeepSpeed (its Ulysses attention and process groups). "
            "Fix: add --ds_config ds_configs/zero2.json (ZeRO 0-3 are supported)."
        )
    if world_size % sp_size:
        raise UserInputError(
            f"--sequence_parallel_size {sp_size} does not divide the {world_size} launched processes "
            "(world size = data-parallel replicas x sequence-parallel size). Fix: launch a multiple "
            f"of {sp_size} processes or pick a divisor of {world_size}."
        )
    if ds_config.zero_stage == 3 and not ds_config.reduce_scatter:
        raise UserInputError(
            "--sequence_parallel_size with ZeRO-3 needs zero_optimization.reduce_scatter true (the "
            "default): with reduce_scatter false DeepSpeed averages some gradient buckets over the SP "
            "group and sums others. Fix: remove reduce_scatter from the config or set it to true."
        )
    if attn_implementation not in SUPPORTED_ATTENTION:
        raise UserInputError(
            f"--attn_implementation {attn_implementation} is not supported with "
            f"--sequence_parallel_size (Ulysses wraps {' and '.join(SUPPORTED_ATTENTION)}). "
            "Fix: use --attn_implementation sdpa."
        )
    if balance_batches != "off":
        raise UserInputError(
            "--balance_batches and --sequence_parallel_size cannot be combined (ranks of one "
            "sequence-parallel group must share their images). Fix: drop --balance_batches."
        )
    if num_attention_heads is not None:
        check_head_count(num_attention_heads, sp_size)


def check_head_count(num_attention_heads: int, sp_size: int) -> None:
    """Ulysses gives every rank num_heads / N whole heads."""
    if num_attention_heads % sp_size:
        divisors = [n for n in range(2, num_attention_heads + 1) if num_attention_heads % n == 0]
        raise UserInputError(
            f"--sequence_parallel_size {sp_size} does not divide the model's {num_attention_heads} "
            "attention heads (Ulysses gives every rank whole heads). Fix: use one of "
            f"{divisors or [1]} or a model whose head count is a multiple of {sp_size}."
        )


def sequence_parallel_ds_values(sp_size: int, per_device_batch: int, accumulation: int, world_size: int) -> dict:
    """DeepSpeed's batch arithmetic counts data-parallel replicas, not processes: N ranks share one micro-batch.
    train_batch_size = micro-batch x accumulation x (world / N), e.g. 1 x 1 x (8 / 4) = 2 images per step.
    `sequence_parallel_size`: DeepSpeedConfig divides the world by it (zero.Init, no mpu)."""
    return {
        "sequence_parallel_size": sp_size,
        "train_batch_size": global_batch_size(per_device_batch, accumulation, world_size, sp_size),
    }


# --------------------------------------------------------------------------- process groups


def init_sequence_parallel_groups(sp_size: int):
    """DeepSpeed's SP groups (ranks [k·N, (k+1)·N) share an image) and its mpu, given to every engine built after.

    `deepspeed.initialize` only takes an mpu through accelerate's LM-only ParallelismConfig path, so the mpu is
    installed where the engine and ZeRO read it (`deepspeed.utils.groups.mpu`). Returns the mpu module."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    from deepspeed.utils import groups

    init_deepspeed_comm()
    if mpu._SEQUENCE_PARALLEL_GROUP is None:
        mpu.initialize_sequence_parallel(sp_size)
    elif mpu.get_sequence_parallel_world_size() != sp_size:
        raise RuntimeError(
            f"sequence-parallel groups already built with size {mpu.get_sequence_parallel_world_size()}"
        )
    groups.mpu = mpu
    return mpu


# --------------------------------------------------------------------------- autograd pieces


class _GatherSequence(torch.autograd.Function):
    """All-gather the local token chunks along dim 1. Backward: this rank's slice times N (see module docstring:
    every rank's head already holds the full upstream gradient, so no communication is needed)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group, sp_rank: int, sp_size: int) -> torch.Tensor:
        ctx.sp_rank, ctx.sp_size, ctx.chunk = sp_rank, sp_size, local.shape[1]
        parts = [torch.empty_like(local) for _ in range(sp_size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = ctx.sp_rank * ctx.chunk
        return grad[:, start : start + ctx.chunk] * ctx.sp_size, None, None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward (logits and the logged loss stay the true ones); multiplies the gradient by `scale`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.clone()  # not a view: later in-place ops (the Trainer scales its loss in place) stay legal

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


# --------------------------------------------------------------------------- attention dispatch

_ORIGINAL_ATTENTION: dict[str, Any] = {}
_SP_ATTR = "_hf_vit_sequence_parallel"  # set on each ViTAttention of an SP model (plain attribute, not a submodule)


def _padding_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(bs, L_pad) positions, -1 for padding -> sdpa's boolean key mask (True = attend), (bs, 1, 1, L_pad)."""
    return (position_ids >= 0)[:, None, None, :]


def _install_attention_dispatch(implementation: str) -> None:
    """Route `implementation` through Ulysses for the attention modules of SP models only; every other model in the
    process (a non-parallel reference, an eval copy) keeps the original function. The model's config is untouched,
    so a saved model carries no SP setting."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation in _ORIGINAL_ATTENTION:
        return
    original = ALL_ATTENTION_FUNCTIONS[implementation]
    _ORIGINAL_ATTENTION[implementation] = original

    def dispatch(module, query, key, value, attention_mask, *args, **kwargs):
        sp = getattr(module, _SP_ATTR, None)
        if sp is None or not module.training:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        return sp.attention(module, query, key, value, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[implementation] = dispatch


# --------------------------------------------------------------------------- the ViT glue


class ViTSequenceParallel:
    """Attach to a `ViTForImageClassification` (or `ViTModel`) to split every training image's sequence over the SP
    group. `init_sequence_parallel_groups` must have run (it builds DeepSpeed's groups)."""

    def __init__(self, sp_size: int, loss_grad_scale: float):
        import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu

        self.sp_size = sp_size
        self.group = mpu.get_sequence_parallel_group()
        self.sp_rank = mpu.get_sequence_parallel_rank()
        self.dp_size = dist.get_world_size() // sp_size
        self.dp_rank = dist.get_rank() // sp_size  # parallel_state_sp: ranks [k·N, (k+1)·N) form SP group k
        self.src_rank = self.dp_rank * sp_size  # global rank of this group's first member
        self.loss_grad_scale = loss_grad_scale
        self.model = None
        self._ulysses: dict[int, Any] = {}  # one DeepSpeed Ulysses module per micro-batch size
        self._hooks = []
        self.seq_len = self.padded_len = None
        self._local_positions = None

    # ---- sizes

    def split_sizes(self, seq_len: int) -> tuple[int, int]:
        """(padded length, tokens per rank): 4,097 tokens on 2 ranks -> (4,098, 2,049)."""
        chunk = math.ceil(seq_len / self.sp_size)
        return chunk * self.sp_size, chunk

    # ---- attach / detach

    def attach(self, model: torch.nn.Module) -> "ViTSequenceParallel":
        vit = getattr(model, "vit", model)
        config = model.config
        check_head_count(config.num_attention_heads, self.sp_size)
        implementation = config._attn_implementation or "eager"
        if implementation not in SUPPORTED_ATTENTION:
            raise UserInputError(
                f"attention {implementation!r} is not supported with sequence parallelism. "
                "Fix: --attn_implementation sdpa."
            )
        _install_attention_dispatch(implementation)
        self.model, self.config, self.implementation = model, config, implementation
        for layer in vit.layers:
            object.__setattr__(layer.attention, _SP_ATTR, self)  # not registered as a submodule: no state_dict change
        self._hooks = [
            vit.embeddings.register_forward_pre_hook(self._same_pixels_in_group),
            vit.embeddings.register_forward_hook(self._split),
            vit.layernorm.register_forward_pre_hook(self._gather),
            # The model's last output (logits; a bare ViTModel's outputs): scaling its gradient scales the loss's,
            # whichever loss is computed from it (the model's own, the Trainer's label smoothing, a custom one).
            getattr(model, "classifier", model).register_forward_hook(self._scale_loss_grad),
        ]
        return self

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.model is not None:
            for layer in getattr(self.model, "vit", self.model).layers:
                if getattr(layer.attention, _SP_ATTR, None) is self:
                    object.__delattr__(layer.attention, _SP_ATTR)

    # ---- hooks

    def _same_pixels_in_group(self, module, args):
        """Augmentation ran on every rank with its own RNG: the group's first rank decides the pixels."""
        if not module.training or not args:
            return None
        pixels = args[0].contiguous()
        dist.broadcast(pixels, src=self.src_rank, group=self.group)
        return (pixels, *args[1:])

    def _split(self, module, args, output):
        if not module.training:
            return None
        batch, seq_len, _ = output.shape
        padded, chunk = self.split_sizes(seq_len)
        self.seq_len, self.padded_len = seq_len, padded
        if padded != seq_len:
            output = torch.nn.functional.pad(output, (0, 0, 0, padded - seq_len))
        start = self.sp_rank * chunk
        positions = torch.arange(start, start + chunk, device=output.device)
        positions = positions.masked_fill(positions >= seq_len, -1)  # padding -> -1 -> masked key
        self._local_positions = positions.unsqueeze(0).expand(batch, chunk)
        return output[:, start : start + chunk]

    def _gather(self, module, args):
        if not module.training:
            return None
        full = _GatherSequence.apply(args[0], self.group, self.sp_rank, self.sp_size)
        return (full[:, : self.seq_len], *args[1:])

    def _scale_loss_grad(self, module, args, output):
        if not module.training or self.loss_grad_scale == 1.0:
            return None
        if isinstance(output, torch.Tensor):
            return _ScaleGrad.apply(output, self.loss_grad_scale)
        for key in ("last_hidden_state", "pooler_output"):  # a bare ViTModel
            if output.get(key) is not None:
                output[key] = _ScaleGrad.apply(output[key], self.loss_grad_scale)
        return output

    # ---- attention

    def _ulysses_for(self, batch_size: int, module):
        if batch_size not in self._ulysses:
            from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

            heads = self.config.num_attention_heads
            self._ulysses[batch_size] = UlyssesSPAttentionHF(
                attn=self._core_attention,
                batch_size=batch_size,
                attn_head_count=heads,
                attn_head_size=module.head_dim,
                kv_head_count=heads,
                num_hidden_layers=self.config.num_hidden_layers,
                process_group=self.group,
                seq_length_is_variable=True,
                disable_in_eval=True,
            )
        return self._ulysses[batch_size]

    def attention(self, module, query, key, value, *args, **kwargs):
        """query/key/value: (bs, heads, L_pad/N, head_dim) on this rank -> (bs, L_pad/N, heads, head_dim)."""
        kwargs["position_ids"] = self._local_positions
        return self._ulysses_for(query.shape[0], module)(module, query, key, value, None, *args, **kwargs)

    def _core_attention(self, module, query, key, value, attention_mask, *args, position_ids=None, **kwargs):
        """Called by Ulysses after the all-to-all: (bs, heads/N, L_pad, head_dim), positions all-gathered."""
        if self.padded_len != self.seq_len and position_ids is not None:
            attention_mask = _padding_mask(position_ids)
        original = _ORIGINAL_ATTENTION[self.implementation]
        return original(module, query, key, value, attention_mask, *args, **kwargs)


# --------------------------------------------------------------------------- data


def shard_dataloader_by_data_parallel_rank(dataloader, dp_size: int, dp_rank: int):
    """accelerate shards a prepared dataloader over all processes; with SP the N ranks of a group must get the same
    batches, so the shard count is the data-parallel size (world / N) and the shard index the group's index. The same
    seeded global order is kept, so with one group the batches are exactly those of a one-process run."""
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    if batch_sampler is None or not hasattr(batch_sampler, "num_processes"):
        raise RuntimeError("sequence parallelism expects accelerate's BatchSamplerShard in the training dataloader")
    batch_sampler.num_processes = dp_size
    batch_sampler.process_index = dp_rank
    return dataloader


def setup_sequence_parallel(sp_size: int, zero_stage: int | None) -> ViTSequenceParallel | None:
    """Build DeepSpeed's SP groups and mpu; call after `init_deepspeed_comm` and before the model is built
    (ZeRO-3's zero.Init partitions over the sequence-data-parallel world), once the DeepSpeed config the Trainer will
    use holds `sequence_parallel_ds_values`. None when sp_size is 1."""
    if sp_size <= 1:
        return None
    init_sequence_parallel_groups(sp_size)
    return ViTSequenceParallel(sp_size, sequence_parallel_loss_grad_scale(sp_size, zero_stage))
