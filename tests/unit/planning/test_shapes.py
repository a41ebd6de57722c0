"""Tests `planning.shapes`: parameter and activation counts by hand, against transformers."""

import dataclasses

import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification

from hf_vit_scaling.models.presets import MODEL_PRESETS
from hf_vit_scaling.planning.shapes import VitShape, activation_bytes, vit_shape

# 32 px, patch 16 -> 2 x 2 patches + CLS = 5 tokens; hidden 8, 2 layers, 2 heads, MLP 16, 10 classes.
TINY = VitShape(
    image_size=32,
    patch_size=16,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    num_channels=3,
    num_labels=10,
)


def hf_parameter_count(shape: VitShape) -> int:
    config = ViTConfig(**{f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)})
    with torch.device("meta"):
        model = ViTForImageClassification(config)
    return sum(p.numel() for p in model.parameters())


def test_parameter_count_by_hand_and_against_transformers():
    # cls 8 + positions 5 x 8 = 48; patch conv 3 x 16 x 16 x 8 + 8 = 6,152;
    # per layer q/k/v/o 4 x (64 + 8) = 288, two LayerNorms 32, fc1 8 x 16 + 16 = 144, fc2 16 x 8 + 8 = 136 -> 600;
    # final LayerNorm 16; classifier 8 x 10 + 10 = 90.
    assert TINY.num_parameters == 48 + 6152 + 2 * 600 + 16 + 90 == 7506
    assert TINY.layer_parameters == 600
    assert TINY.largest_module_parameters == 6152  # the patch convolution
    for shape in (TINY, vit_shape(MODEL_PRESETS["vit-b-16"]), vit_shape(MODEL_PRESETS["vit-ti-16"], 128, 8, 37)):
        assert shape.num_parameters == hf_parameter_count(shape)
    assert vit_shape(MODEL_PRESETS["vit-b-16"]).num_parameters == 86_567_656


def test_activation_bytes_by_hand():
    # fp32, batch 2: s = 5, b = 2, h = 8, I = 16, a = 2 -> sb = 10, sbh = 80, sbI = 160.
    # per layer: residual 2sbh + normed 2sbh + q,k,v 3sbh + attention output sbh + GELU in/out 2sbI
    #   = 160 + 160 + 240 + 80 + 320 = 960 elements x 4 B = 3,840 B; fp32 statistics (LayerNorm mean/rstd
    #   2 x 2sb + log-sum-exp asb) = 40 + 20 = 60 x 4 B = 240 B -> 4,080 B per layer.
    # pixels: the fp32 batch 2 x 3 x 32 x 32 x 4 B = 24,576; final LayerNorm input + output 2 x 80 x 4 = 640 and
    # its statistics 2 x 10 x 4 = 80, logits 2 x 10 x 4 = 80; backward working set (sbI + sbh) x 4 = 960.
    act = activation_bytes(TINY, 2, "fp32")
    assert act["one_layer"] == 4080
    assert act["layers"] == 2 * 4080
    assert act["pixels"] == act["input_batch"] == 24576
    assert act["embeddings_and_head"] == 24576 + 640 + 80 + 80
    assert act["backward_working_set"] == 960
    # End of forward: layers + pixels + head; backward through the top layer: layers + pixels + working set (the
    # head's tensors are freed by then).
    assert act["forward_end"] == 8160 + 24576 + 800 == 33536
    assert act["backward_start"] == 8160 + 24576 + 960 == 33696
    assert act["total"] == 33696
    # Checkpointing keeps each layer's input (L x sbh x 4 = 640 B); the forward's last layer briefly holds its fc1 and
    # GELU outputs (2sbI x 4 = 1,280 B); backward recomputes one layer at a time, less the input it already holds
    # (4,080 - 320 = 3,760 B).
    checkpointed = activation_bytes(TINY, 2, "fp32", gradient_checkpointing=True)
    assert checkpointed["layers"] == 640 + 3760
    assert checkpointed["forward_end"] == 640 + 24576 + 800 + 1280
    assert checkpointed["backward_start"] == 640 + 3760 + 24576 + 960
    # Sequence parallelism over 2 ranks: ceil(5 / 2) = 3 tokens per rank inside the layers.
    assert activation_bytes(TINY, 2, "fp32", sequence_parallel_size=2)["one_layer"] == (
        (2 + 2 + 3 + 1) * 3 * 2 * 8 * 4 + 2 * 3 * 2 * 16 * 4 + (4 * 3 * 2 + 2 * 3 * 2) * 4
    )


