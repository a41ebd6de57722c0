"""Tests `regularization.ema`: the EMA callback on a toy model and a tiny ViT."""

from types import SimpleNamespace

import pytest
import torch

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.regularization.ema import EMA_FILENAME, EMACallback


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


def test_a_skipped_step_is_left_out_of_the_average():
    """--on_nonfinite_loss skip: the weights did not move at step 2, and the EMA must not average them in again."""
    model = toy_model()
    ema = EMACallback(0.9)
    ema.skipped_steps = [2]
    ema.on_train_begin(None, SimpleNamespace(global_step=0), None, model=model)
    take_steps(model, ema, 1)
    after_step_1 = {n: t.clone() for n, t in ema.shadow.items()}
    ema.on_step_end(None, SimpleNamespace(global_step=2), None, model=model)  # skipped: no update, same weights
    assert all(torch.equal(ema.shadow[n], after_step_1[n]) for n in after_step_1) and ema.global_step == 2
    ema.on_step_end(None, SimpleNamespace(global_step=3), None, model=model)
    assert not all(torch.equal(ema.shadow[n], after_step_1[n]) for n in after_step_1)


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


def test_with_load_best_model_at_end_the_ema_is_the_best_checkpoint_s(tmp_path):
    """The Trainer puts the best checkpoint's weights in the model before `on_train_end`; the EMA saved beside
    them must be the same step's, not the last step's."""
    model = toy_model()
    ema = EMACallback(0.9)
    ema.on_train_begin(None, SimpleNamespace(global_step=0), None, model=model)
    take_steps(model, ema, 3, seed=1)
    best = tmp_path / "checkpoint-3"
    best.mkdir()
    ema.save_state(str(best))
    at_best = {n: t.clone() for n, t in ema.shadow.items()}
    take_steps(model, ema, 3, first_step=4, seed=2)
    last = {n: t.clone() for n, t in ema.shadow.items()}
    assert not all(torch.equal(at_best[n], last[n]) for n in last)

    args = SimpleNamespace(load_best_model_at_end=False)
    state = SimpleNamespace(best_model_checkpoint=str(best), global_step=6)
    ema.on_train_end(args, state, None, model=model)
    assert all(torch.equal(ema.shadow[n], last[n]) for n in last) and ema.best_step is None  # not asked: the last

    ema.on_train_end(SimpleNamespace(load_best_model_at_end=True), state, None, model=model)
    assert all(torch.equal(ema.shadow[n], at_best[n]) for n in at_best)
    assert ema.global_step == ema.best_step == 3
