"""Fine-tuning from a checkpoint with a new head under ZeRO-3, in 2 real processes (torchrun over gloo)."""

import textwrap

import pytest
import torch

from tests.helpers import run_script, save_tiny_pretrained_vit

LABELS = [f"class_{i}" for i in range(7)]


@pytest.mark.distributed
def test_finetuning_under_zero3_two_processes(tmp_path):
    """transformers issue 17336: under ZeRO-3 a mismatched head must still be initialised, the backbone loaded."""
    original = save_tiny_pretrained_vit(tmp_path / "ckpt")
    torch.save(original.state_dict(), tmp_path / "reference.pt")
    code = textwrap.dedent(f"""
        import deepspeed, torch
        from transformers import TrainingArguments
        from hf_vit_scaling.models import load_model_for_finetuning
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
    """)
    proc = run_script(tmp_path, "check.py", code, launcher="torchrun", nproc=2, timeout=300)
    assert proc.stdout.count("ZERO3-OK") == 2