def test_bf16_activation_bytes_by_hand():
    # bf16, batch 2 (sbh = 80, sbI = 160, sb = 10). Plain bf16 (DeepSpeed, FSDP2): the fp32 layer's elements at
    # 2 B: 960 x 2 + 240 = 2,160 B. Autocast (DDP): the residual stream stays fp32 (2sbh x 4 = 640 B) and q_proj,
    # k_proj, v_proj each keep their own bf16 copy of the LayerNorm output: (2 + 2) sbh more casts -> normed 4sbh,
    # (320 + 240 + 80 + 320) x 2 = 1,920 B; + 240 B statistics = 2,800 B.
    assert activation_bytes(TINY, 2, "bf16")["one_layer"] == 160 * 2 + (160 + 240 + 80 + 320) * 2 + 240 == 2160
    assert activation_bytes(TINY, 2, "bf16", autocast=True)["one_layer"] == 640 + 1920 + 240 == 2800
    # Pixels in bf16: the fp32 batch (24,576 B) + the bf16 copy the patch convolution keeps (12,288 B).
    assert activation_bytes(TINY, 2, "bf16")["pixels"] == 24576 + 12288


def test_activation_formula_is_korthikanti_without_dropout_and_softmax():
    # With I = 4h and 2-byte activations the layer stores 32·sbh bytes: Korthikanti et al.'s sbh(34 + 5as/h)
    # without its two 1-byte dropout masks and the as² terms (fused attention, no dropout); only the fp32
    # statistics come on top.
    shape = vit_shape(MODEL_PRESETS["vit-b-16"])
    b, s, h, a = 4, shape.tokens, shape.hidden_size, shape.num_attention_heads
    layer = activation_bytes(shape, b, "bf16")["one_layer"]
    assert layer == (34 - 2) * s * b * h + (4 * s * b + a * s * b) * 4


def test_activation_bytes_match_a_real_forward_on_cpu():
    """What a 2-layer HF ViT keeps after its forward (SDPA, dropout 0), tracked with the profiler's allocation
    events, is the planner's activations at the end of the forward pass (within 1%)."""
    shape = dataclasses.replace(
        TINY, image_size=64, patch_size=8, hidden_size=64, num_attention_heads=4, intermediate_size=256
    )
    config = ViTConfig(**{f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = ViTForImageClassification(config).train()
    batch = 8
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        pixels = torch.randn(batch, 3, 64, 64)
        logits = model(pixel_values=pixels).logits
    live = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.nbytes() != 0)
    del logits
    expected = activation_bytes(shape, batch, "fp32")["forward_end"]
    assert abs(live / expected - 1) < 0.01, (live, expected)


# --------------------------------------------------------------------------- MAE pretraining (recipes/pretrain_mae.py)


def mae_tiny(mask_ratio=0.75):
    from hf_vit_scaling.planning.shapes import MaeShape

    return MaeShape(image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=256, num_labels=0, mask_ratio=mask_ratio, decoder_hidden_size=32,
                    decoder_num_hidden_layers=2, decoder_num_attention_heads=4,
                    decoder_intermediate_size=128)  # fmt: skip


def hf_mae(shape, norm_pix_loss=True):
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    skip = ("num_labels", "model_type")
    config = ViTMAEConfig(**{f.name: getattr(shape, f.name) for f in dataclasses.fields(shape) if f.name not in skip},
                          norm_pix_loss=norm_pix_loss)  # fmt: skip
    config._attn_implementation = "sdpa"
    return ViTMAEForPreTraining(config)


def test_mae_parameters_encoder_and_decoder_against_transformers():
    from hf_vit_scaling.models.mae import DECODER_PRESETS
    from hf_vit_scaling.planning.shapes import mae_shape

    base = mae_shape(MODEL_PRESETS["vit-b-16"], DECODER_PRESETS["vit-b-16"])
    with torch.device("meta"):
        for shape in (base, mae_tiny()):
            assert shape.num_parameters == sum(p.numel() for p in hf_mae(shape).parameters())
    assert base.num_parameters == 111_907_840  # facebook/vit-mae-base's size: 86.6 M encoder + 25.3 M decoder
    assert base.visible_tokens == 50 and base.tokens == 197


@pytest.mark.parametrize("mask_ratio, norm_pix_loss", [(0.75, True), (0.5, False)])
def test_mae_activations_are_what_autograd_keeps(mask_ratio, norm_pix_loss):
    """The encoder's layers on the visible tokens, the decoder's on every token, and around them what a real
    ViTMAEForPreTraining's forward saves for backward (every saved tensor that is not a parameter, counted once by
    storage): exactly the planner's activations at the end of the forward pass (fp32, dropout 0, SDPA)."""
    shape = mae_tiny(mask_ratio)
    torch.manual_seed(0)
    model = hf_mae(shape, norm_pix_loss).train()
    saved = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = model(pixel_values=torch.randn(8, 3, 64, 64)).loss
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = sum(n for ptr, n in saved.items() if ptr not in weights)
    assert loss.requires_grad
    expected = activation_bytes(shape, 8, "fp32")
    assert abs(kept - expected["forward_end"]) <= 16, (kept, expected)  # a 0-d tensor or two
    # The encoder's share shrinks with the mask ratio; the decoder's does not depend on it.
    fewer = activation_bytes(mae_tiny(0.9), 8, "fp32")
    assert fewer["encoder_layers"] < expected["encoder_layers"] and fewer["decoder_layers"] == expected[
        "decoder_layers"]  # fmt: skip
