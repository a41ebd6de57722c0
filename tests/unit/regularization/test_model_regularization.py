"""Stochastic depth, the EMA callback and layer-wise lr decay, on a tiny ViT and a toy model."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer, TrainingArguments, ViTForImageClassification

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.regularization.drop_path import DropPath, drop_path_rates, vit_blocks
from hf_vit_scaling.regularization.ema import EMA_FILENAME, EMACallback
from hf_vit_scaling.regularization.layer_decay import (
    LAYER_DECAY_FILENAME,
    LayerDecayReport,
    layer_decay_optimizer_cls_and_kwargs,
    layer_decay_param_groups,
    vit_layer_ids,
)

SIZE = 16  # the tiny_vit fixture's image size


def pixels(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- stochastic depth


def test_drop_path_rates_rise_linearly_over_depth():
    assert drop_path_rates(4, 0.3) == pytest.approx([0.0, 0.1, 0.2, 0.3])  # DeiT: linspace(0, rate, L)
    assert drop_path_rates(12, 0.1)[-1] == pytest.approx(0.1)
    assert drop_path_rates(1, 0.5) == [0.0]


def test_drop_path_is_the_identity_in_eval_and_leaves_a_plain_saved_model(tiny_vit, tmp_path):
    tiny_vit.eval()
    x = pixels(8)
    with torch.no_grad():
        before = tiny_vit(pixel_values=x).logits
        DropPath(tiny_vit, 0.5)
        assert torch.equal(tiny_vit(pixel_values=x).logits, before)
        tiny_vit.save_pretrained(tmp_path)
        reloaded = ViTForImageClassification.from_pretrained(tmp_path).eval()
        assert type(reloaded) is ViTForImageClassification
        assert torch.allclose(reloaded(pixel_values=x).logits, before, atol=1e-6)


def test_drop_path_drops_whole_branches_per_image_at_the_configured_rates(tiny_vit):
    """Each (image, branch) is either all zeros or the undropped output x 1 / (1 - p); the dropped fraction over
    n images is within 4.5 standard deviations (sqrt(p (1 - p) / n)) of p."""
    n, rate = 1500, 0.6
    drop = DropPath(tiny_vit, rate)
    assert drop.rates == pytest.approx([0.0, 0.2, 0.4, 0.6])
    seen = {}

    def observer(key, stage):
        def hook(module, args, output):
            seen[(key, stage)] = (output[0] if isinstance(output, tuple) else output).detach()

        return hook

    for i, (_, layer) in enumerate(vit_blocks(tiny_vit)[1]):
        for branch_name in ("attention", "mlp"):
            branch = getattr(layer, branch_name)
            branch.register_forward_hook(observer((i, branch_name), "raw"), prepend=True)  # before the drop
            branch.register_forward_hook(observer((i, branch_name), "out"))  # after it
    tiny_vit.train()
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_vit(pixel_values=pixels(n))
    for i, p in enumerate(drop.rates):
        for branch_name in ("attention", "mlp"):
            check_branch(seen[((i, branch_name), "raw")], seen[((i, branch_name), "out")], p, n, (i, branch_name))
    drop.remove()
    with torch.no_grad():
        tiny_vit(pixel_values=pixels(4))
    assert torch.equal(seen[((3, "mlp"), "raw")], seen[((3, "mlp"), "out")])


def check_branch(raw, out, p, n, where):
    dropped = (out == 0).flatten(1).all(dim=1)
    kept = torch.isclose(out, raw / (1 - p), rtol=1e-5, atol=1e-6).flatten(1).all(dim=1)
    assert torch.equal(dropped | kept, torch.ones(n, dtype=torch.bool)), where
    tolerance = 4.5 * math.sqrt(p * (1 - p) / n)
    assert dropped.float().mean().item() == pytest.approx(p, abs=tolerance + 1e-9), where


# ---------------------------------------------------------------- EMA


def toy_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))


def take_steps(model, ema, steps, first_step=1, seed=0):
    """Stand-in for optimizer steps: new random weights each step, then the callback's on_step_end."""
    history = []
    gen = torch.Generator().manual_seed(seed)
    for step in range(first_step, first_step + steps):
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
        ema.on_step_end(None, SimpleNamespace(global_step=step), None, model=model)
    return history


