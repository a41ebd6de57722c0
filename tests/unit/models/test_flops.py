"""Tests for hf_vit_scaling.models.flops (analytic ViT FLOPs, peak tables, MFU). Fast, CPU-only, no network."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import ViTConfig

from hf_vit_scaling.models.flops import (
    HBM_GBPS,
    PEAK_TFLOPS,
    PRECISIONS,
    lookup_hbm_gbps,
    lookup_peak_tflops,
    match_device_key,
    measure_matmul_peak_tflops,
    mfu,
    precision_name,
    vit_forward_macs_per_image,
    vit_train_flops_per_image,
)


def _vit(hidden, layers, heads, inter, patch, image_size=224, num_labels=1000):
    return ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        patch_size=patch,
        image_size=image_size,
        num_labels=num_labels,
    )


VIT_B16 = dict(hidden=768, layers=12, heads=12, inter=3072, patch=16)
VIT_L16 = dict(hidden=1024, layers=24, heads=16, inter=4096, patch=16)
VIT_H14 = dict(hidden=1280, layers=32, heads=16, inter=5120, patch=14)


# timm's reported forward GMACs at 224 px (they also count norms/biases, hence the 1% tolerance).
@pytest.mark.parametrize(
    ("arch", "timm_macs"),
    [(VIT_B16, 17.58e9), (VIT_L16, 61.6e9), (VIT_H14, 167.4e9)],
    ids=["ViT-B/16", "ViT-L/16", "ViT-H/14"],
)
def test_forward_macs_match_timm(arch, timm_macs):
    macs = vit_forward_macs_per_image(_vit(**arch))
    assert isinstance(macs, int)
    assert macs == pytest.approx(timm_macs, rel=0.01)


def test_vit_b16_exact_breakdown():
    # N = 197, D = 768, I = 3072: patch 196·768·768, per layer 12·N·D² + 2·N²·D, head 768·1000.
    n, d = 197, 768
    expected = 196 * 768 * 768 + 12 * (12 * n * d * d + 2 * n * n * d) + 768 * 1000
    assert vit_forward_macs_per_image(_vit(**VIT_B16)) == expected == 17_563_828_224


def test_small_config_hand_computed():
    # 32 px, patch 8 → 16 patches, N = 17 tokens; C = 3, D = 16, I = 64, 2 layers, 10 labels.
    cfg = SimpleNamespace(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=2,
        intermediate_size=64,
        num_labels=10,
    )
    patch = 16 * (3 * 8 * 8) * 16  # 49_152
    qkv = 17 * 16 * 48  # 13_056
    scores = 17 * 17 * 16  # 4_624
    attn_v = 17 * 17 * 16  # 4_624
    out_proj = 17 * 16 * 16  # 4_352
    mlp = 2 * 17 * 16 * 64  # 34_816
    head = 16 * 10  # 160
    expected = patch + 2 * (qkv + scores + attn_v + out_proj + mlp) + head
    assert expected == 172_256
    assert vit_forward_macs_per_image(cfg) == expected


def test_matches_torch_flop_counter_on_real_hf_model():
    # FlopCounterMode counts exactly the conv/linear/bmm FLOPs (2 × MACs) we model; biases are not counted.
    # Eager attention: Q·Kᵀ and attn·V run as bmm, which the counter sees (CPU SDPA kernels are not counted).
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import ViTForImageClassification

    cfg = _vit(hidden=32, layers=2, heads=4, inter=64, patch=8, image_size=(32, 48), num_labels=7)
    cfg._attn_implementation = "eager"
    model = ViTForImageClassification(cfg).eval()
    pixels = torch.randn(1, 3, 32, 48)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(pixel_values=pixels)
    assert counter.get_total_flops() == 2 * vit_forward_macs_per_image(cfg)


def test_tuple_sizes_and_override():
    cfg = _vit(**VIT_B16)
    square_384 = vit_forward_macs_per_image(_vit(**VIT_B16, image_size=384))
    assert vit_forward_macs_per_image(cfg, image_size=384) == square_384
    assert vit_forward_macs_per_image(cfg, image_size=(384, 384)) == square_384
    tuple_cfg = SimpleNamespace(
        **{**cfg.to_dict(), "image_size": (224, 224), "patch_size": (16, 16), "num_labels": 1000}
    )
    assert vit_forward_macs_per_image(tuple_cfg) == vit_forward_macs_per_image(cfg)
    # Non-square: 224×448 has 2× the patches of 224×224 (more than 2× the MACs: N² attention), and orientation
    # does not matter.
    wide = vit_forward_macs_per_image(cfg, image_size=(224, 448))
    assert wide == vit_forward_macs_per_image(cfg, image_size=(448, 224))
    assert 2 * vit_forward_macs_per_image(cfg) < wide < 4 * vit_forward_macs_per_image(cfg)


def test_attention_term_is_quadratic():
    cfg = _vit(**VIT_B16)
    macs_224 = vit_forward_macs_per_image(cfg)
    macs_448 = vit_forward_macs_per_image(cfg, image_size=448)  # 4× the patches
    assert macs_448 > 4 * macs_224
    # Without the N² terms the growth would be (almost exactly) linear; check the excess is the N² part.
    n1, n2, d, layers = 197, 785, 768, 12
    linear_growth = layers * 12 * (n2 - n1) * d * d + (784 - 196) * 768 * 768  # layers' N·D² terms + patch embed
    excess = (macs_448 - macs_224) - linear_growth
    assert excess == layers * 2 * d * (n2 * n2 - n1 * n1)


def test_train_is_six_times_forward_macs():
    for arch in (VIT_B16, VIT_L16, VIT_H14):
        cfg = _vit(**arch)
        assert vit_train_flops_per_image(cfg) == 6 * vit_forward_macs_per_image(cfg)
    cfg = _vit(**VIT_B16)
    assert vit_train_flops_per_image(cfg, image_size=384) == 6 * vit_forward_macs_per_image(cfg, image_size=384)


def test_peak_table_shape():
    for name, row in PEAK_TFLOPS.items():
        assert set(row) == set(PRECISIONS), name
        for value in row.values():
            assert value is None or value > 0, name
    assert PEAK_TFLOPS["T4"] == {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1}
    assert PEAK_TFLOPS["H200"] == PEAK_TFLOPS["H100"]


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 3070", "RTX 3070"),
        ("NVIDIA RTX A4500", "RTX A4500"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce GTX 1070", "GTX 1070"),
        ("Tesla P4", "P4"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla V100-PCIE-32GB", "V100-PCIE"),
        ("Tesla V100S-PCIE-32GB", "V100S"),
        # Must not fall through to a shorter key that is a prefix/substring of another model name.
        ("NVIDIA A10G", None),
        ("NVIDIA L40S", None),
        ("NVIDIA RTX A4000", None),
        ("NVIDIA GH200 480GB", None),
        ("Tesla P40", None),
        ("Intel Xeon", None),
        ("", None),
    ],
)
def test_match_device_key(device_name, key):
    assert match_device_key(device_name) == key


def test_lookup_peak_tflops():
    assert lookup_peak_tflops("NVIDIA H200", "bf16") == pytest.approx(989, rel=1e-3)
    assert lookup_peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989, rel=1e-3)
    assert lookup_peak_tflops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756, rel=1e-3)
    assert lookup_peak_tflops("NVIDIA H100 PCIe", "tf32") == pytest.approx(378, rel=2e-3)
    assert lookup_peak_tflops("Tesla T4", "bf16") is None
    assert lookup_peak_tflops("Tesla T4", "fp16") == 65.0
    assert lookup_peak_tflops("tesla t4", "FP16") == 65.0  # case-insensitive name and precision
    assert lookup_peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert lookup_peak_tflops("NVIDIA GeForce RTX 3070", "bf16") == 40.6
    assert lookup_peak_tflops("NVIDIA GeForce GTX 1070", "fp32") == 6.5
    assert lookup_peak_tflops("Tesla P4", "fp32") == 5.5
    assert lookup_peak_tflops("Tesla V100-SXM2-32GB", "fp16") == 125.0
    assert lookup_peak_tflops("Intel Xeon", "fp32") is None
    assert lookup_peak_tflops("NVIDIA H200", "fp8") is None  # precision not in the table


def test_lookup_rtx_a4500_matches_only_a4500():
    name = "NVIDIA RTX A4500"
    assert match_device_key(name) == "RTX A4500"
    assert lookup_peak_tflops(name, "bf16") == 94.6
    assert lookup_peak_tflops(name, "tf32") == 47.3
    assert lookup_peak_tflops(name, "fp32") == 23.7
    # ...and not T4 / A40 / A10, whose numbers differ.
    assert lookup_peak_tflops(name, "fp16") not in {PEAK_TFLOPS[k]["fp16"] for k in ("T4", "A40", "A10")}


def test_precision_name():
    assert precision_name(bf16=True, fp16=False, tf32=None) == "bf16"
    assert precision_name(bf16=True, fp16=False, tf32=True) == "bf16"
    assert precision_name(bf16=False, fp16=True, tf32=False) == "fp16"
    assert precision_name(bf16=False, fp16=False, tf32=True) == "tf32"
    assert precision_name(bf16=False, fp16=False, tf32=False) == "fp32"
    assert precision_name(bf16=False, fp16=False, tf32=None) == "fp32"
    with pytest.raises(ValueError):
        precision_name(bf16=True, fp16=True, tf32=None)


def test_mfu():
    assert mfu(100.0, None) is None
    assert mfu(100.0, 0.0) is None
    assert mfu(100.0, -1.0) is None
    assert mfu(395.76, lookup_peak_tflops("NVIDIA H200", "bf16")) == pytest.approx(0.4, rel=1e-6)
    assert mfu(31.2, 312.0) == pytest.approx(0.1)


def test_matmul_probe_cpu():
    tflops = measure_matmul_peak_tflops(device="cpu", dtype=torch.float32, size=128, seconds=0.05)
    assert isinstance(tflops, float)
    assert math.isfinite(tflops) and tflops > 0


def test_cnn_flops_are_counted_on_one_image_and_tripled_for_training():
    """A CNN has no formula here: torch's FlopCounterMode counts its forward (on the meta device); the count equals
    one on real weights, its stem conv alone is 2 x 8 x 8 x 32 x 3 x 7 x 7 FLOPs of it (16 px, stride 2), and
    training is 3 x forward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForImageClassification

    from hf_vit_scaling.models.flops import (
        counted_forward_flops_per_image,
        forward_macs_per_image,
        train_flops_per_image,
    )
    from hf_vit_scaling.models.presets import preset_config

    config = preset_config("resnet-tiny-cpu", [str(i) for i in range(10)], image_size=16)
    counted = counted_forward_flops_per_image(config)
    model = AutoModelForImageClassification.from_config(config).eval()
    with FlopCounterMode(display=False) as counter:
        model(pixel_values=torch.zeros(1, 3, 16, 16))
    assert counted == counter.get_total_flops()
    assert counted > 2 * 8 * 8 * 32 * 3 * 7 * 7
    assert forward_macs_per_image(config) == counted // 2 and train_flops_per_image(config) == 3 * counted


