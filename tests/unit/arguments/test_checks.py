"""Tests `arguments.checks`: the checks across argument groups, run by parse_args."""

import os
import pickle
import re

import pytest

from hf_vit_scaling.arguments.checks import TRAINING_RANGES, check_restart_setup
from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError


def test_hub_token_never_stays_in_the_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secret = "hf_unitTestToken42"
    training_args = parse_args(["--output_dir", str(tmp_path), "--hub_token", secret]).training
    assert training_args.hub_token is None
    assert secret.encode() not in pickle.dumps(training_args)  # what training_args.bin holds
    assert os.environ["HF_TOKEN"] == secret  # where huggingface_hub finds it for the upload


def test_skip_policy_with_accumulation_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="--gradient_accumulation_steps 1"):
        parse_args(
            ["--output_dir", str(tmp_path), "--on_nonfinite_loss", "skip", "--gradient_accumulation_steps", "2"]
        )


def test_torchrun_restarts_need_latest_and_a_fresh_store_per_attempt(tmp_path):
    """The environment torchrun gives its workers (printed from a real torchrun worker: TORCHELASTIC_USE_AGENT_STORE
    is True with the default static rendezvous and with c10d, False with c10d +
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)."""
    training_args = parse_args(["--output_dir", str(tmp_path)]).training
    static = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    fresh_store = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "False"}
    with pytest.raises(UserInputError, match="--resume_from_checkpoint latest"):
        check_restart_setup(training_args, fresh_store)
    training_args.resume_from_checkpoint = "latest"
    with pytest.raises(UserInputError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d"):
        check_restart_setup(training_args, static)
    check_restart_setup(training_args, fresh_store)  # the launch the message recommends
    check_restart_setup(training_args, {"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})


def test_class_weighting_is_refused_beside_soft_targets(tmp_path):
    base = ["--output_dir", str(tmp_path), "--class_weighting", "balanced"]
    assert parse_args(base).data.class_weighting == "balanced"
    for extra in (["--mixup_alpha", "0.2"], ["--label_smoothing_factor", "0.1"]):
        with pytest.raises(UserInputError, match="--class_weighting cannot be combined"):
            parse_args(base + extra)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
        (["--per_device_eval_batch_size", "-2"], "--per_device_eval_batch_size"),
        (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps"),
        (["--learning_rate", "-1"], "--learning_rate"),
        (["--num_train_epochs", "0"], "--num_train_epochs"),
        (["--max_steps", "0"], "--max_steps"),
    ],
)
def test_training_numbers_are_refused_before_anything_loads(tmp_path, argv, flag):
    with pytest.raises(UserInputError, match=flag):
        parse_args(["--output_dir", str(tmp_path), *argv])


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [
        ("weight_decay", "-0.1", ">= 0"),
        ("adam_beta1", "1.0", "in [0, 1)"),
        ("adam_beta1", "-0.1", "in [0, 1)"),
        ("adam_beta2", "1.5", "in [0, 1)"),
        ("adam_epsilon", "-1e-8", ">= 0"),
        ("max_grad_norm", "-1", ">= 0"),
        ("label_smoothing_factor", "1.0", "in [0, 1)"),
        ("label_smoothing_factor", "-0.1", "in [0, 1)"),
        ("warmup_steps", "-1", ">= 0"),  # TrainingArguments' own bare ValueError before
    ],
)
def test_training_numbers_out_of_range_are_refused_with_the_range(tmp_path, flag, value, allowed):
    with pytest.raises(UserInputError) as caught:
        parse_args(["--output_dir", str(tmp_path), f"--{flag}={value}"])
    message = str(caught.value)
    assert message.startswith(f"--{flag} must be {allowed}, got {float(value)}. Fix: pass a value {allowed}, e.g.")


def test_training_numbers_at_the_edges_of_their_ranges_pass(tmp_path):
    edges = {"weight_decay": 0, "adam_beta1": 0, "adam_beta2": 0, "adam_epsilon": 0, "max_grad_norm": 0,
             "label_smoothing_factor": 0, "warmup_steps": 0, "dataloader_num_workers": 0}  # fmt: skip
    assert set(edges) == set(TRAINING_RANGES)
    argv = [arg for flag, value in edges.items() for arg in (f"--{flag}", str(value))]
    training = parse_args(["--output_dir", str(tmp_path), *argv]).training
    assert training.weight_decay == 0 and training.max_grad_norm == 0 and training.adam_beta2 == 0


def test_output_dir_must_be_a_folder_or_a_path_where_one_can_be_made(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out, words in ((a_file, "is a file, not a folder"), (a_file / "run", f"is inside '{a_file}', which is")):
        with pytest.raises(UserInputError, match=re.escape(f"--output_dir '{out}' {words}")):
            parse_args(["--output_dir", str(out)])
    assert parse_args(["--output_dir", str(tmp_path / "new" / "run")]).training.output_dir.endswith("new/run")
    assert not (tmp_path / "new").exists()  # checked, not made: a later refusal leaves nothing behind
    assert parse_args(["--output_dir", str(tmp_path)]).training.output_dir == str(tmp_path)


def test_class_weighting_trains_when_mixup_never_mixes(tmp_path):
    """`--mixup_prob 0` mixes no batch, so the targets stay hard and class weights apply; with a nonzero
    probability the same flags are refused. Fails if the check decides soft targets from the alphas alone (it once
    ignored --mixup_prob)."""
    base = ["--output_dir", str(tmp_path), "--class_weighting", "balanced", "--mixup_alpha", "0.8"]
    args = parse_args([*base, "--mixup_prob", "0"])
    assert args.data.class_weighting == "balanced" and args.regularization.mixup_alpha == 0.8
    with pytest.raises(UserInputError, match="--class_weighting cannot be combined"):
        parse_args([*base, "--mixup_prob", "0.5"])


def test_transformers_jit_checkpoint_is_refused_naming_stop_signals(tmp_path):
    """One SIGTERM handler per process: transformers' --enable_jit_checkpoint is refused with one line naming
    --stop_signals, whatever --stop_signals says. Fails if the refusal is removed (both handlers would be
    installed)."""
    for extra in ([], ["--stop_signals", "none"]):
        with pytest.raises(UserInputError) as refused:
            parse_args(["--output_dir", str(tmp_path), "--enable_jit_checkpoint", "true", *extra])
        message = str(refused.value)
        assert "--enable_jit_checkpoint" in message and "--stop_signals" in message and "\n" not in message