def test_ema_after_k_steps_is_the_closed_form():
    model, decay, k = toy_model(), 0.9, 7
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    ema = EMACallback(decay)
    ema.on_train_begin(None, SimpleNamespace(global_step=0), None, model=model)
    history = take_steps(model, ema, k)
    for name in start:  # ema_k = d^k w_0 + (1 - d) sum_{j=1..k} d^(k-j) w_j
        expected = decay**k * start[name] + (1 - decay) * sum(
            decay ** (k - j) * history[j - 1][name] for j in range(1, k + 1)
        )
        assert torch.allclose(ema.shadow[name], expected, atol=1e-6)
    assert ema.global_step == k


def test_ema_resumes_exactly_from_its_checkpoint_file(tmp_path):
    model = toy_model()
    straight = EMACallback(0.95)
    straight.on_train_begin(None, SimpleNamespace(global_step=0), None, model=model)
    take_steps(model, straight, 4, seed=1)
    straight.save_state(str(tmp_path))
    assert (tmp_path / EMA_FILENAME).is_file()
    take_steps(model, straight, 3, first_step=5, seed=2)

    resumed = EMACallback(0.95, resume_from=str(tmp_path))
    resumed.on_train_begin(None, SimpleNamespace(global_step=4), None, model=model)
    take_steps(model, resumed, 3, first_step=5, seed=2)
    for name in straight.shadow:
        assert torch.equal(straight.shadow[name], resumed.shadow[name])

    with pytest.raises(UserInputError, match="step 4, the checkpoint is at step 5"):
        EMACallback(0.95, resume_from=str(tmp_path)).on_train_begin(
            None, SimpleNamespace(global_step=5), None, model=model
        )
    with pytest.raises(UserInputError, match="saved without --ema_decay"):
        EMACallback(0.95, resume_from=str(tmp_path / "elsewhere")).on_train_begin(
            None, SimpleNamespace(global_step=4), None, model=model
        )


def test_ema_weights_are_swapped_in_and_back(tiny_vit):
    ema = EMACallback(0.5)
    ema.on_train_begin(None, SimpleNamespace(global_step=0), None, model=tiny_vit)
    own = {n: p.detach().clone() for n, p in tiny_vit.named_parameters()}
    for shadow in ema.shadow.values():
        shadow.add_(1.0)
    with ema.applied(tiny_vit):
        assert all(torch.equal(p, ema.shadow[n]) for n, p in tiny_vit.named_parameters())
    assert all(torch.equal(p, own[n]) for n, p in tiny_vit.named_parameters())


def test_ema_refuses_zero3_partitioned_parameters():
    model = toy_model()
    next(model.parameters()).ds_id = 0  # what DeepSpeed ZeRO-3 sets on each partitioned parameter
    with pytest.raises(UserInputError, match="ZeRO-3"):
        EMACallback(0.9).on_train_begin(None, SimpleNamespace(global_step=0), None, model=model)


# ---------------------------------------------------------------- layer-wise lr decay


def expected_layer_id(name: str, num_layers: int) -> int:
    if name.startswith("vit.embeddings."):
        return 0
    if name.startswith("vit.layers."):
        return int(name.split(".")[2]) + 1
    return num_layers + 1  # final LayerNorm, classifier


def test_layer_ids_follow_beit(tiny_vit):
    ids, num_layers = vit_layer_ids(tiny_vit)
    assert num_layers == 4
    assert ids == {name: expected_layer_id(name, 4) for name, _ in tiny_vit.named_parameters()}