def test_deit_student_counts_its_distillation_token_and_second_head():
    """The `--distillation_token` student (DeiTForImageClassificationWithTeacher): N = patches + 2 tokens and a
    second head, so the formula equals FlopCounterMode's count on the real model (eager attention, as above), and
    exceeds the same-size ViT's by one token through every layer and one head."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    from hf_vit_scaling.models.flops import tokens_per_image

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8,
                 image_size=32, num_labels=7)  # fmt: skip
    deit = DeiTConfig(**sizes)
    deit._attn_implementation = "eager"
    model = DeiTForImageClassificationWithTeacher(deit).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(pixel_values=torch.randn(1, 3, 32, 32))
    assert counter.get_total_flops() == 2 * vit_forward_macs_per_image(deit)
    assert tokens_per_image(deit) == 16 + 2 and tokens_per_image(ViTConfig(**sizes)) == 16 + 1
    # Per layer 4 N D^2 + 2 N^2 D + 2 N D I (QKV + output projection, attention, MLP) = 8,192 N + 64 N^2 at D = 32,
    # I = 64; N = 18 against 17: 8,192 + 64 x 35 = 10,432 a layer, x 2 layers = 20,864, + a second head 32 x 7 = 224.
    extra = 2 * (8_192 + 64 * (18 * 18 - 17 * 17)) + 32 * 7
    assert extra == 21_088
    assert vit_forward_macs_per_image(deit) - vit_forward_macs_per_image(ViTConfig(**sizes)) == extra


def test_a_teacher_forward_is_counted_at_the_image_size_it_is_given():
    """A teacher runs at the student's size, not its config's: a CNN counted there by FlopCounterMode (equal to a
    count on the real model at that size), a ViT by 2 x the formula at that size."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForImageClassification

    from hf_vit_scaling.models.flops import forward_flops_per_image
    from hf_vit_scaling.models.presets import preset_config

    labels = [str(i) for i in range(10)]
    cnn = preset_config("resnet-tiny-cpu", labels)  # its config says 32 px
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        AutoModelForImageClassification.from_config(cnn).eval()(pixel_values=torch.zeros(1, 3, 16, 16))
    assert forward_flops_per_image(cnn, image_size=16) == counter.get_total_flops() == 2_112_000
    assert forward_flops_per_image(cnn) == 8_440_320  # at its own 32 px: 4 x the pixels, ~4 x the FLOPs
    vit = preset_config("vit-tiny-cpu", labels)
    assert forward_flops_per_image(vit, image_size=16) == 2 * vit_forward_macs_per_image(vit, image_size=16)


