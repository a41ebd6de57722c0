"""End-to-end runs of recipes/train_vit.py as real processes: every ds_config, every launcher, DDP and plain, two
nodes on one machine.

Each test launches the recipe with torchrun / accelerate launch / deepspeed / python in subprocesses (gloo on CPU,
DS_ACCELERATOR=cpu) and checks what it writes; saved models are reloaded in fresh processes. Outputs go to tmp_path.
Runs are kept short (tiny ViT at 16 px, 15-30 steps, 100 eval images) so the whole file takes a few minutes on
2 CPU cores. Run them one at a time (no xdist): every test already uses both cores.
"""

import json
import math
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pytest

from hf_vit_scaling.parallel.launch import launch_command
from tests.helpers.builders import MIXED, make_image_folder
from tests.helpers.engine_runs import ENGINE_STEPS
from tests.helpers.launchers import (
    DS_CONFIGS,
    RECIPE,
    REPO,
    TINY_ARGS,
    free_port,
    launch_env,
    launcher_cmd,
    logged_losses,
    printed_json,
    read_json,
    run,
    run_recipe,
    run_script,
    side_by_side,
)
from tests.tiers import selected_params

pytestmark = pytest.mark.distributed

EVAL_SAMPLES = "100"
SHORT_RUN = ["--eval_strategy", "no", "--max_eval_samples", EVAL_SAMPLES]
DS_CONFIG_FILES = sorted(DS_CONFIGS.glob("*.json"))


def config_stage(path: Path) -> int:
    return int(read_json(path).get("zero_optimization", {}).get("stage", 0))


def run_checked(output_dir, *args, launcher="python", nproc=1, script=RECIPE):
    """Run the recipe; on failure, fail with the tail of its logs."""
    return run_recipe(output_dir, *args, launcher=launcher, nproc=nproc, script=script)


def throughput_setup(output_dir) -> dict:
    return read_json(Path(output_dir) / "throughput.json")["setup"]


# Top-1 accuracy of saved models on the recipe's validation split, rebuilt by the package in one new process:
# argv[1] is a JSON list of [output_dir, recipe args]; prints one result per model.
EVALUATE_SAVED_MODELS = """
import json
import sys

import torch
from transformers import AutoImageProcessor, HfArgumentParser, ViTForImageClassification

from hf_vit_scaling import DataArguments, attach_transforms, collate_image_batch, load_image_classification_data


def evaluate(output_dir, recipe_args):
    # The recipe's own data flags, parsed the way the recipe parses them (everything else is ignored).
    parser = HfArgumentParser(DataArguments, allow_abbrev=False)
    (data_args,) = parser.parse_args_into_dataclasses(recipe_args, return_remaining_strings=True)[:1]
    seed = int(recipe_args[recipe_args.index("--seed") + 1])
    model = ViTForImageClassification.from_pretrained(output_dir).eval()
    processor = AutoImageProcessor.from_pretrained(output_dir)
    size = model.config.image_size if isinstance(model.config.image_size, int) else model.config.image_size[0]
    data = load_image_classification_data(data_args, seed=seed)
    validation = attach_transforms(data, size, processor.image_mean, processor.image_std, data_args)["validation"]
    correct = 0
    with torch.no_grad():
        for start in range(0, len(validation), 32):
            batch = collate_image_batch([validation[i] for i in range(start, min(start + 32, len(validation)))])
            logits = model(pixel_values=batch["pixel_values"].to(model.dtype)).logits
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
    return {"accuracy": correct / len(validation), "n": len(validation), "dtype": str(model.dtype)}


print(json.dumps([evaluate(output_dir, args) for output_dir, args in json.loads(sys.argv[1])]))
"""


def evaluate_saved_models(tmp_path, runs: list[tuple]) -> list[dict]:
    """Top-1 accuracy of each saved model [(output_dir, recipe args)], in one new process."""
    runs = [[str(out), [*TINY_ARGS, *args]] for out, args in runs]
    return printed_json(run_script(tmp_path, "evaluate_saved_models.py", EVALUATE_SAVED_MODELS, json.dumps(runs)))


# --------------------------------------------------------------------------- 1. every ds_config, 2 processes


@pytest.fixture(scope="module")
def reloaded_scores(request, engine_runs, tmp_path_factory) -> dict:
    """{ds_config: top-1 of its saved model reloaded in a new process}: every tested config's run (`engine_runs`;
    `make test` tests the core ones, tests/tiers.py), then every saved model scored in one new process (one start-up
    for all, instead of one each)."""
    runs = {config: engine_runs[config.stem] for config in selected_params(request, "ds_config")}
    scores = evaluate_saved_models(tmp_path_factory.mktemp("reload"), [(out, args) for out, _, args in runs.values()])
    return dict(zip(runs, scores))


