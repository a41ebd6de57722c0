"""Tests `arguments.streaming`: what a stream refuses before anything loads."""

import pytest

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError


def streaming_argv(tmp_path, *extra):
    return ["--output_dir", str(tmp_path), "--streaming", "--dataset_name", str(tmp_path), *extra]


@pytest.mark.parametrize(
    "extra, words",
    [
        ([], "--max_steps"),
        (["--max_steps", "5", "--class_weighting", "balanced"], "--class_weighting"),
        (["--max_steps", "5", "--max_train_samples", "9"], "--max_train_samples"),
        (["--max_steps", "5", "--save_strategy", "epoch"], "--save_strategy steps"),
        (["--max_steps", "5", "--balance_batches", "1,1"], "--balance_batches"),
        (["--max_steps", "5", "--shuffle_buffer_size", "-1"], "--shuffle_buffer_size"),
    ],
)
def test_streaming_refusals_before_loading(tmp_path, extra, words):
    with pytest.raises(UserInputError, match=words):
        parse_args(streaming_argv(tmp_path, *extra))


def test_file_flags_need_streaming(tmp_path):
    with pytest.raises(UserInputError, match="add --streaming"):
        parse_args(["--output_dir", str(tmp_path), "--train_files", "x.parquet"])
    args = parse_args(streaming_argv(tmp_path, "--max_steps", "3"))
    assert args.streaming.streaming and args.streaming.shuffle_buffer_size == 1000
