"""Worker for tests/launched/test_sequence_parallel_launched.py, launched as
`torchrun --nproc_per_node W tests/launched/workers/sp_worker.py OUT.json`.

SP groups of 2 ranks, W / 2 data-parallel groups. Every rank builds the same tiny ViT (same seed) twice: a
non-parallel reference and a copy with sequence parallelism. It measures, and rank 0 writes to OUT.json:
- logits and gradients of SP vs reference, for a padded (17 tokens) and an evenly split (10 tokens) sequence;
- evaluation mode: SP is off, each rank runs its own images in full;
- parameters after a few SGD steps through DeepSpeed engines at ZeRO 0, 1, 2 and 3 vs plain torch SGD on the same
  global batches (each SP group trains on its slice of it) (SGD, not Adam: Adam's update hardly changes when the
  gradient is scaled, so it would hide a 2x error);
- the Trainer's training batches on each rank (the ranks of one SP group must get the same ones).
"""

import copy
import json
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
from transformers import TrainingArguments, ViTConfig, ViTForImageClassification  # noqa: E402

from hf_vit_scaling.parallel.distributed import shutdown_distributed  # noqa: E402
from hf_vit_scaling.parallel.sequence_parallel import (  # noqa: E402
    ViTSequenceParallel,
    sequence_parallel_loss_grad_scale,
    setup_sequence_parallel,  # noqa: E402
)
from hf_vit_scaling.training.trainer import VitTrainer  # noqa: E402

SP = 2
BATCH = 3


def tiny_config(image_size: int) -> ViTConfig:
    config = ViTConfig(
        image_size=image_size,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = "sdpa"
    return config


def build(config: ViTConfig, seed: int = 0) -> ViTForImageClassification:
    torch.manual_seed(seed)
    return ViTForImageClassification(config).train()


def batch(image_size: int, seed: int, n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, image_size, image_size, generator=g), torch.randint(0, 5, (n,), generator=g)


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def forward_backward_check(image_size: int, checkpointing: bool = False) -> dict:
    config = tiny_config(image_size)
    reference = build(config)
    model = copy.deepcopy(reference)
    if checkpointing:  # layers recomputed in backward: the all-to-alls run again there
        model.gradient_checkpointing_enable()
    ViTSequenceParallel(SP, sequence_parallel_loss_grad_scale(SP, 2)).attach(model)
    pixels, labels = batch(image_size, seed=1)
    ref_out = reference(pixel_values=pixels, labels=labels)
    ref_out.loss.backward()
    out = model(pixel_values=pixels, labels=labels)
    out.loss.backward()
    grads = {}
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        grad = p.grad.clone()
        dist.all_reduce(grad, group=sp_state.group)  # ZeRO 0-2 sum over the SP group
        grads[name] = (grad, q.grad)
    # Per tensor, relative to the tensor's largest reference entry. Tensors whose gradient is zero in exact arithmetic
    # (k_proj.bias: softmax ignores a constant added to every key; its reference gradient is ~1e-9 rounding noise)
    # are left out of the relative figure, and their absolute difference is reported instead.
    largest = max(float(ref.abs().max()) for _, ref in grads.values())
    nontrivial = {n: g for n, g in grads.items() if float(g[1].abs().max()) > 1e-6 * largest}
    grad_rel = max(max_rel(grad, ref) for grad, ref in nontrivial.values())
    grad_abs_trivial = max([float((g - r).abs().max()) for n, (g, r) in grads.items() if n not in nontrivial] or [0.0])
    # Evaluation: SP is off, so each rank may run different images in full.
    model.eval()
    reference.eval()
    own_pixels, _ = batch(image_size, seed=10 + dist.get_rank())
    with torch.no_grad():
        eval_rel = max_rel(model(pixel_values=own_pixels).logits, reference(pixel_values=own_pixels).logits)
    tokens = (image_size // 4) ** 2 + 1
    return {
        "tokens": tokens,
        "padded": tokens % SP != 0,
        "gradient_checkpointing": checkpointing,
        "logits_max_rel": max_rel(out.logits, ref_out.logits),
        "loss_equal": float(out.loss) == float(ref_out.loss),
        "grad_max_rel": grad_rel,
        "grad_tensors_compared": len(nontrivial),
        "grad_tensors": len(grads),
        "grad_max_abs_diff_zero_grads": grad_abs_trivial,
        "grad_largest": largest,
        "eval_logits_max_rel": eval_rel,
    }


def gathered_parameters(model) -> dict[str, torch.Tensor]:
    params = list(model.parameters())
    if hasattr(params[0], "ds_id"):
        with deepspeed.zero.GatheredParameters(params):
            return {n: p.detach().clone() for n, p in model.named_parameters()}
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def zero_steps(spec: str, steps: int = 3, lr: float = 0.5) -> dict:
    """spec: a stage ("0".."3"), or "2o" / "3o" for the shipped offload configs' shape (optimizer on the CPU; ZeRO-3
    parameters too)."""
    stage, offload = int(spec[0]), spec.endswith("o")
    image_size = 16  # 17 tokens: the padded case
    config = tiny_config(image_size)
    reference = build(config)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    ds_config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
    }
    if offload:
        ds_config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            ds_config["zero_optimization"]["offload_param"] = {"device": "cpu"}
        ds_config["zero_force_ds_cpu_optimizer"] = False  # plain torch SGD, as the reference
    world = dist.get_world_size()
    from hf_vit_scaling.parallel.sequence_parallel import sequence_parallel_ds_values

    ds_config.update(sequence_parallel_ds_values(SP, BATCH, 1, world))
    model = build(config)
    ViTSequenceParallel(SP, sequence_parallel_loss_grad_scale(SP, ds_config["zero_optimization"]["stage"])).attach(
        model
    )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr), config=ds_config
    )
    losses, ref_losses = [], []
    dp, group = world // SP, sp_state.dp_rank
    for step in range(steps):
        # The global batch holds dp x BATCH images; SP group k trains on slice k, the reference on all of it.
        pixels, labels = batch(image_size, seed=100 + step, n=dp * BATCH)
        mine = slice(group * BATCH, (group + 1) * BATCH)
        loss = engine(pixel_values=pixels[mine], labels=labels[mine]).loss
        engine.backward(loss)
        engine.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # mean over ranks = mean over groups = the global batch's mean loss
        losses.append(float(mean_loss) / world)
        ref_opt.zero_grad()
        ref_loss = reference(pixel_values=pixels, labels=labels).loss
        ref_loss.backward()
        ref_opt.step()
        ref_losses.append(float(ref_loss))
    params = gathered_parameters(engine.module)
    ref = dict(reference.named_parameters())
    moved = max(float((ref[n] - p0).abs().max()) for n, p0 in build(config).named_parameters())
    diff = max(float((params[n] - ref[n].detach()).abs().max()) for n in ref)
    # Relative to how far the reference moved: a half-size update gives about 0.5.
    return {
        "stage": spec,
        "param_max_abs_diff": diff,
        "reference_max_update": moved,
        "diff_over_update": diff / moved,
        "losses": losses,
        "reference_losses": ref_losses,
    }