@pytest.mark.parametrize("ds_config", DS_CONFIG_FILES, ids=[p.stem for p in DS_CONFIG_FILES])
def test_every_ds_config_trains_saves_and_reloads(engine_runs, reloaded_scores, ds_config):
    out, _, _ = engine_runs[ds_config.stem]
    losses = logged_losses(out)
    assert len(losses) == ENGINE_STEPS, losses
    assert losses[-1] < losses[0], f"loss did not fall over {ENGINE_STEPS} steps: {losses}"

    for name in ("model.safetensors", "config.json", "preprocessor_config.json", "all_results.json", "README.md"):
        assert (out / name).is_file(), f"{name} missing from {sorted(p.name for p in out.iterdir())}"
    card = (out / "README.md").read_text(encoding="utf-8")
    assert ds_config.name in card
    assert "| world size | 2 |" in card
    assert f"| engine | DeepSpeed ZeRO-{config_stage(ds_config)}" in card  # the engine, the file in the ds_config row
    assert "## Training speed" in card and "| images/s per device |" in card  # from the run's throughput.json
    setup = throughput_setup(out)
    assert setup["world_size"] == 2
    assert setup["zero_stage"] == config_stage(ds_config)

    results, reloaded = read_json(out / "all_results.json"), reloaded_scores[ds_config]
    assert reloaded["n"] == results["eval_samples"] == 64
    assert math.isclose(reloaded["accuracy"], results["eval_accuracy"], abs_tol=1 / reloaded["n"] + 1e-9), (
        f"reloaded model scores {reloaded['accuracy']}, the run reported {results['eval_accuracy']}"
    )


# --------------------------------------------------------------------------- 2. ZeRO-3 + bf16: with every engine's
# bf16 in test_gpu_path_flags.py (2 processes under torchrun, bf16 weights saved, a pipeline loads them)


# --------------------------------------------------------------------------- 3. ZeRO-0 == plain Trainer


def loss_curve(output_dir) -> list[tuple[int, float, float]]:
    history = read_json(Path(output_dir) / "trainer_state.json")["log_history"]
    return [(e["step"], e["loss"], e["learning_rate"]) for e in history if "loss" in e]


def test_zero0_one_process_matches_plain_trainer(tmp_path):
    args = ["--max_steps", "15", "--logging_steps", "1", *SHORT_RUN]
    side_by_side(partial(run_checked, tmp_path / "zero0", "--ds_config", str(DS_CONFIGS / "zero0.json"), *args),
                 partial(run_checked, tmp_path / "plain", *args))  # fmt: skip
    assert throughput_setup(tmp_path / "zero0")["zero_stage"] == 0
    assert throughput_setup(tmp_path / "plain")["zero_stage"] is None

    zero0, plain = loss_curve(tmp_path / "zero0"), loss_curve(tmp_path / "plain")
    assert [s for s, _, _ in zero0] == [s for s, _, _ in plain] == list(range(1, 16))
    # Same schedule, step for step.
    assert [lr for _, _, lr in zero0] == pytest.approx([lr for _, _, lr in plain], rel=1e-9)
    # Observed: equal to ~1e-7 relative (fp32 summation order). A different optimizer setting, lr schedule or
    # missing gradient clipping (grad norms here are 2-4, clipped to 1.0) moves the losses by 1e-3 or more.
    assert [loss for _, loss, _ in zero0] == pytest.approx([loss for _, loss, _ in plain], rel=1e-5, abs=0)
    assert read_json(tmp_path / "zero0" / "all_results.json")["eval_loss"] == pytest.approx(
        read_json(tmp_path / "plain" / "all_results.json")["eval_loss"], rel=1e-5
    )


# --------------------------------------------------------------------------- 5. torchrun and deepspeed launchers


@pytest.mark.parametrize(
    "launcher,config",
    [("torchrun", "zero2.json"), ("deepspeed", "zero1.json")],
    ids=["torchrun-zero2", "deepspeed-zero1"],
)
def test_launchers_two_processes(tmp_path, launcher, config):
    out = tmp_path / "out"
    proc = run_checked(
        out,
        "--ds_config",
        str(DS_CONFIGS / config),
        "--max_steps",
        "20",
        "--logging_steps",
        "5",
        *SHORT_RUN,
        launcher=launcher,
        nproc=2,
    )
    setup = throughput_setup(out)
    assert (setup["world_size"], setup["zero_stage"]) == (2, config_stage(DS_CONFIGS / config))
    assert setup["global_batch_size"] == 32
    assert f"ZeRO-{setup['zero_stage']}, 2 process(es)" in proc.stdout
    assert len(logged_losses(out)) == 4


# --------------------------------------------------------------------------- 6. the recipe outside the repo


