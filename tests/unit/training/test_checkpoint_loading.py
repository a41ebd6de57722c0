"""Every load of a checkpoint restores every tensor, in one process: resume and `--load_best_model_at_end` through
`VitTrainer` (the plain Trainer's load points), the EMA shadow, fine-tuning through `--model_name_or_path`.

transformers 5 saves ViT weights in the original key format (`vit.encoder.layer.N.attention.attention.query`) and
converts them to the modules' names (`vit.layers.N.attention.q_proj`) only in `from_pretrained`; our loads go
through the same conversion (`models.weights.converted_state_dict`) and stop with an error naming the keys and the
checkpoint when a tensor would stay unrestored. The same through the recipe, as real processes:
tests/launched/test_resume_exact.py.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import TrainingArguments, ViTForImageClassification, ViTModel

from hf_vit_scaling.errors import TrainingStopped, UserInputError
from hf_vit_scaling.log import setup_logging
from hf_vit_scaling.models.presets import load_model_for_finetuning
from hf_vit_scaling.models.weights import converted_state_dict, load_model_weights
from hf_vit_scaling.regularization.ema import EMA_FILENAME, EMACallback
from hf_vit_scaling.training.faults import FAULTS_ENV
from hf_vit_scaling.training.trainer import VitTrainer
from tests.helpers.builders import save_tiny_pretrained_vit, tiny_vit_config

# A tensor as transformers saves it, and the model's name for it.
SAVED_KEY, MODEL_KEY = "vit.encoder.layer.1.output.dense.weight", "vit.layers.1.mlp.fc2.weight"


def tiny_model(seed: int) -> ViTForImageClassification:
    """The architecture of `save_tiny_pretrained_vit` (2 layers, width 32), with other random weights: every tensor
    drawn from the seed, biases and LayerNorm parameters too (at init those are 0 and 1 in every model, so a load
    that skipped them would still pass a comparison between two models)."""
    torch.manual_seed(seed)
    model = ViTForImageClassification(tiny_vit_config(image_size=16, hidden_size=32, num_hidden_layers=2))
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model


def assert_every_tensor_differs(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Before a load: no tensor of `model` equals `reference`'s, so "nothing differs" after it means every one was
    loaded."""
    assert sorted(differing(model, reference)) == sorted(reference.state_dict())


def differing(model: torch.nn.Module, reference: torch.nn.Module) -> list[str]:
    got, ref = model.state_dict(), reference.state_dict()
    assert sorted(got) == sorted(ref)
    return [key for key in ref if not torch.equal(got[key], ref[key])]


def drop_tensor(folder, key: str = SAVED_KEY) -> None:
    tensors = load_file(folder / "model.safetensors")
    del tensors[key]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture
def saved(tmp_path):
    """(folder, model): a tiny ViT saved with `save_pretrained`, in transformers' original key format."""
    folder = tmp_path / "ckpt"
    model = save_tiny_pretrained_vit(folder)
    assert SAVED_KEY in load_file(folder / "model.safetensors")
    return folder, model


@pytest.fixture
def make_trainer(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)

    def make(seed: int = 1) -> VitTrainer:
        args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
        return VitTrainer(model=tiny_model(seed), args=args)

    return make


# ---------------------------------------------------------------- the conversion


def test_the_saved_format_is_not_the_models_and_the_conversion_maps_every_key(saved):
    folder, original = saved
    state_dict = load_file(folder / "model.safetensors")
    model = tiny_model(1)
    assert MODEL_KEY in model.state_dict() and SAVED_KEY not in model.state_dict()
    converted = converted_state_dict(model, state_dict)
    assert sorted(converted) == sorted(model.state_dict())
    assert all(torch.equal(converted[key], tensor) for key, tensor in original.state_dict().items())


def test_converting_an_already_converted_state_dict_is_a_no_op(saved):
    """Keys in the model's own format (what a fixed upstream or a second conversion gives) stay as they are."""
    folder, _ = saved
    model = tiny_model(1)
    own = model.state_dict()
    assert converted_state_dict(model, own) == own
    once = converted_state_dict(model, load_file(folder / "model.safetensors"))
    twice = converted_state_dict(model, once)
    assert sorted(twice) == sorted(once) and all(twice[key] is once[key] for key in once)


def test_a_checkpoint_saved_in_the_models_own_format_loads_too(saved, tmp_path):
    _, original = saved
    folder = tmp_path / "new_format"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in original.state_dict().items()}, folder / "model.safetensors")
    model = tiny_model(1)
    assert load_model_weights(model, str(folder)) == len(original.state_dict())
    assert differing(model, original) == []


# ---------------------------------------------------------------- resume and the best model (VitTrainer)


def test_resume_restores_every_tensor_of_a_save_pretrained_checkpoint(saved, make_trainer):
    folder, original = saved
    trainer = make_trainer()
    assert_every_tensor_differs(trainer.model, original)
    trainer._load_from_checkpoint(str(folder))
    assert differing(trainer.model, original) == []


def test_resume_restores_every_tensor_of_a_checkpoint_the_trainer_saved(make_trainer, tmp_path):
    saver = make_trainer(seed=5)
    saver.save_model(str(tmp_path / "saved_by_trainer"))  # the Trainer's own save (what every checkpoint holds)
    trainer = make_trainer(seed=6)
    assert_every_tensor_differs(trainer.model, saver.model)
    trainer._load_from_checkpoint(str(tmp_path / "saved_by_trainer"))
    assert differing(trainer.model, saver.model) == []