def test_a_cnn_is_counted_whole_while_the_trainer_zero3_config_is_active():
    """Under ZeRO-3 the Trainer's HfDeepSpeedConfig makes transformers build every model under `zero.Init`,
    partitioned; the meta model the count runs on must be built whole (a partitioned convolution has no shape), and
    the config is back in place after."""
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    from hf_vit_scaling.models.flops import counted_forward_flops_per_image
    from hf_vit_scaling.models.presets import preset_config

    config = preset_config("resnet-tiny-cpu", [str(i) for i in range(10)])
    zero3 = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        assert counted_forward_flops_per_image(config) == 8_440_320
        assert is_deepspeed_zero3_enabled()
    finally:
        unset_hf_deepspeed_config()
    del zero3


def _mae(mask_ratio=0.75, **sizes):
    from transformers import ViTMAEConfig

    values = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, decoder_hidden_size=16, decoder_num_hidden_layers=1,
                  decoder_num_attention_heads=2, decoder_intermediate_size=24)  # fmt: skip
    values.update(sizes)
    return ViTMAEConfig(mask_ratio=mask_ratio, **values)


@pytest.mark.parametrize("mask_ratio, visible", [(0.75, 4), (0.5, 8), (0.3, 11)])
def test_mae_formula_matches_torch_flop_counter_on_real_hf_model(mask_ratio, visible):
    """The MAE formula counts what really runs: the encoder on 1 + int(16 (1 - r)) tokens, the decoder on all 17
    (He et al. 2021); FlopCounterMode on transformers' ViTMAEForPreTraining (eager attention) counts the same."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import ViTMAEForPreTraining

    from hf_vit_scaling.models.flops import mae_forward_macs_per_image, mae_visible_patches

    assert mae_visible_patches(16, mask_ratio) == visible
    cfg = _mae(mask_ratio)
    cfg._attn_implementation = "eager"
    model = ViTMAEForPreTraining(cfg).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(pixel_values=torch.randn(1, 3, 16, 16))
    assert counter.get_total_flops() == 2 * mae_forward_macs_per_image(cfg)
    # By hand at r = 0.75: patch 16·48·32 + encoder 2·(5·32·96 + 2·25·32 + 5·32·32 + 2·5·32·64) + decoder embedding
    # 5·32·16 + decoder 17·16·48 + 2·17²·16 + 17·16² + 2·17·16·24 + prediction 17·16·48
    if mask_ratio == 0.75:
        by_hand = 24_576 + 2 * (15_360 + 1_600 + 5_120 + 20_480) + 2_560 + (13_056 + 9_248 + 4_352 + 13_056) + 13_056
        assert mae_forward_macs_per_image(cfg) == by_hand == 165_024


def test_mae_worked_example_and_dispatch():
    from hf_vit_scaling.models.flops import (
        forward_flops_per_image,
        mae_forward_macs_per_image,
        tokens_per_image,
        train_flops_per_image,
    )

    vit_b = _mae(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, decoder_hidden_size=512, decoder_num_hidden_layers=8,
                 decoder_num_attention_heads=16, decoder_intermediate_size=2048)  # fmt: skip
    assert mae_forward_macs_per_image(vit_b) == 9_781_133_312  # the docstring's 9.78 G
    assert forward_flops_per_image(vit_b) == 2 * 9_781_133_312  # what the throughput report counts
    assert train_flops_per_image(vit_b) == 6 * 9_781_133_312
    assert tokens_per_image(vit_b) == 197  # the decoder's sequence


def test_every_gpu_with_a_peak_has_a_memory_bandwidth():
    """The planner times non-GEMM work at the table's bandwidth for any --gpu_name with a peak: a GPU missing here
    would silently plan without that term. A100 boards differ by memory (datasheet: 40GB 1,555, 80GB 2,039 GB/s);
    an unlisted size gets the slowest board.

    Fails if a PEAK_TFLOPS key has no HBM_GBPS entry, or if the lookup ignores the board's memory."""
    assert set(HBM_GBPS) == set(PEAK_TFLOPS)
    assert lookup_hbm_gbps("NVIDIA A100-SXM4-80GB", 80) == 2039.0
    assert lookup_hbm_gbps("A100", 40) == 1555.0
    assert lookup_hbm_gbps("A100", 48) == 1555.0
    assert lookup_hbm_gbps("NVIDIA H100 80GB HBM3", 80) == 3350.0
    assert lookup_hbm_gbps("Mystery GPU", 80) is None
