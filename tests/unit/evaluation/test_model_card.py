"""The model card written beside the trained model: results and setup tables, the Hub `datasets` metadata only for
Hub dataset ids, DeepSpeed named when it was used, and the path `pipeline(...)` loads from."""

import json

import pytest
from huggingface_hub import ModelCard

from hf_vit_scaling.evaluation.model_card import (
    load_card_facts,
    render_model_card,
    teacher_accuracy,
    write_model_card,
)

PLAIN_TRAINER = {"engine": "none (plain Trainer)", "ds_config": "none"}  # recipes/train_vit.py without --ds_config
FSDP2 = {"engine": "FSDP2 (fully_shard per ViTLayer, parameters resharded after forward, FULL_STATE_DICT)",
         "ds_config": "none"}  # fmt: skip


def _info(**overrides) -> dict:
    info = {
        "model_name": "vit-b16-cifar100",
        "model_desc": "vit-b-16 trained from scratch",
        "dataset": "uoft-cs/cifar100",
        "eval_split_size": 10000,
        "metrics": {"eval_accuracy": 0.912345, "eval_top5_accuracy": 0.99, "eval_samples": 10000},
        "hub_model_id": None,
        "setup": {"ds_config": "ds_configs/zero2.json", "world size": 8, "global batch": 512, "seed": 42},
    }
    return info | overrides


def _front_matter(card: str) -> str:
    assert card.startswith("---\n")
    return card.split("---\n")[1]


def test_card_has_the_metrics_and_setup_rows():
    card = render_model_card(_info())
    assert "# vit-b16-cifar100" in card and "(vit-b-16 trained from scratch)" in card
    assert "## Results (held-out split: 10000 images)" in card
    assert "| eval_accuracy | 0.9123 |" in card  # floats to 4 decimals
    assert "| eval_top5_accuracy | 0.9900 |" in card and "| eval_samples | 10000 |" in card
    for row in (
        "| ds_config | ds_configs/zero2.json |",
        "| world size | 8 |",
        "| global batch | 512 |",
        "| seed | 42 |",
    ):
        assert row in card
    assert "Hugging Face Trainer + DeepSpeed `zero2.json`" in card


@pytest.mark.parametrize(
    "model_type, tag, noun",
    [(None, "vit", "A Vision Transformer"), ("deit", "deit", "A Vision Transformer"),
     ("regnet", "regnet", "A regnet image classifier")],
    ids=["facts-without-a-type", "deit", "cnn-teacher"],
)  # fmt: skip
def test_card_names_the_architecture_it_trained(model_type, tag, noun):
    info = _info() if model_type is None else _info(model_type=model_type)
    card = render_model_card(info)
    assert ModelCard(card).data.tags == ["vision", "image-classification", tag, "deepspeed", "hf-vit-scaling"]
    assert f"\n{noun} (vit-b-16 trained from scratch)" in card


@pytest.mark.parametrize(
    "dataset, listed",
    [("uoft-cs/cifar100", True), ("sklearn-digits", False), ("/data/cifar100_saved", False)],
    ids=["hub-id", "builtin", "absolute-path"],
)
def test_datasets_metadata_only_for_hub_ids(dataset, listed):
    card = render_model_card(_info(dataset=dataset))
    assert f"**{dataset}**" in card
    front = _front_matter(card)
    assert ("datasets:\n- uoft-cs/cifar100\n" in front) is listed
    assert ("datasets:" in front) is listed


def test_relative_local_dataset_path_is_not_listed_as_a_hub_dataset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "train").mkdir(parents=True)
    assert "datasets:" not in _front_matter(render_model_card(_info(dataset="data/train")))


def test_plain_trainer_card_does_not_claim_deepspeed():
    card = render_model_card(_info(setup=PLAIN_TRAINER | {"world size": 2}))
    assert "| engine | none (plain Trainer) |" in card
    intro = card.split("## Results")[0].split("---\n")[2]  # the intro, after the metadata
    assert "DeepSpeed" not in intro and "FSDP2" not in intro


def test_fsdp2_card_names_fsdp2_not_deepspeed():
    card = render_model_card(_info(setup=FSDP2 | {"world size": 2}))
    intro = card.split("## Results")[0].split("---\n")[2]
    assert "Hugging Face Trainer + PyTorch FSDP2" in intro and "DeepSpeed" not in intro
    assert f"| engine | {FSDP2['engine']} |" in card


def test_load_path_is_the_hub_id_when_pushed_else_the_model_name():
    assert 'pipeline("image-classification", model="vit-b16-cifar100")' in render_model_card(_info())
    pushed = render_model_card(_info(hub_model_id="someone/vit-b16-cifar100"))
    assert 'model="someone/vit-b16-cifar100"' in pushed