def test_recipe_copied_elsewhere_runs(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = Path(shutil.copy(RECIPE, elsewhere / "train_vit.py"))
    out = tmp_path / "out"
    ds_config = (DS_CONFIGS / "zero2.json").resolve()
    cmd = [
        *launcher_cmd("python", 1),
        script,
        "--output_dir",
        out,
        *TINY_ARGS,
        "--ds_config",
        ds_config,
        "--max_steps",
        "20",
        "--logging_steps",
        "5",
        *SHORT_RUN,
    ]
    proc = run(cmd, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert throughput_setup(out)["zero_stage"] == 2
    assert (out / "model.safetensors").is_file()
    assert "ZeRO-2, 1 process(es)" in proc.stdout


# --------------------------------------------------------------------------- 7. plain DDP


def test_plain_ddp_two_processes(engine_runs):
    out, proc, _ = engine_runs["ddp"]
    setup = throughput_setup(out)
    assert setup["world_size"] == 2
    assert setup["zero_stage"] is None
    assert setup["global_batch_size"] == 32
    assert "no DeepSpeed, 2 process(es)" in proc.stdout
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "| engine | none (plain Trainer) |" in card and "| world size | 2 |" in card


# --------------------------------------------------------------------------- 8. two nodes on one machine


def test_two_nodes_on_one_machine(tmp_path):
    """Two torchrun invocations, --nnodes 2 with node ranks 0 and 1 over loopback, one process each."""
    port = str(free_port())
    procs = []
    for node_rank in (0, 1):
        cmd = [
            *launch_command("torchrun", 1, port, nnodes=2, node_rank=node_rank),
            str(RECIPE),
            "--output_dir",
            str(tmp_path / f"node{node_rank}"),
            *TINY_ARGS,
            "--ds_config",
            str(DS_CONFIGS / "zero2.json"),
            "--max_steps",
            "10",
            "--eval_strategy",
            "no",
            "--max_eval_samples",
            "40",
        ]
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_env(), cwd=REPO
            )
        )
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    report = read_json(tmp_path / "node0" / "throughput.json")
    assert report["setup"]["num_nodes"] == 2 and report["setup"]["world_size"] == 2
    assert not (tmp_path / "node1" / "throughput.json").exists()  # only the main process writes


# --------------------------------------------------------------------------- 7. the minimal recipe


def test_minimal_recipe_trains_with_zero2_on_two_processes(tmp_path):
    """recipes/train_vit_minimal.py: the Trainer's own --deepspeed, torchrun, 2 processes over gloo."""
    flags = (
        "--model_preset vit-tiny-cpu --image_size 16 --per_device_train_batch_size 16 --learning_rate 2e-3 "
        "--max_steps 6 --report_to none --save_strategy no --disable_tqdm true --seed 0 --use_cpu true"
    ).split()
    script = RECIPE.parent / "train_vit_minimal.py"
    cmd = [*launcher_cmd("torchrun", 2), script, "--output_dir", tmp_path, "--deepspeed", DS_CONFIGS / "zero2.json"]
    proc = run([*cmd, *flags])
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = read_json(tmp_path / "eval_results.json")
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and "eval_top5_accuracy" in metrics  # digits: 10 classes
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "preprocessor_config.json").is_file()


# --------------------------------------------------------------------------- 8. metrics through the evaluate modules

CLASSES = ("ant", "bee", "cat", "dog", "eel", "fox", "gnu")  # more than 5: top5_accuracy is reported


def test_two_processes_report_metrics_from_the_modules_and_the_confusion_matrix(tmp_path):
    """An image folder of 7 classes, torchrun with 2 processes (each loads the shipped modules), EMA on: the metric
    names of before plus macro F1, and per class in eval_confusion_matrix.json (eval_ema_* for the EMA weights)."""
    out = tmp_path / "out"
    train = make_image_folder(tmp_path / "train", classes=CLASSES)
    val = make_image_folder(tmp_path / "val", classes=CLASSES)
    ds_config = str(DS_CONFIGS / "zero2.json")
    flags = ["--max_steps", "4", "--ema_decay", "0.9", "--eval_strategy", "no"]
    proc = run_checked(out, "--train_dir", train, "--validation_dir", val, "--ds_config", ds_config, *flags,
                       launcher="torchrun", nproc=2)  # fmt: skip
    results = read_json(out / "all_results.json")
    for prefix in ("eval", "eval_ema"):
        assert {f"{prefix}_accuracy", f"{prefix}_top5_accuracy", f"{prefix}_macro_f1"} <= set(results)
        report = read_json(out / f"{prefix}_confusion_matrix.json")
        assert report["labels"] == list(CLASSES) and report["images_per_class"] == [len(MIXED)] * len(CLASSES)
        matrix = report["confusion_matrix"]
        assert sum(map(sum, matrix)) == results["eval_samples"] == len(MIXED) * len(CLASSES)
        correct = sum(matrix[i][i] for i in range(len(CLASSES)))
        assert correct / results["eval_samples"] == results[f"{prefix}_accuracy"]
    assert "eval_macro_f1" in proc.stdout  # log_metrics prints it with the others
