"""Tests `parallel.fast_paths` (the registry, and its replacements in `zero12`, `zero3`) without a
process group: the pins, the switch, the fp64 norm and the skipped re-pointing.
Whole runs with and without them: tests/launched/test_deepspeed_fast_paths.py."""

from types import SimpleNamespace

import pytest
import torch

from hf_vit_scaling.parallel.fast_paths import registry as fast
from hf_vit_scaling.parallel.fast_paths import zero3, zero12


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
    paths = {path.name: path for path in fast.FAST_PATHS}
    changed = {
        (name, attribute): sha
        for name, original in originals().items()
        for attribute, sha in fast.pins_of(paths[name], original).items()
        if sha != fast.reviewed_pins(paths[name])[attribute]
    }
    assert not changed, f"DeepSpeed changed these methods; review and re-pin: {changed}"


def test_a_changed_method_a_fast_path_does_the_work_of_keeps_it_off(monkeypatch):
    """`zero12_file_at_once` files the gradients as DeepSpeed's per-tensor chain would: a change in that chain (not
    the replaced method itself) keeps it off too."""
    path = next(p for p in fast.FAST_PATHS if p.name == "zero12_file_at_once")
    attribute, _ = path.also_pins[-1]
    stale = fast.FastPath(**{**path.__dict__, "also_pins": (*path.also_pins[:-1], (attribute, "0" * 16))})
    monkeypatch.setattr(fast, "FAST_PATHS", (stale,))
    monkeypatch.setattr(fast, "_INSTALLED", {})
    before = getattr(fast.owner_of(path), path.attribute)
    status = fast.install_deepspeed_fast_paths()
    assert status[path.name] == f"off (DeepSpeed's {attribute} is not the reviewed version)"
    assert getattr(fast.owner_of(path), path.attribute) is before


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


def test_the_switch_puts_back_what_an_earlier_install_replaced(monkeypatch):
    """Fails if the switch set after an install (a second run in one process, a benchmark's arm) only reports "off"
    while DeepSpeed's methods stay replaced."""
    ours = {p.name for p in fast.FAST_PATHS} - fast._INSTALLED.keys()
    try:
        monkeypatch.setenv(fast.ENV_SWITCH, "1")
        assert set(fast.install_deepspeed_fast_paths().values()) == {"on"}
        monkeypatch.setenv(fast.ENV_SWITCH, "0")
        fast.install_deepspeed_fast_paths()
        assert not fast._INSTALLED
        assert all(getattr(fast.owner_of(p), p.attribute) is originals()[p.name] for p in fast.FAST_PATHS)
        assert all(getattr(fast.owner_of(p), p.attribute).__module__.startswith("deepspeed") for p in fast.FAST_PATHS)
    finally:
        for name in ours & fast._INSTALLED.keys():  # leave the process as this test found it
            owner, original = fast._INSTALLED.pop(name)
            setattr(owner, next(p for p in fast.FAST_PATHS if p.name == name).attribute, original)


def test_the_switch_leaves_out_the_paths_it_names_and_their_other_parts(monkeypatch):
    """`-name,...` leaves those paths (and the paths that require them) out, the rest on: the leave-one-out arms of
    benchmarks/engine_overhead.py; a path installed earlier in the process goes back to DeepSpeed's method."""
    ours = {p.name for p in fast.FAST_PATHS} - fast._INSTALLED.keys()
    try:
        monkeypatch.setenv(fast.ENV_SWITCH, "1")
        fast.install_deepspeed_fast_paths()
        monkeypatch.setenv(fast.ENV_SWITCH, "-zero12_grad_norm, -zero3_whole_through_step_gather")
        status = fast.install_deepspeed_fast_paths()
        left_out = f"off ({fast.ENV_SWITCH} leaves it out)"
        assert status["zero12_grad_norm"] == status["zero3_whole_through_step_gather"] == left_out
        for part in ("zero3_whole_through_step", "zero3_whole_through_step_release"):
            assert status[part].startswith("off (its part zero3_whole_through_step"), status[part]
        gone_with_the_parts = {"zero3_whole_module_hooks", *fast.WHOLE_THROUGH_STEP_PARTS}  # requires them
        assert {name for name, s in status.items() if s == "on"} == set(status) - {
            "zero12_grad_norm"
        } - gone_with_the_parts
        path = next(p for p in fast.FAST_PATHS if p.name == "zero12_grad_norm")
        assert getattr(fast.owner_of(path), path.attribute) is originals()["zero12_grad_norm"]
        assert "zero12_grad_norm" not in fast._INSTALLED
    finally:
        for name in ours & fast._INSTALLED.keys():
            owner, original = fast._INSTALLED.pop(name)
            setattr(owner, next(p for p in fast.FAST_PATHS if p.name == name).attribute, original)


