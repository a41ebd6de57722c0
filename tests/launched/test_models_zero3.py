"""Fine-tuning from a checkpoint with a new head under ZeRO-3, in 2 real processes (torchrun over gloo)."""

import textwrap

import pytest
import torch

from tests.helpers.builders import save_tiny_pretrained_vit
from tests.helpers.launchers import run_script

LABELS = [f"class_{i}" for i in range(7)]


@pytest.mark.distributed
def test_finetuning_under_zero3_two_processes(tmp_path):
    """transformers issue 17336: under ZeRO-3 a mismatched head must still be initialised, the backbone loaded."""
    original = save_tiny_pretrained_vit(tmp_path / "ckpt")
    torch.save(original.state_dict(), tmp_path / "reference.pt")
    code = textwrap.dedent(f"""
        import deepspeed, torch
        from transformers import TrainingArguments
        from hf_vit_scaling.models.presets import load_model_for_finetuning
        from hf_vit_scaling.parallel.distributed import shutdown_distributed
        zero3 = {{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": 3}}}}
        args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, use_cpu=True, report_to="none", deepspeed=zero3)
        model = load_model_for_finetuning({str(tmp_path / "ckpt")!r}, {LABELS!r})
        assert hasattr(model.classifier.weight, "ds_id"), "model was not partitioned by ZeRO-3"
        reference = torch.load({str(tmp_path / "reference.pt")!r})
        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values())):
            for name, p in params.items():
                if name.startswith("classifier."):
                    continue
                assert torch.equal(p.data, reference[name]), name
            w = params["classifier.weight"].data
            assert tuple(w.shape) == (7, 32), w.shape
            assert torch.isfinite(w).all() and 0.0 < w.std().item() < 0.1, w.std().item()
            assert torch.equal(params["classifier.bias"].data, torch.zeros(7))
        print("ZERO3-OK", torch.distributed.get_rank())
        shutdown_distributed()  # gloo's threads done before exit: without it a rank can abort at teardown
    """)
    proc = run_script(tmp_path, "check.py", code, launcher="torchrun", nproc=2, timeout=300)
    assert proc.stdout.count("ZERO3-OK") == 2


@pytest.mark.distributed
def test_mimetic_init_and_sincos_table_under_zero3_two_processes(tmp_path):
    """--weight_init mimetic (jax init + attention products near +-I) and --position_embedding_init sincos2d
    re-initialise partitioned parameters: gathered, written by rank 0, the same full values seen from both ranks."""
    code = textwrap.dedent(f"""
        import deepspeed, torch
        from transformers import TrainingArguments
        from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
        from hf_vit_scaling.models.weight_init import initialize_weights, sincos_2d_position_table
        from hf_vit_scaling.parallel.distributed import shutdown_distributed
        zero3 = {{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": 3}}}}
        args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, use_cpu=True, report_to="none", deepspeed=zero3)
        torch.manual_seed(torch.distributed.get_rank())  # different draws per rank: rank 0's must win
        model = build_model_from_preset(preset_config("vit-tiny-cpu", {LABELS!r}, 16, 4))
        assert hasattr(model.classifier.weight, "ds_id"), "model was not partitioned by ZeRO-3"
        initialize_weights(model, "mimetic", "sincos2d")
        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values())):
            table = params["vit.embeddings.position_embeddings"].data[0]
            assert torch.equal(table[1:], sincos_2d_position_table(4, 96)) and not table[0].any()
            assert not params["classifier.weight"].data.any()
            fc1 = params["vit.layers.0.mlp.fc1.weight"].data
            bound = (6 / (96 + 192)) ** 0.5  # Xavier uniform: U(-0.144, 0.144)
            assert 0.9 * bound < fc1.abs().max() <= bound, fc1.abs().max()
            v = params["vit.layers.0.attention.v_proj.weight"].data
            o = params["vit.layers.0.attention.o_proj.weight"].data
            assert abs(torch.diagonal(v.T @ o.T).mean() + 0.4) < 0.05  # W_v^T W_o^T = 0.4 Z - 0.4 I
            fingerprint = torch.stack([p.data.double().sum() for p in params.values()])
        gathered = [torch.zeros_like(fingerprint) for _ in range(2)]
        torch.distributed.all_gather(gathered, fingerprint)
        assert torch.equal(gathered[0], gathered[1]), "ranks hold different weights"
        print("ZERO3-INIT-OK", torch.distributed.get_rank())
        shutdown_distributed()
    """)
    proc = run_script(tmp_path, "check.py", code, launcher="torchrun", nproc=2, timeout=600)
    assert proc.stdout.count("ZERO3-INIT-OK") == 2
