"""The recipe's building blocks that run before any process group exists: the model and the card's facts."""

from types import SimpleNamespace

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.models.presets import image_processor_for
from hf_vit_scaling.parallel.engine import Engine
from hf_vit_scaling.training.run import World, build_model, model_card_facts
from tests.helpers.builders import save_tiny_pretrained_vit


def test_build_from_preset_and_from_a_checkpoint(tmp_path):
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--image_size", "16"])
    model, processor, desc = build_model(args.model, ["a", "b"])
    assert desc == "vit-tiny-cpu trained from scratch" and model.config.num_labels == 2
    assert processor.size == {"height": 16, "width": 16}
    checkpoint = save_tiny_pretrained_vit(tmp_path / "ckpt", num_labels=3)
    image_processor_for(checkpoint.config).save_pretrained(tmp_path / "ckpt")
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tmp_path / "ckpt")])
    model, _, desc = build_model(args.model, ["x", "y", "z", "w"])
    assert desc == f"fine-tuned from {tmp_path / 'ckpt'}" and model.config.num_labels == 4


def test_card_facts_describe_the_run(tmp_path):
    args = parse_args(["--output_dir", str(tmp_path / "run-a"), "--gradient_accumulation_steps", "2",
                       "--per_device_train_batch_size", "16", "--max_steps", "7"])  # fmt: skip
    model, _, desc = build_model(args.model, ["a", "b"])
    data = SimpleNamespace(source="sklearn-digits", splits={"validation": [0] * 5}, label_names=["a", "b"])
    world = World(Engine("trainer"), {"rule": "none"}, None, None)
    facts = model_card_facts(args, world, data, model, desc)
    assert facts["model_name"] == "run-a" and facts["eval_split_size"] == 5 and facts["dataset"] == "sklearn-digits"
    setup = facts["setup"]
    assert setup["global batch"] == 16 * 2 * 1 and setup["ds_config"] == "none"
    assert setup["engine"] == "none (plain Trainer)"
    assert setup["epochs"] == "7 steps" and setup["lr scaling"] == "none" and setup["model"] == "vit-tiny-cpu"
