"""Tests `parallel.deepspeed_fast_paths` without a process group: the pins, the switch, the fp64 norm and the skipped
re-pointing. Whole runs with and without them: tests/launched/test_deepspeed_fast_paths.py."""

from types import SimpleNamespace

import pytest
import torch

from hf_vit_scaling.parallel import deepspeed_fast_paths as fast


def originals() -> dict:
    """DeepSpeed's own function for each fast path, whether or not this process installed them."""
    installed = dict(fast._INSTALLED)
    return {
        path.name: installed[path.name][1] if path.name in installed else getattr(fast.owner_of(path), path.attribute)
        for path in fast.FAST_PATHS
    }


def test_every_fast_path_is_pinned_to_the_installed_deepspeed_source():
    """Fails after a DeepSpeed upgrade that changes a replaced method: review the replacement against the new code,
    then update its `source_sha` (until then the recipe runs DeepSpeed's own code and says so)."""
    changed = {
        name: fast.source_sha(original)
        for name, original in originals().items()
        if fast.source_sha(original) != next(p.source_sha for p in fast.FAST_PATHS if p.name == name)
    }
    assert not changed, f"DeepSpeed changed these methods; review and re-pin: {changed}"


def test_a_changed_deepspeed_method_keeps_its_fast_path_off(monkeypatch):
    path = fast.FAST_PATHS[0]
    monkeypatch.setattr(fast, "FAST_PATHS", (fast.FastPath(**{**path.__dict__, "source_sha": "0" * 16}),))
    monkeypatch.setattr(fast, "_INSTALLED", {})
    before = getattr(fast.owner_of(path), path.attribute)
    status = fast.install_deepspeed_fast_paths()
    assert status[path.name].startswith("off (DeepSpeed's get_grad_norm_direct is not the reviewed version")
    assert getattr(fast.owner_of(path), path.attribute) is before


def test_the_switch_leaves_deepspeed_s_code_alone(monkeypatch):
    monkeypatch.setenv(fast.ENV_SWITCH, "0")
    monkeypatch.setattr(fast, "_INSTALLED", {})
    before = {p.name: getattr(fast.owner_of(p), p.attribute) for p in fast.FAST_PATHS}
    status = fast.install_deepspeed_fast_paths()
    assert set(status.values()) == {f"off ({fast.ENV_SWITCH}=0)"}
    assert {p.name: getattr(fast.owner_of(p), p.attribute) for p in fast.FAST_PATHS} == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_in_fp64_equal_deepspeed_s_per_tensor_norm_bit_for_bit(dtype):
    """DeepSpeed: `vector_norm(g.to(float64))` per gradient. ViT-shaped fp32 and bf16 gradients, values over 8 orders
    of magnitude (a mean of squares accumulated in fp32 would differ)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(96, 3, 4, 4), (96,), (17, 96), (288, 96), (96, 96), (192, 96), (96, 192), (10, 96), (10,)]
    grads = [
        (torch.randn(s, generator=generator) * 10.0 ** torch.randint(-4, 4, (1,), generator=generator)).to(dtype)
        for s in shapes
    ]
    expected = [torch.linalg.vector_norm(g.to(torch.float64), ord=2.0) for g in grads]
    got = fast.norms_in(grads, torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert got[0].dtype == torch.float64


def _bit16_optimizer(params: list[torch.nn.Parameter]) -> SimpleNamespace:
    """The fields `_update_model_bit16_weights` reads, for one group: a flat buffer holding the parameters in a
    round-robin order (reversed here), each parameter a view of its slice after DeepSpeed's own method ran."""
    order = params[::-1]
    flat = torch.cat([p.detach().reshape(-1) for p in order])
    offsets = [sum(p.numel() for p in order[:i]) for i in range(len(order))]
    return SimpleNamespace(
        bit16_groups_flat=[flat],
        bit16_groups=[params],
        round_robin_bit16_groups=[order],
        round_robin_bit16_meta=[[torch.empty(p.shape, device="meta") for p in order]],
        round_robin_bit16_offsets=[offsets],
        round_robin_bit16_indices=[{i: len(params) - 1 - i for i in range(len(params))}],
    )


def test_bit16_views_are_skipped_only_while_every_parameter_is_its_slice():
    deepspeed_own = originals()["zero12_bit16_views"]
    calls = []

    def counted(self, group):
        calls.append(group)
        deepspeed_own(self, group)

    replacement = fast._make_zero12_bit16_views(counted)
    params = [torch.nn.Parameter(torch.randn(s)) for s in ((4, 3), (3,), (2, 2))]
    optimizer = _bit16_optimizer(params)
    replacement(optimizer, 0)  # the first step: DeepSpeed points every parameter at the flat buffer
    assert calls == [0]
    flat = optimizer.bit16_groups_flat[0]
    assert all(flat.data_ptr() <= p.data_ptr() < flat.data_ptr() + flat.numel() * 4 for p in params)
    replacement(optimizer, 0)  # nothing to change: skipped
    assert calls == [0]
    params[1].data = torch.zeros(3)  # a load replaced one: DeepSpeed's method runs and points it back
    replacement(optimizer, 0)
    assert calls == [0, 0] and flat.data_ptr() <= params[1].data_ptr() < flat.data_ptr() + flat.numel() * 4
