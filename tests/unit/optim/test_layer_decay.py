"""Tests `optim.layer_decay`: layer-wise lr decay, through the Trainer and its report."""

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer, TrainingArguments

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.optim.layer_decay import (
    LAYER_DECAY_FILENAME,
    LayerDecayReport,
    layer_decay_optimizer_cls_and_kwargs,
    layer_decay_param_groups,
    vit_layer_ids,
)


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
