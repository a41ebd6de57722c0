"""recipes/plan.py: bad input gives one `error: ... Fix: ...` line and exit status 2; --json prints parseable JSON."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.planning.plan_arguments import parse_memory_size, resolve_bandwidth
from hf_vit_scaling.planning.shapes import GiB

REPO = Path(__file__).resolve().parents[3]
PLAN = REPO / "recipes" / "plan.py"
BASE = ["--model_preset", "vit-l-16", "--image_size", "224", "--gpus", "8", "--gpu_memory", "40GB"]


def load_recipe():
    spec = importlib.util.spec_from_file_location("plan_recipe", PLAN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_plan(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, str(PLAN), *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


def test_bad_memory_exits_2_with_one_error_line():
    proc = run_plan(*BASE[:-2], "--gpu_memory", "abc", "--per_device_train_batch_size", "64")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --gpu_memory 'abc'") and "Fix:" in lines[0]
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
        (["--per_device_train_batch_size", "-4"], "--per_device_train_batch_size"),
        (["--gpus", "0"], "--gpus"),
        (["--nodes", "0"], "--nodes"),
        (["--sequence_parallel_size", "3"], "--sequence_parallel_size"),
        (["--image_size", "200"], "--image_size"),
        (["--interconnect", "warp-drive"], "--interconnect"),
        (["--network", "0"], "--network"),
        (["--memory_margin", "1.5"], "--memory_margin"),
        (["--gpu_name", "Voodoo3", "--precision", "bf16"], "--gpu_name"),
        (["--patch_dropout", "1.0"], "--patch_dropout"),
        (["--gradient_checkpointing", "--selective_checkpointing"], "--selective_checkpointing"),
    ],
)
def test_bad_values_exit_2(args, flag, capsys):
    recipe = load_recipe()
    assert recipe.main([*BASE, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and flag in err[0] and "Fix:" in err[0]


def test_json_output_parses():
    proc = run_plan(
        *BASE,
        "--per_device_train_batch_size",
        "64",
        "--nodes",
        "4",
        "--interconnect",
        "nvlink3",
        "--network",
        "ib-hdr",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["version"] == 1
    assert report["settings"]["world_size"] == 32
    assert [o["engine"] for o in report["options"]] == [
        "ddp",
        "zero1",
        "zero2",
        "zero2_offload",
        "zero3",
        "zero3_offload",
        "fsdp2",
        "hsdp",  # more than one node: FSDP2 sharded in the node, replicated across nodes
    ]
    for option in report["options"]:
        memory, phases = option["memory"], option["memory"]["phases"]
        moments = ("forward", "backward_start", "backward_end", "step")
        assert memory["peak"] == phases["static"] + max(phases[moment] for moment in moments)
        assert option["speed"]["step_s"] > 0 and option["max_batch"] >= 0
    assert report["recommended"] == "ddp" and report["reason"]
    # Named links and the default TFLOP/s are assumptions, and the JSON says so.
    assert {"achievable_tflops", "interconnect", "network", "host_link"} <= set(report["inputs"]["assumed"])


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        load_recipe().main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--gpu_memory", "--interconnect", "--network", "--sequence_parallel_size", "--json"):
        assert flag in out


def test_table_names_the_recommendation(capsys):
    recipe = load_recipe()
    assert recipe.main([*BASE, "--per_device_train_batch_size", "64"]) == 0
    out = capsys.readouterr().out
    assert "Recommended: DDP" in out and "Why:" in out
    for name in ("ZeRO-1", "ZeRO-2 + optimizer offload", "ZeRO-3 + param/optimizer offload", "FSDP2 full shard"):
        assert name in out


def test_parse_memory_size_and_bandwidth():
    assert parse_memory_size("40GB") == 40 * GiB
    assert parse_memory_size("16384MB") == 16 * GiB
    assert parse_memory_size("80") == 80 * GiB
    assert parse_memory_size("1.5TiB") == int(1.5 * 1024 * GiB)
    for bad in ("abc", "40XB", "", "-4GB", "0GB"):
        with pytest.raises(UserInputError, match="Fix:"):
            parse_memory_size(bad)
    assert resolve_bandwidth("nvlink3", {"nvlink3": 230.0}, "--interconnect") == 230.0
    assert resolve_bandwidth("12.5", {}, "--interconnect") == 12.5
    for bad in ("fast", "0", "-3", "nan"):
        with pytest.raises(UserInputError, match="Fix:"):
            resolve_bandwidth(bad, {"nvlink3": 230.0}, "--interconnect")


def test_mae_plan_counts_the_encoder_on_visible_tokens_and_the_decoder(capsys):
    """--mae: the preset's encoder on 1 + 49 tokens and the paper's decoder on 197 (ViT-B/16 at 0.75); the plan's
    FLOPs are the MAE formula's, its memory holds the decoder's weights; bad --mae values give one error line."""
    from hf_vit_scaling.models.flops import mae_forward_macs_per_image
    from hf_vit_scaling.planning.shapes import MaeShape

    recipe = load_recipe()
    assert recipe.main(["--mae", "--model_preset", "vit-b-16", "--gpus", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    shape = report["settings"]["shape"]
    assert (shape["num_parameters"], shape["decoder_hidden_size"], shape["mask_ratio"]) == (111_907_840, 512, 0.75)
    mae = MaeShape(**{k: v for k, v in shape.items() if k not in ("tokens", "num_parameters")})
    assert report["settings"]["train_flops_per_image"] == 6 * mae_forward_macs_per_image(mae) == 6 * 9_781_133_312
    assert recipe.main(["--mae", "--model_preset", "vit-b-16", "--gpus", "2"]) == 0
    assert "MAE: 111.9 M parameters, encoder on 50 of 197 tokens (mask ratio 0.75), decoder 512 wide x 8" in (
        capsys.readouterr().out)  # fmt: skip
    for flags, message in ((["--mask_ratio", "0"], "--mask_ratio must be in (0, 1)"),
                           (["--decoder_hidden_size", "-8"], "--decoder_hidden_size must be >= 1")):  # fmt: skip
        assert recipe.main(["--mae", *flags]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {message}") and "Fix:" in line
