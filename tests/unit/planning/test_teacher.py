"""The planner's distillation teacher (`planning.teacher`): one whole copy per rank in the run's precision under
every engine, its no_grad forward's peak for one micro-batch at the end of the student's forward, its forward FLOPs
in the step; recipes/plan.py --teacher_model."""

import json

import pytest
import torch

from hf_vit_scaling.models.presets import preset_config
from hf_vit_scaling.planning.memory import engine_memory
from hf_vit_scaling.planning.shapes import ENGINES
from hf_vit_scaling.planning.speed import engine_speed
from hf_vit_scaling.planning.teacher import TeacherShape, no_grad_peak_elements, teacher_shape
from tests.unit.planning.plan_settings import settings
from tests.unit.planning.test_plan_cli import BASE, load_recipe

DIGITS = [str(i) for i in range(10)]


def test_no_grad_peak_is_the_largest_set_of_tensors_live_at_once():
    # Linear 8 -> 64 -> ReLU -> Linear 64 -> 4 on 3 rows, without autograd: the first output (3 x 64 = 192) and the
    # ReLU's (192) are live together, then the ReLU's and the last output (3 x 4 = 12): peak 384. The ReLU's
    # in-place variant makes nothing new: peak 192 + 12.
    def mlp(inplace):
        return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(inplace), torch.nn.Linear(64, 4))

    class Model(torch.nn.Module):
        def __init__(self, inplace):
            super().__init__()
            self.net = mlp(inplace)

        def forward(self, pixel_values):
            return self.net(pixel_values)

    with torch.device("meta"):
        pixels = torch.zeros(3, 8)
        assert no_grad_peak_elements(Model(inplace=False), pixels) == 2 * 3 * 64
        assert no_grad_peak_elements(Model(inplace=True), pixels) == 3 * 64 + 3 * 4


def test_resnet_tiny_teacher_by_hand():
    """resnet-tiny-cpu, 10 classes, at 32 px: 312,490 parameters + 672 channels x 2 batch-norm statistics; its
    forward peaks at the stem, the convolution's output and its norm's output (2 x 32 x 16 x 16) plus the norm's
    two 32-channel statistics; 8.44 MFLOPs (counted, as the throughput report counts it)."""
    shape = teacher_shape(preset_config("resnet-tiny-cpu", DIGITS), 32, "resnet-tiny-cpu")
    assert shape.weight_elements == 312_490 + 2 * 672 == 313_834
    assert shape.forward_peak_elements_per_image == 2 * 32 * 16 * 16 + 2 * 32 == 16_448
    assert shape.forward_flops_per_image == 8_440_320
    assert shape.weight_bytes("bf16") == 2 * 313_834 and shape.weight_bytes("fp32") == 4 * 313_834
    assert shape.forward_bytes(256, "bf16") == 16_448 * 256 * 2  # 8.4 MB
    # At the student's 16 px the activations are a quarter (16,448 -> 4,160), the weights unchanged.
    small = teacher_shape(preset_config("resnet-tiny-cpu", DIGITS), 16, "resnet-tiny-cpu")
    assert small.weight_elements == 313_834 and small.forward_peak_elements_per_image == 2 * 32 * 8 * 8 + 2 * 32


TEACHER = TeacherShape("teacher", weight_elements=25_000_000, forward_flops_per_image=8 * 10**9,
                       forward_peak_elements_per_image=400_000)  # fmt: skip


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_holds_the_whole_teacher_and_its_forward_for_one_micro_batch(engine, precision):
    """The same bytes on every rank whatever the engine and the world size (never partitioned): the weights in the
    run's precision between steps, its forward's peak for the micro-batch on top of the end of the student's
    forward; nothing in the other phases."""
    p = 2 if precision == "bf16" else 4
    for gpus in (1, 8):
        base = settings(precision=precision, gpus_per_node=gpus)
        alone, taught = engine_memory(engine, base), engine_memory(engine, settings(precision=precision,
                                                                                    gpus_per_node=gpus,
                                                                                    teacher=TEACHER))  # fmt: skip
        weights, forward = 25_000_000 * p, 400_000 * 32 * p  # batch 32: 25.6 MB in bf16
        assert taught.phases["static"] - alone.phases["static"] == weights
        assert taught.phases["forward"] - alone.phases["forward"] == forward
        for phase in ("backward_start", "backward_end", "step"):
            assert taught.phases[phase] == alone.phases[phase]
        assert taught.parts["teacher"] == weights + forward and "teacher" not in alone.parts
        assert alone.peak + weights <= taught.peak <= alone.peak + weights + forward


def test_the_teacher_forward_joins_the_step_compute():
    # 32 images x 8 GFLOP of teacher forward = 256 GFLOP more per step, at 125 TFLOP/s: 2.048 ms.
    alone, taught = engine_speed("ddp", settings()), engine_speed("ddp", settings(teacher=TEACHER))
    assert taught.seconds["compute"] - alone.seconds["compute"] == pytest.approx(32 * 8e9 / 125e12)


def test_plan_cli_takes_a_preset_or_a_saved_folder_as_teacher(tmp_path, capsys):
    recipe = load_recipe()
    assert recipe.main([*BASE, "--teacher_model", "resnet-tiny-cpu", "--num_labels", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    teacher = report["settings"]["teacher"]
    expected = teacher_shape(preset_config("resnet-tiny-cpu", DIGITS), 224, "resnet-tiny-cpu")
    assert teacher["weight_elements"] == expected.weight_elements
    assert teacher["forward_peak_elements_per_image"] == expected.forward_peak_elements_per_image
    assert teacher["weight_bytes"] == 2 * expected.weight_elements  # bf16
    assert all(option["memory"]["parts"]["teacher"] > 0 for option in report["options"])

    preset_config("resnet-tiny-cpu", DIGITS).save_pretrained(tmp_path / "teacher")  # a folder: config.json only
    assert recipe.main([*BASE, "--teacher_model", str(tmp_path / "teacher")]) == 0
    table = capsys.readouterr().out
    assert f"Teacher: {tmp_path / 'teacher'}, 0.31 M weights held whole on every GPU" in table
    assert " teacher " in table.splitlines()[4]  # the table's header has a teacher column


@pytest.mark.parametrize(
    "args, words",
    [
        (["--teacher_model", "no-such-folder"], "neither a folder with a config.json nor a preset"),
        (["--teacher_model", "resnet-tiny-cpu", "--sequence_parallel_size", "2"], "sequence parallelism"),
    ],
)
def test_bad_teacher_is_one_error_line_and_exit_2(args, words, capsys):
    assert load_recipe().main([*BASE, *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: --teacher_model") and words in lines[0]
    assert "Fix:" in lines[0]