@pytest.mark.parametrize("value", ["-no_such_path", "zero12_grad_norm", "2"])
def test_a_switch_value_that_names_no_fast_path_is_one_error(monkeypatch, value):
    monkeypatch.setenv(fast.ENV_SWITCH, value)
    with pytest.raises(fast.UserInputError, match=f"{fast.ENV_SWITCH}=") as err:
        fast.install_deepspeed_fast_paths()
    assert len(str(err.value).splitlines()) == 1


def test_a_method_missing_from_deepspeed_turns_its_fast_path_off_without_raising(monkeypatch):
    """DeepSpeed 0.17-0.18.2 have no `setup_buckets` (a method `zero12_file_at_once` pins): installing raised
    AttributeError at the start of every DeepSpeed run. Now that path is off, with the reason, and the rest install."""
    path = next(p for p in fast.FAST_PATHS if p.name == "zero12_file_at_once")
    missing = fast.FastPath(**{**path.__dict__, "also_pins": (*path.also_pins, ("no_such_method", "0" * 16))})
    gone = fast.FastPath(**{**fast.FAST_PATHS[0].__dict__, "module": "deepspeed.no_such_module"})
    monkeypatch.setattr(fast, "FAST_PATHS", (missing, gone))
    monkeypatch.setattr(fast, "_INSTALLED", {})
    before = getattr(fast.owner_of(path), path.attribute)
    status = fast.install_deepspeed_fast_paths()
    assert status[path.name].startswith("off (not in this DeepSpeed:") and "no_such_method" in status[path.name]
    assert status[gone.name].startswith("off (not in this DeepSpeed:") and "no_such_module" in status[gone.name]
    assert getattr(fast.owner_of(path), path.attribute) is before


def test_a_fast_path_of_parts_installs_whole_or_not_at_all(monkeypatch):
    """On DeepSpeed 0.18.9 `_pre_step` differs while `_partition_all_parameters` and `_post_step` match: the two
    halves of `zero3_whole_through_step` were installed without the part that marks the step. All three stay off."""
    parts = [p for p in fast.FAST_PATHS if p.name in fast.WHOLE_THROUGH_STEP_PARTS]
    stale_first = [fast.FastPath(**{**p.__dict__, "source_sha": "0" * 16}) if p.attribute == "_pre_step" else p
                   for p in parts]  # fmt: skip
    monkeypatch.setattr(fast, "FAST_PATHS", tuple(stale_first))
    monkeypatch.setattr(fast, "_INSTALLED", {})
    before = {p.name: getattr(fast.owner_of(p), p.attribute) for p in parts}
    status = fast.install_deepspeed_fast_paths()
    assert status["zero3_whole_through_step"].startswith("off (DeepSpeed's _pre_step")
    assert status["zero3_whole_through_step_release"] == "off (its part zero3_whole_through_step is off)"
    assert status["zero3_whole_through_step_gather"] == "off (its part zero3_whole_through_step is off)"
    assert {p.name: getattr(fast.owner_of(p), p.attribute) for p in parts} == before


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
    got = zero3.norms_in(grads, torch.float64)
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

    replacement = zero12.make_zero12_bit16_views(counted)
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


def test_numa_cores_are_asked_once_and_each_caller_gets_its_own_copy():
    asked = []

    def numactl():
        asked.append(1)
        return [[0, 1], [2, 3]]

    get_numa_cores = fast._make_cpu_numa_cores_once(numactl)
    first = get_numa_cores()
    first[0].append(99)  # a caller's change stays its own
    assert get_numa_cores() == [[0, 1], [2, 3]] and len(asked) == 1


