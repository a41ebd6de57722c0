"""--weight_init jax and --position_embedding_init sincos2d: what each writes into a fresh preset model."""

import math

import pytest
import torch
from torch import nn

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
from hf_vit_scaling.models.weight_init import describe_init, initialize_weights, sincos_2d_position_table


def fresh_model(seed=0, size=16, **overrides):
    torch.manual_seed(seed)
    config = preset_config("vit-tiny-cpu", [str(i) for i in range(10)], size, 4, **overrides)
    return build_model_from_preset(config)


def test_sincos_table_entries_follow_the_formula():
    table = sincos_2d_position_table(grid=3, dim=8)  # 2 frequencies: 1 and 10000^-1
    assert table.shape == (9, 8)
    omega = torch.tensor([1.0, 1e-4])
    for row, (y, x) in enumerate((y, x) for y in range(3) for x in range(3)):
        expected = torch.cat([(x * omega).sin(), (x * omega).cos(), (y * omega).sin(), (y * omega).cos()])
        torch.testing.assert_close(table[row], expected)
    # Patches in one row share the y half, patches in one column the x half.
    torch.testing.assert_close(table[3, 4:], table[5, 4:])
    torch.testing.assert_close(table[1, :4], table[7, :4])


def test_sincos_refuses_a_hidden_size_it_cannot_fill():
    with pytest.raises(UserInputError, match="divisible by 4"):
        sincos_2d_position_table(4, 98)


def test_defaults_leave_transformers_init_untouched():
    reference, model = fresh_model(), fresh_model()
    initialize_weights(model, "hf", "random")
    for (name, want), got in zip(reference.state_dict().items(), model.state_dict().values()):
        assert torch.equal(want, got), name


def test_sincos2d_writes_the_table_and_a_zero_cls_position():
    model = fresh_model(size=28)
    initialize_weights(model, "hf", "sincos2d")
    table = model.vit.embeddings.position_embeddings[0]
    assert torch.count_nonzero(table[0]) == 0
    torch.testing.assert_close(table[1:], sincos_2d_position_table(7, 96))


def test_jax_init_matches_timm_rules():
    model = fresh_model()
    initialize_weights(model, "jax", "random")
    assert torch.count_nonzero(model.classifier.weight) == torch.count_nonzero(model.classifier.bias) == 0
    for name, module in model.vit.named_modules():
        if isinstance(module, nn.Linear):
            fan_out, fan_in = module.weight.shape
            bound = math.sqrt(6 / (fan_in + fan_out))  # Xavier uniform: U(-bound, bound)
            assert module.weight.abs().max() <= bound
            assert module.weight.abs().max() > 0.9 * bound, name  # not transformers' std 0.02
            bias_std = 1e-6 if "attention" not in name else 0.0  # timm: N(0, 1e-6) for the MLP's biases only
            assert module.bias.abs().max() <= 10 * bias_std
            assert (module.bias.abs().max() > 0) == (bias_std > 0), name
    conv = model.vit.embeddings.patch_embeddings.projection.weight  # 3 x 4 x 4 = 48 inputs per output
    assert abs(conv.std().item() - math.sqrt(1 / 48) / 0.8796) < 0.02
    assert torch.count_nonzero(model.vit.embeddings.patch_embeddings.projection.bias) == 0


def test_jax_init_is_seeded_and_the_model_stays_a_plain_vit(tmp_path):
    first, second = fresh_model(seed=3), fresh_model(seed=3)
    for model in (first, second):
        torch.manual_seed(7)
        initialize_weights(model, "jax", "sincos2d")
    for want, got in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(want, got)
    first.save_pretrained(tmp_path)
    reloaded = type(first).from_pretrained(tmp_path)
    pixels = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(reloaded.eval()(pixels).logits, first.eval()(pixels).logits)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model_name_or_path", "x", "--weight_init", "jax"], "--weight_init only applies to --model_preset"),
        (["--model_name_or_path", "x", "--position_embedding_init", "sincos2d"], "--position_embedding_init only"),
        (["--position_embedding_init", "sincos2d", "--config_overrides", "hidden_size=102,num_attention_heads=3"],
         "divisible by 4"),
    ],
)  # fmt: skip
def test_init_flags_are_refused_before_anything_loads(tmp_path, argv, message):
    with pytest.raises(UserInputError, match=message):
        parse_args(["--output_dir", str(tmp_path), *argv])


def test_the_model_description_names_a_non_default_init():
    assert describe_init("hf", "random") == ""
    assert describe_init("jax", "sincos2d") == " with jax init and sincos2d position embeddings"
    assert describe_init("hf", "sincos2d") == " with sincos2d position embeddings"


def test_mimetic_attention_products_start_near_plus_and_minus_identity():
    model = fresh_model()
    initialize_weights(model, "mimetic", "random")
    heads, dim = model.config.num_attention_heads, model.config.hidden_size
    head_dim = dim // heads
    for layer in model.vit.layers:
        attention = layer.attention
        for h in range(heads):
            rows = slice(h * head_dim, (h + 1) * head_dim)
            qk = attention.q_proj.weight[rows].T @ attention.k_proj.weight[rows]  # scores = x (W_q^T W_k) x^T
            # the rank-d_h part of 0.7 Z + 0.7 I (its top singular values, 0.7 (1 + O(1))): a positive trace of
            # order d_h, where a product of independent random factors (the jax init) has trace ~ 0
            assert 0.5 * head_dim < torch.trace(qk) < 2 * head_dim
        vo = attention.v_proj.weight.T @ attention.o_proj.weight.T  # update = A x (W_v^T W_o^T)
        assert torch.allclose(torch.diagonal(vo).mean(), torch.tensor(-0.4), atol=0.05)
        off_diagonal = vo - torch.diag(torch.diagonal(vo))
        assert abs(off_diagonal.std().item() - 0.4 / dim**0.5) < 0.01  # 0.4 Z, Var Z = 1 / dim
        assert not attention.q_proj.bias.any() and not attention.o_proj.bias.any()
    assert not model.classifier.weight.any()  # the rest is the jax init


def test_mimetic_refuses_a_model_without_transformers_5_attention_names():
    old_style = nn.Sequential(nn.Linear(8, 8))  # e.g. transformers 4's attention.attention.query/key/value
    with pytest.raises(UserInputError, match="--weight_init mimetic: no attention block"):
        initialize_weights(old_style, "mimetic", "random")