def test_train_resuming_goes_through_the_strict_load(make_trainer, tmp_path):
    """`train(resume_from_checkpoint=...)` reaches our load (a renamed hook in a newer transformers would not): 2
    steps saved as checkpoint-2, then a model with other weights resumes there with nothing left to train."""
    data = [{"pixel_values": torch.randn(3, 16, 16), "labels": i % 3} for i in range(8)]
    saver = make_trainer(seed=5)
    saver.args.max_steps, saver.args.per_device_train_batch_size, saver.args.save_steps = 2, 4, 2
    saver.train_dataset = data
    saver.train()
    folder = tmp_path / "out" / "checkpoint-2"
    assert SAVED_KEY in load_file(folder / "model.safetensors")
    resumer = make_trainer(seed=6)
    assert_every_tensor_differs(resumer.model, saver.model)
    resumer.args.max_steps, resumer.args.per_device_train_batch_size = 2, 4
    resumer.train_dataset = data
    resumer.train(resume_from_checkpoint=str(folder))
    assert differing(resumer.model, saver.model) == []


def test_load_best_model_restores_every_tensor(saved, make_trainer):
    """Fails if the best-model load skips any tensor (every one differs before it, biases and LayerNorm included)."""
    folder, original = saved
    trainer = make_trainer()
    assert_every_tensor_differs(trainer.model, original)
    trainer.state.best_model_checkpoint, trainer.state.best_metric = str(folder), 0.5
    trainer._load_best_model()
    assert differing(trainer.model, original) == []


def test_resume_from_a_checkpoint_missing_a_tensor_stops_with_an_error_naming_it(saved, make_trainer):
    folder, _ = saved
    drop_tensor(folder)
    trainer = make_trainer()
    before = {key: tensor.clone() for key, tensor in trainer.model.state_dict().items()}
    with pytest.raises(UserInputError) as caught:
        trainer._load_from_checkpoint(str(folder))
    message = str(caught.value)
    assert "--resume_from_checkpoint" in message and str(folder) in message and MODEL_KEY in message
    assert "\n" not in message  # one `error:` line
    assert all(torch.equal(trainer.model.state_dict()[key], tensor) for key, tensor in before.items())  # untouched


def test_a_checkpoint_with_a_tensor_the_model_lacks_stops_too(saved, make_trainer):
    folder, _ = saved
    tensors = load_file(folder / "model.safetensors")
    tensors["vit.encoder.layer.7.output.dense.weight"] = tensors[SAVED_KEY].clone()  # a layer the model does not have
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserInputError, match=r"1 tensor\(s\) the model does not have: vit\.layers\.7\.mlp\.fc2"):
        make_trainer()._load_from_checkpoint(str(folder))


def test_a_best_checkpoint_missing_a_tensor_stops_the_run(saved, make_trainer):
    folder, _ = saved
    drop_tensor(folder)
    trainer = make_trainer()
    trainer.state.best_model_checkpoint, trainer.state.best_metric = str(folder), 0.5
    with pytest.raises(TrainingStopped, match=f"--load_best_model_at_end.*{folder}.*{MODEL_KEY}"):
        trainer._load_best_model()


# ---------------------------------------------------------------- the EMA shadow


def test_the_ema_shadow_restores_every_parameter_and_names_a_missing_one(tmp_path):
    model = tiny_model(1)
    saver = EMACallback(0.9)
    saver.shadow = {name: torch.randn_like(p, dtype=torch.float32) for name, p in model.named_parameters()}
    saver.global_step = 6
    saver.save_state(str(tmp_path))

    loader = EMACallback(0.9)
    loader.load_state(str(tmp_path), model, 6)
    assert sorted(loader.shadow) == sorted(saver.shadow)
    assert all(torch.equal(loader.shadow[name], saver.shadow[name]) for name in saver.shadow)

    del saver.shadow[MODEL_KEY]
    saver.save_state(str(tmp_path))
    with pytest.raises(UserInputError, match=f"{tmp_path / EMA_FILENAME}.*1 tensor.* missing: {MODEL_KEY}"):
        EMACallback(0.9).load_state(str(tmp_path), model, 6)


# ---------------------------------------------------------------- fine-tuning (--model_name_or_path)


def test_finetuning_restores_every_tensor_but_a_new_head_and_reports_the_head(saved, capsys):
    folder, original = saved
    setup_logging()
    model = load_model_for_finetuning(str(folder), ["a", "b", "c", "d"])
    head = {"classifier.weight", "classifier.bias"}
    got = model.state_dict()
    assert [key for key, t in original.state_dict().items() if key not in head and not torch.equal(got[key], t)] == []
    assert "a new classification head" in capsys.readouterr().out


def test_finetuning_from_a_vit_model_leaves_out_only_its_pooler(tmp_path):
    torch.manual_seed(3)
    backbone = ViTModel(tiny_vit_config(image_size=16, hidden_size=32, num_hidden_layers=2))  # with a pooler
    backbone.save_pretrained(tmp_path / "backbone")
    model = load_model_for_finetuning(str(tmp_path / "backbone"), ["a", "b"])
    got, kept = model.vit.state_dict(), {k: t for k, t in backbone.state_dict().items() if not k.startswith("pooler.")}
    assert sorted(got) == sorted(kept)
    assert [key for key, t in kept.items() if not torch.equal(got[key], t)] == []


def test_finetuning_from_a_checkpoint_missing_a_tensor_stops_with_an_error_naming_it(saved):
    folder, _ = saved
    drop_tensor(folder)
    with pytest.raises(UserInputError, match=f"--model_name_or_path '{folder}'.*missing: {MODEL_KEY}"):
        load_model_for_finetuning(str(folder), ["a", "b", "c", "d"])
