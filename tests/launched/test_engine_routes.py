"""Every route a user takes to an engine trains the same run: accelerate's DeepSpeed plugin (a config file naming a
DeepSpeed JSON, or its own `--use_deepspeed --zero_stage 2`), a bare JSON of the user's own through --ds_config, and
accelerate's FSDP plugin, each against the recipe's own route on the same 2-process run (`engine_runs`: ZeRO-2 from
--ds_config ds_configs/zero2.json under accelerate; FSDP2 from --fsdp --fsdp_config fsdp_configs/fsdp2.json). Each
cell checks what the run says it was (throughput.json's engine, stage and route, the DeepSpeed values set, the model
card's engine row, the done line) and that its losses at every step and its final weights are the reference's.
The minimal recipe runs under plain `python` with a DeepSpeed config."""

import pytest
import torch
from safetensors.torch import load_file

from hf_vit_scaling.parallel.launch import accelerate_deepspeed_config
from tests.helpers.engine_runs import ENGINE_RUN_ARGS
from tests.helpers.launchers import (
    DS_CONFIGS,
    RECIPE,
    REPO,
    TINY_ARGS,
    free_port,
    launcher_cmd,
    losses_by_step,
    read_json,
    run,
)

pytestmark = pytest.mark.distributed

ACCELERATE = str(launcher_cmd("accelerate", 2)[0])
ZERO2 = str(DS_CONFIGS / "zero2.json")
# ZeRO-2's routes: (launcher's argv up to the script, the recipe's engine flags, the route the run must report)
ROUTES = {
    "accelerate_config_file": (
        lambda tmp: [ACCELERATE, "launch", "--config_file", accelerate_config(tmp)],
        [],
        f"accelerate's deepspeed_config_file {ZERO2}",
    ),
    "accelerate_use_deepspeed": (
        lambda tmp: [ACCELERATE, "launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "2",
                     "--main_process_port", str(free_port())],
        [],
        "accelerate's DeepSpeed plugin (zero_stage 2)",
    ),
    "bare_json": (
        lambda tmp: launcher_cmd("accelerate", 2),
        ["--ds_config", "{bare}"],
        "--ds_config {bare}",
    ),
}  # fmt: skip


def accelerate_config(tmp_path) -> str:
    path = tmp_path / "accelerate_deepspeed.yaml"
    path.write_text(accelerate_deepspeed_config(ZERO2, free_port(), 2), encoding="utf-8")
    return str(path)


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("route", list(ROUTES))
def test_each_deepspeed_route_trains_the_ds_config_route_s_run(tmp_path, engine_runs, route):
    """Fails if a route is not the engine it names to the project (accelerate's routes reported `plain Trainer
    (DDP)`, "no DeepSpeed", card `none (plain Trainer)`, no model-sized values) or trains differently; the bare JSON
    stopped in DeepSpeed ("Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")."""
    reference, _, _ = engine_runs["zero2"]
    bare = tmp_path / "bare.json"
    bare.write_text('{"zero_optimization": {"stage": 2}}', encoding="utf-8")
    launcher, engine_flags, expected_route = ROUTES[route]
    out = tmp_path / "run"
    flags = [flag.format(bare=bare) for flag in engine_flags]
    proc = run([*launcher(tmp_path), RECIPE, "--output_dir", out, *TINY_ARGS, *ENGINE_RUN_ARGS, *flags])
    assert proc.returncode == 0, f"{route}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    setup, expected = read_json(out / "throughput.json")["setup"], read_json(reference / "throughput.json")["setup"]
    assert (setup["engine"], setup["zero_stage"]) == ("deepspeed", 2)
    assert setup["engine_route"] == expected_route.format(bare=bare)
    model_sized = {key: value for key, value in setup["deepspeed_resolved"].items() if "zero_optimization" in key}
    assert model_sized == {k: v for k, v in expected["deepspeed_resolved"].items() if "zero_optimization" in k}
    assert setup["deepspeed_fast_paths"] == expected["deepspeed_fast_paths"]
    assert "| engine | DeepSpeed ZeRO-2 |" in (out / "README.md").read_text(encoding="utf-8")
    assert "ZeRO-2, 2 process(es))" in proc.stdout.strip().splitlines()[-1]

    assert losses_by_step(out) == losses_by_step(reference)
    got, want = weights(out), weights(reference)
    assert got.keys() == want.keys()
    assert [name for name in want if not torch.equal(got[name], want[name])] == []


@pytest.mark.extended
def test_accelerate_s_fsdp_plugin_trains_the_fsdp_flag_s_run(tmp_path, engine_runs):
    """`accelerate launch --use_fsdp --fsdp_version 2 ...` was the plain Trainer (DDP) to the project."""
    reference, _, _ = engine_runs["fsdp2"]
    out = tmp_path / "run"
    accelerate = [ACCELERATE, "launch", "--use_fsdp", "--fsdp_version", "2", "--fsdp_transformer_layer_cls_to_wrap",
                  "ViTLayer", "--fsdp_state_dict_type", "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true",
                  "--num_processes", "2", "--main_process_port", str(free_port())]  # fmt: skip
    proc = run([*accelerate, RECIPE, "--output_dir", out, *TINY_ARGS, *ENGINE_RUN_ARGS])
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    setup = read_json(out / "throughput.json")["setup"]
    assert (setup["engine"], setup["engine_route"]) == ("fsdp", "accelerate's FSDP plugin (fsdp_version 2)")
    assert "FSDP2, 2 process(es))" in proc.stdout.strip().splitlines()[-1]
    got, want = losses_by_step(out), losses_by_step(reference)
    assert got.keys() == want.keys() and all(abs(got[s] - want[s]) <= 1e-5 for s in want), (got, want)


def test_the_minimal_recipe_runs_deepspeed_under_plain_python(tmp_path):
    """`python recipes/train_vit_minimal.py --deepspeed ...` ended in `ModuleNotFoundError: No module named
    'mpi4py'` (DeepSpeed's MPI discovery without a launcher); a bare JSON in DeepSpeed's batch assertion."""
    bare = tmp_path / "bare.json"
    bare.write_text('{"zero_optimization": {"stage": 3}}', encoding="utf-8")
    script = REPO / "recipes" / "train_vit_minimal.py"
    for name, config in (("zero3", DS_CONFIGS / "zero3.json"), ("bare", bare)):
        out = tmp_path / name
        cmd = [*launcher_cmd("python", 1), script, "--deepspeed", config, "--output_dir", out, "--use_cpu", "true"]
        tiny = "--model_preset vit-tiny-cpu --image_size 16 --per_device_train_batch_size 16 --max_steps 3"
        proc = run([*cmd, *tiny.split(), "--report_to", "none", "--save_strategy", "no"])
        assert proc.returncode == 0, f"{name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        assert (out / "model.safetensors").is_file() and read_json(out / "eval_results.json")["eval_loss"] > 0
