"""RegularizationArguments: every flag out of range is a UserInputError naming it; combinations that cannot work
are refused before any work."""

import pytest
from transformers import HfArgumentParser

from hf_vit_scaling.arguments.regularization import RegularizationArguments, check_regularization
from hf_vit_scaling.data.input_path import RESOLVED_PATHS
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.deepspeed_config import read_config
from hf_vit_scaling.regularization.ema import EMA_FILENAME, check_ema_resumable

DEIT = dict(
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
    mixup_prob=1.0,
    mixup_switch_prob=0.5,
    rand_augment="rand-m9-mstd0.5-inc1",
    random_erasing=0.25,
    drop_path_rate=0.1,
    ema_decay=0.99996,
    layer_decay=0.65,
    eval_crop_pct=0.875,
)


def test_defaults_turn_everything_off():
    args = RegularizationArguments()
    assert not args.mixes and args.rand_augment is None and args.random_erasing == 0 and args.drop_path_rate == 0
    assert args.ema_decay is None and args.layer_decay is None and args.eval_crop_pct is None


def test_deit_values_are_accepted():
    assert RegularizationArguments(**DEIT).mixes


@pytest.mark.parametrize(
    "flag, value",
    [
        ("mixup_alpha", -0.1),
        ("cutmix_alpha", -1.0),
        ("mixup_alpha", float("inf")),
        ("mixup_alpha", float("nan")),
        ("mixup_prob", 1.5),
        ("mixup_prob", -0.1),
        ("mixup_switch_prob", 2.0),
        ("random_erasing", 1.01),
        ("random_erasing", -0.5),
        ("drop_path_rate", 1.0),
        ("drop_path_rate", -0.1),
        ("ema_decay", 1.0),
        ("ema_decay", 0.0),
        ("layer_decay", 0.0),
        ("layer_decay", 1.5),
        ("eval_crop_pct", 0.0),
        ("eval_crop_pct", 1.2),
        ("rand_augment", "rand-x9"),
    ],
)
def test_out_of_range_flag_is_refused_by_name(flag, value):
    with pytest.raises(UserInputError) as err:
        RegularizationArguments(**{flag: value})
    message = str(err.value)
    assert f"--{flag}" in message and "Fix:" in message


def test_the_argument_parser_runs_the_checks():
    parser = HfArgumentParser(RegularizationArguments)
    (args,) = parser.parse_args_into_dataclasses(["--mixup_alpha", "0.8", "--rand_augment", "trivial"])
    assert args.mixup_alpha == 0.8 and args.rand_augment == "trivial"
    with pytest.raises(UserInputError, match="--random_erasing"):
        parser.parse_args_into_dataclasses(["--random_erasing", "3"])


ZERO3 = read_config({"zero_optimization": {"stage": 3}})  # as the run's Engine reads it


@pytest.mark.parametrize(
    "flags, context, match",
    [
        (dict(ema_decay=0.999), dict(ds_config=ZERO3), "ZeRO-3"),
        (
            dict(layer_decay=0.75),
            dict(ds_config=read_config({"optimizer": {"type": "AdamW"}})),
            "builds its own optimizer",
        ),
        (
            dict(layer_decay=0.75),
            dict(ds_config=read_config({"scheduler": {"type": "WarmupLR"}})),
            "builds its own scheduler",
        ),
    ],
)
def test_combinations_that_cannot_work_are_refused(flags, context, match):
    with pytest.raises(UserInputError, match=match) as err:
        check_regularization(RegularizationArguments(**flags), **context)
    assert "Fix:" in str(err.value)


def test_combinations_that_work_pass():
    args = RegularizationArguments(**DEIT)
    check_regularization(args, ds_config=read_config({"zero_optimization": {"stage": 2}}))
    RESOLVED_PATHS["device"].check_eval_crop(args.eval_crop_pct)
    check_regularization(RegularizationArguments(layer_decay=0.75, drop_path_rate=0.1), ds_config=ZERO3)
    # Every augmentation with sequence parallelism: the ranks of a group share one seed (training/seeding.py), so
    # they draw the same crops, mixes and drop masks (tests/launched/test_sequence_parallel_launched.py).
    check_regularization(RegularizationArguments(**DEIT))


def test_resuming_with_ema_needs_the_ema_file(tmp_path):
    with pytest.raises(UserInputError, match=f"has no {EMA_FILENAME}"):
        check_ema_resumable(0.999, str(tmp_path))
    (tmp_path / EMA_FILENAME).write_bytes(b"")
    check_ema_resumable(0.999, str(tmp_path))


def test_eval_crop_is_refused_on_the_per_sample_path():
    with pytest.raises(UserInputError, match="--eval_crop_pct") as err:
        RESOLVED_PATHS["per_sample"].check_eval_crop(0.875)
    assert "Fix:" in str(err.value)
    RESOLVED_PATHS["host_crop"].check_eval_crop(0.875)
    RESOLVED_PATHS["per_sample"].check_eval_crop(None)