def trainer_batches(tmp: str) -> list[list[int]]:
    from datasets import Dataset

    dataset = Dataset.from_dict({"pixel_values": [[float(i)] for i in range(40)], "labels": list(range(40))})
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        seed=3,
        remove_unused_columns=False,
        dataloader_pin_memory=False,
    )
    trainer = VitTrainer(
        model=build(tiny_config(12)),
        args=args,
        train_dataset=dataset,
        data_collator=lambda rows: {"labels": torch.tensor([r["labels"] for r in rows])},
    )
    trainer.sequence_parallel = sp_state
    with_sp = [b["labels"].tolist() for b in trainer.get_train_dataloader()]
    trainer.sequence_parallel = None
    without = [b["labels"].tolist() for b in trainer.get_train_dataloader()]
    return {"with_sp": with_sp, "without_sp": without}


if __name__ == "__main__":
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="gloo")
    sp_state = setup_sequence_parallel(SP, 2)
    torch.set_num_threads(1)
    result = {"world_size": dist.get_world_size(), "dp_rank": sp_state.dp_rank, "sp_rank": sp_state.sp_rank}
    result["forward_backward"] = [
        forward_backward_check(16),
        forward_backward_check(12),
        forward_backward_check(16, True),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        result["trainer_batches"] = trainer_batches(tmp)
    stages = os.environ.get("SP_WORKER_STAGES", "0,1,2,3,2o,3o").split(",")
    result["zero"] = [zero_steps(stage) for stage in stages]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump({"ranks": gathered}, f, indent=2)
    shutdown_distributed()  # barrier, destroy, then drain gloo's workers (docs/reliability.md)