def test_layer_decay_gives_each_parameter_its_lr_through_the_trainer(tiny_vit, tmp_path):
    base, decay = 1e-3, 0.5
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        learning_rate=base,
        weight_decay=0.05,
        warmup_steps=2,
        lr_scheduler_type="cosine",
    )
    trainer = Trainer(model=tiny_vit, args=args)
    trainer.optimizer_cls_and_kwargs = layer_decay_optimizer_cls_and_kwargs(trainer, tiny_vit, decay)
    optimizer = trainer.create_optimizer()
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    decayed = set(trainer.get_decay_parameter_names(tiny_vit))
    for name, param in tiny_vit.named_parameters():
        group = group_of[id(param)]
        assert group["lr"] == pytest.approx(base * decay ** (5 - expected_layer_id(name, 4))), name
        assert group["weight_decay"] == (0.05 if name in decayed else 0.0), name
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(tiny_vit.parameters()))
    # The schedule scales every group alike; the first group (logged as learning_rate) is the head's, at the base lr.
    scheduler = trainer.create_scheduler(num_training_steps=10, optimizer=optimizer)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    factor = scheduler.get_last_lr()[0] / base
    assert 0 < factor < 1
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(base * factor * decay ** (5 - group["layer_id"]))


def test_layer_decay_groups_put_the_head_first_and_skip_frozen_parameters(tiny_vit):
    tiny_vit.vit.embeddings.cls_token.requires_grad_(False)
    decay_names = [n for n, _ in tiny_vit.named_parameters() if not n.endswith("bias")]
    groups = layer_decay_param_groups(tiny_vit, 1.0, 0.1, 0.75, decay_names)
    assert groups[0]["layer_id"] == 5 and groups[0]["lr"] == 1.0 and groups[-1]["layer_id"] == 0
    assert all(p is not tiny_vit.vit.embeddings.cls_token for g in groups for p in g["params"])


def test_layer_decay_refuses_optimizers_that_build_their_own_groups(tiny_vit):
    fake = SimpleNamespace(
        args=SimpleNamespace(optim="lomo", learning_rate=1e-3, weight_decay=0.0),
        get_optimizer_cls_and_kwargs=lambda args, model: (torch.optim.SGD, {"model": model}),
        get_decay_parameter_names=lambda model: [],
    )
    with pytest.raises(UserInputError, match="--optim lomo builds its own"):
        layer_decay_optimizer_cls_and_kwargs(fake, tiny_vit, 0.75)


def test_layer_decay_report_writes_the_lrs_the_optimizer_holds_with_parameter_names(tiny_vit, tmp_path):
    groups = layer_decay_param_groups(tiny_vit, 1e-3, 0.0, 0.5, [])
    report = LayerDecayReport()
    report.record(tiny_vit, groups)
    optimizer = torch.optim.AdamW(groups)
    for group in optimizer.param_groups:
        group["lr"] *= 0.1  # what a schedule does before the first step (e.g. warmup)
    args = SimpleNamespace(output_dir=str(tmp_path / "run"), should_save=True)
    report.on_train_begin(args, SimpleNamespace(global_step=0), None, optimizer=optimizer)

    written = json.loads((tmp_path / "run" / LAYER_DECAY_FILENAME).read_text(encoding="utf-8"))
    assert written["step"] == 1 and written["optimizer"] == ["AdamW"] and written["world_size"] == 1
    assert written["same_on_every_rank"]
    assert [g["layer_id"] for g in written["groups"]] == [5, 4, 3, 2, 1, 0]
    names = {id(p): n for n, p in tiny_vit.named_parameters()}
    for group, live in zip(written["groups"], optimizer.param_groups):
        assert group["params"] == [names[id(p)] for p in live["params"]]
        assert group["lr"] == pytest.approx(1e-4 * 0.5 ** (5 - group["layer_id"]))
        assert group["lr_scale"] == 0.5 ** (5 - group["layer_id"])

    optimizer.param_groups.reverse()  # not the groups it recorded
    with pytest.raises(RuntimeError, match="not the ones built for it"):
        report.on_train_begin(args, SimpleNamespace(global_step=0), None, optimizer=optimizer)