def _zero2_optimizer(**changes) -> SimpleNamespace:
    """What `create_gradient_handling_hooks` reads: the recipe's CPU ZeRO-2 (one bucket, nothing to overlap)."""
    params = [torch.nn.Parameter(torch.randn(s)) for s in ((4, 3), (3,))]
    fields = dict(
        bit16_groups=[params], partition_gradients=True, overlap_comm=False, contiguous_gradients=False,
        use_grad_accum_attribute=False, cpu_offload=False, zenflow=False, has_moe_layers=False,
        gradient_accumulation_steps=1, reduce_bucket_size=15,
    )  # fmt: skip
    return SimpleNamespace(**{**fields, **changes})


@pytest.mark.parametrize(
    "change",
    [{}, {"reduce_bucket_size": 14}, {"gradient_accumulation_steps": 2}, {"overlap_comm": True},
     {"contiguous_gradients": True}, {"partition_gradients": False}, {"cpu_offload": True}],
)  # fmt: skip
def test_zero2_gradient_hooks_go_only_with_one_bucket_one_micro_step_and_nothing_to_overlap(monkeypatch, change):
    """15 elements: a 14-element bucket would fill during the backward (a hook reduces it there, freeing memory); two
    accumulation steps would leave earlier gradients the epilogue cannot tell from this backward's."""
    made = []
    monkeypatch.setattr(fast, "_INSTALLED", {"zero2_reduce_at_epilogue": None})
    optimizer = _zero2_optimizer(**change)
    epilogue_installed = fast._installed("zero2_reduce_at_epilogue")
    zero12.make_zero2_no_gradient_hooks(lambda self: made.append(self), epilogue_installed)(optimizer)
    hookless = getattr(optimizer, zero12.REDUCE_AT_EPILOGUE, False)
    assert (hookless, made) == ((True, []) if not change else (False, [optimizer]))


def test_zero2_gradient_hooks_stay_without_the_epilogue_that_does_their_work(monkeypatch):
    made = []
    monkeypatch.setattr(fast, "_INSTALLED", {})
    epilogue_installed = fast._installed("zero2_reduce_at_epilogue")
    zero12.make_zero2_no_gradient_hooks(lambda self: made.append(self), epilogue_installed)(_zero2_optimizer())
    assert len(made) == 1


def _filing_optimizer(**changes) -> SimpleNamespace:
    """What `file_every_gradient` reads: two groups with gradients (one parameter without), one empty bucket."""
    params = [torch.nn.Parameter(torch.randn(s)) for s in ((4, 3), (3,), (2,), (5,))]
    for index, p in enumerate(params):
        p.param_idx_in_group = index % 2
        p.grad = torch.randn(p.shape) if index != 2 else None
    bucket = SimpleNamespace(elements=0, grads=[], params=[])
    micro_steps = []
    fields = dict(
        bit16_groups=[params[:2], params[2:]], ipg_buckets={torch.float32: bucket},
        communication_data_type=torch.float32, reduce_bucket_size=20, use_grad_accum_attribute=False,
        contiguous_gradients=False, overlap_comm=False, _offload_gradient_safety_enabled=False, zenflow=False,
        has_moe_layers=False, autoep_folding_tp_group=None, _coalesce_grad_reduction=False,
        is_gradient_accumulation_boundary=lambda: True, setup_buckets=lambda: micro_steps.append(1),
        get_param_id=lambda p: next(i for i, q in enumerate(params) if q is p), params_already_reduced=[False] * 4,
        micro_steps=micro_steps, params=params,
    )  # fmt: skip
    return SimpleNamespace(**{**fields, **changes})