def test_write_model_card_writes_readme(tmp_path):
    path = write_model_card(str(tmp_path), _info())
    assert path == str(tmp_path / "README.md")
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == render_model_card(_info())
    # The facts beside it, for a later card (the medical evaluation) that replaces this one.
    assert load_card_facts(str(tmp_path)) == json.loads(json.dumps(_info(), default=str))
    assert load_card_facts(str(tmp_path / "elsewhere")) is None


def _throughput_report() -> dict:
    """A throughput.json of 2 CPU processes (every key of the schema; the values the card shows are set)."""
    from hf_vit_scaling.throughput.schema import REPORT_SCHEMA, SCHEMA_VERSION

    report = {section: dict.fromkeys(keys) for section, keys in REPORT_SCHEMA.items()}
    report["schema_version"] = SCHEMA_VERSION
    versions = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "deepspeed": "0.19.8"}
    report["setup"] |= {"world_size": 2, "num_nodes": 1, "devices": ["cpu (x86_64, 1 threads)"], "versions": versions}
    report["throughput"] |= {"images_per_s": 276.04, "images_per_s_per_device": 138.02, "steps_measured": 1435,
                             "warmup_steps": 5}  # fmt: skip
    report["flops"] |= {"mfu": 0.0625, "peak_tflops_per_device": 0.0703, "peak_source": "matmul-probe"}
    report["memory"] |= {"kind": "rss_peak_bytes", "max_bytes": 792489984}
    return report


def test_card_carries_the_training_speed_and_parses_as_a_hub_card(tmp_path):
    """With the run's throughput.json beside it, the card has a "Training speed" table; huggingface_hub reads the
    card's metadata and text."""
    (tmp_path / "throughput.json").write_text(json.dumps(_throughput_report()))
    card = ModelCard.load(write_model_card(str(tmp_path), _info()))
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-classification"
    speed = card.text.split("## Training speed")[1].split("##")[0]
    for row in (
        "| images/s (all devices) | 276.0 |",
        "| images/s per device | 138.0 |",
        "| MFU | 6.2% |",
        "| peak memory per device | 0.74 GiB resident (RSS) |",
        "| measured | 1435 steps after 5 warm-up steps |",
        "| hardware | 2 x cpu (x86_64, 1 threads) on 1 node(s) |",
        "| versions | torch 2.13.0+cpu, transformers 5.24.0, deepspeed 0.19.8 |",
    ):
        assert row in speed, speed
    assert "0.0703 TFLOP/s per device, a large matmul timed on this device" in speed


def test_card_without_a_throughput_report_has_no_speed_section(tmp_path):
    card = open(write_model_card(str(tmp_path), _info()), encoding="utf-8").read()
    assert "## Training speed" not in card and "## Use" in card


def test_a_run_too_short_to_measure_gets_n_a_rows_not_a_crash(tmp_path):
    """--max_steps at or below --throughput_warmup_steps measures nothing: images/s, MFU and memory are null."""
    import json

    report = _throughput_report()
    report["throughput"] |= {"images_per_s": None, "images_per_s_per_device": None, "steps_measured": 0}
    report["flops"] |= {"mfu": None, "peak_tflops_per_device": None}
    report["memory"]["max_bytes"] = None
    (tmp_path / "throughput.json").write_text(json.dumps(report))
    card = open(write_model_card(str(tmp_path), _info()), encoding="utf-8").read()
    assert "| images/s (all devices) | n/a |" in card and "| MFU | n/a |" in card
    assert "| measured | 0 steps after 5 warm-up steps |" in card


def test_teacher_accuracy_is_what_the_teacher_run_recorded_or_not_recorded(tmp_path):
    """The recipe leaves eval_results.json and all_results.json beside a model it trained; the teacher's accuracy is
    read from the first that holds one, and a folder without one (or with a broken file) says so."""
    import json

    folder = tmp_path / "teacher"
    folder.mkdir()
    assert teacher_accuracy(str(folder)).startswith("not recorded (no eval_accuracy in eval_results.json or ")
    (folder / "eval_results.json").write_text("{not json")
    (folder / "all_results.json").write_text(json.dumps({"train_loss": 0.3, "eval_accuracy": 0.8125}))
    assert teacher_accuracy(str(folder)) == "0.8125 (its all_results.json)"
    (folder / "eval_results.json").write_text(json.dumps({"eval_accuracy": 0.90625, "eval_samples": 64}))
    assert teacher_accuracy(str(folder)) == "0.9062 on 64 images (its eval_results.json)"
    card = render_model_card(_info(setup={"teacher": "outputs/teacher (soft, alpha 0.1, tau 3)",
                                          "teacher accuracy": teacher_accuracy(str(folder))}))  # fmt: skip
    assert "| teacher accuracy | 0.9062 on 64 images (its eval_results.json) |" in card
