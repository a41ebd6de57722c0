"""Tests `arguments.mae` (recipes/pretrain_mae.py's flags): the paper's defaults, the preset's decoder with flags on
top, and one `error: ... Fix: ...` line for each bad value or classification-only flag."""

import pytest

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError


def parse(tmp_path, *flags, mae=True):
    return parse_args(["--output_dir", str(tmp_path / "out"), *flags], mae=mae)


def test_defaults_are_the_papers_and_the_decoder_is_the_presets(tmp_path):
    args = parse(tmp_path)
    assert (args.mae.mask_ratio, args.mae.norm_pix_loss, args.mae.knn_k) == (0.75, True, 20)
    assert args.mae.decoder("vit-b-16") == {
        "decoder_hidden_size": 512,
        "decoder_num_hidden_layers": 8,
        "decoder_num_attention_heads": 16,
        "decoder_intermediate_size": 2048,
    }
    narrow = parse(tmp_path, "--decoder_hidden_size", "32", "--decoder_num_attention_heads", "2", "--mask_ratio",
                   "0.6", "--norm_pix_loss", "false").mae  # fmt: skip
    assert narrow.decoder("vit-tiny-cpu") == {
        "decoder_hidden_size": 32,
        "decoder_num_hidden_layers": 2,
        "decoder_num_attention_heads": 2,
        "decoder_intermediate_size": 128,
    }
    assert (narrow.mask_ratio, narrow.norm_pix_loss) == (0.6, False)
    assert parse(tmp_path, mae=False).mae is None  # train_vit.py has none of these flags
    with pytest.raises(UserInputError, match="--mask_ratio is not a flag of this recipe"):
        parse(tmp_path, "--mask_ratio", "0.5", mae=False)
    # Each recipe's refusal points at its own --help (pretrain_mae.py has flags train_vit.py lacks).
    with pytest.raises(UserInputError, match=r"python recipes/train_vit\.py --help"):
        parse(tmp_path, "--mask_ratio", "0.5", mae=False)
    with pytest.raises(UserInputError, match=r"python recipes/pretrain_mae\.py --help"):
        parse(tmp_path, "--no_such_flag", "1", mae=True)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mask_ratio", "0"], "--mask_ratio must be in (0, 1), got 0.0"),
        (["--mask_ratio", "1"], "--mask_ratio must be in (0, 1), got 1.0"),
        (["--mask_ratio", "nan"], "--mask_ratio"),
        (["--decoder_hidden_size", "0"], "--decoder_hidden_size must be >= 1, got 0"),
        (["--decoder_num_hidden_layers", "-1"], "--decoder_num_hidden_layers must be >= 1"),
        (["--decoder_intermediate_size", "0"], "--decoder_intermediate_size must be >= 1"),
        (["--decoder_hidden_size", "30", "--decoder_num_attention_heads", "4"], "not a multiple of"),
        (["--knn_k", "0"], "--knn_k must be >= 1"),
        (["--knn_eval_steps", "-5"], "--knn_eval_steps must be >= 0"),
        (["--knn_temperature", "0"], "--knn_temperature must be positive"),
        (["--mixup_alpha", "0.8"], "--mixup_alpha: not for MAE pretraining"),
        (["--label_smoothing_factor", "0.1", "--cutmix_alpha", "1"], "--cutmix_alpha, --label_smoothing_factor: not"),
        (["--model_preset", "resnet-tiny-cpu"], "(a CNN): not for MAE pretraining"),
        (["--weight_init", "jax"], "--weight_init: not for MAE pretraining"),
        (["--drop_path_rate", "0.1", "--layer_decay", "0.75"], "--drop_path_rate, --layer_decay: not for MAE"),
    ],
)
def test_bad_values_give_one_error_with_a_fix(tmp_path, flags, message):
    with pytest.raises(UserInputError) as err:
        parse(tmp_path, *flags)
    text = str(err.value)
    assert message in text and "Fix:" in text and "\n" not in text


def test_a_checkpoint_to_start_from_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    with pytest.raises(UserInputError, match="MAE pretraining starts from a preset's random encoder"):
        parse(tmp_path, "--model_name_or_path", str(tmp_path / "ckpt"))