@pytest.mark.parametrize(
    "change",
    [{}, {"reduce_bucket_size": 19}, {"overlap_comm": True}, {"contiguous_gradients": True},
     {"use_grad_accum_attribute": True}, {"has_moe_layers": True}, {"_coalesce_grad_reduction": True},
     {"is_gradient_accumulation_boundary": lambda: False}, "not ready", "bucket not empty"],
)  # fmt: skip
def test_gradients_are_filed_at_once_in_deepspeed_s_order_or_not_at_all(change):
    """20 elements in three gradients (the third parameter has none): filed in DeepSpeed's order with (group, index,
    id), the micro step counted once; where any branch of DeepSpeed's chain would do more than file (a bucket that
    would fill, overlap, ...), nothing is done and the caller runs DeepSpeed's own loop."""
    optimizer = _filing_optimizer(**(change if isinstance(change, dict) else {}))
    bucket = optimizer.ipg_buckets[torch.float32]
    if change == "not ready":
        optimizer.params[3].ds_grad_is_ready = False
    if change == "bucket not empty":
        bucket.elements = 1
    filed = zero12.file_every_gradient(optimizer, counting_the_micro_step=True)
    if change:
        assert (filed, bucket.grads, bucket.params, optimizer.micro_steps) == (False, [], [], [])
        return
    p = optimizer.params
    assert filed and bucket.elements == 20 and optimizer.micro_steps == [1]
    assert [g is q.grad for g, q in zip(bucket.grads, (p[0], p[1], p[3]))] == [True] * 3
    assert bucket.params == [(0, 0, 0), (0, 1, 1), (1, 1, 3)]


def _zero3_whole_optimizer(**changes) -> SimpleNamespace:
    """What `zero3_whole_through_step` reads: ZeRO-3 with both tensors persistent, gathered, the root hook in place."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    module = torch.nn.Linear(3, 2)
    for p in module.parameters():
        p.ds_status, p.ds_secondary_tensor, p.ds_tensor = ZeroParamStatus.AVAILABLE, None, p.detach().view(-1)
    group = object()
    fields = dict(
        module=module, persistent_parameters=list(module.parameters()), offload_optimizer=False, offload_param=False,
        swap_optimizer=False, parameter_offload=SimpleNamespace(**{zero3.WHOLE_MODULE: True}),
        _get_param_partition_group=lambda p: group,
    )  # fmt: skip
    return SimpleNamespace(**{**fields, **changes})


@pytest.mark.parametrize(
    "change", ["", "one not persistent", "one released", "no root hook", "offloaded", "two groups", "ZeRO++"]
)
def test_zero3_keeps_parameters_whole_through_a_step_only_when_every_one_is_whole_and_on_the_device(
    monkeypatch, change
):
    """The step's release is left out only where the refresh after it rebuilds every full tensor: every parameter
    persistent and gathered, no offload, one partition group, no second copy (ZeRO++)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    optimizer = _zero3_whole_optimizer()
    weight, bias = optimizer.persistent_parameters
    if change == "one not persistent":
        optimizer.persistent_parameters = [weight]
    elif change == "one released":
        bias.ds_status = ZeroParamStatus.NOT_AVAILABLE
    elif change == "no root hook":
        optimizer.parameter_offload = SimpleNamespace()
    elif change == "offloaded":
        optimizer.offload_param = True
    elif change == "two groups":
        optimizer._get_param_partition_group = lambda p: id(p)
    elif change == "ZeRO++":
        bias.ds_secondary_tensor = torch.zeros(1)
    parts = {"zero3_whole_through_step_release": None, "zero3_whole_through_step_gather": None}
    monkeypatch.setattr(fast, "_INSTALLED", parts)
    zero3.make_zero3_step_begins_whole(lambda self: None, fast.WHOLE_THROUGH_STEP_HALVES)(optimizer)
    assert getattr(optimizer, zero3.THROUGH_STEP) == ("keep" if not change else None)


def test_zero3_step_release_is_never_left_out_without_the_refresh(monkeypatch):
    monkeypatch.setattr(fast, "_INSTALLED", {"zero3_whole_through_step_release": None})  # no refresh part
    optimizer = _zero3_whole_optimizer()
    zero3.make_zero3_step_begins_whole(lambda self: None, fast.WHOLE_THROUGH_STEP_HALVES)(optimizer)
    assert getattr(optimizer, zero3.THROUGH_STEP) is None
