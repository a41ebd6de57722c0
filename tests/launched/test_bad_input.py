"""Bad input: one clear message naming the flag or file and the fix, exit code 2, nothing passed off as a result.

The one-process cases share one fresh process that runs the recipe's main() per case; one case also runs as its own
`python recipes/train_vit.py` process; the refusals of --balance_batches and FSDP2 setups run 2 processes under
torchrun."""

import json

import pytest
from datasets import Value

from tests.helpers.builders import make_image_folder, make_saved_dataset
from tests.helpers.launchers import (
    FSDP_CONFIGS,
    RECIPE,
    REPO,
    TINY_ARGS,
    error_lines,
    fsdp_args,
    printed_json,
    run_recipe,
    run_script,
)

CASES = {
    "missing ds_config": (
        lambda t: ["--ds_config", str(t / "nope.json")],
        ["--ds_config", "nope.json", "no such file"],
    ),
    "ds_config not JSON": (
        lambda t: ["--ds_config", str(t / "bad.json")],
        ["--ds_config", "bad.json", "not valid JSON"],
    ),
    "unknown ZeRO stage": (lambda t: ["--ds_config", str(t / "stage5.json")], ["stage is 5", "stages 0, 1, 2 and 3"]),
    "ds_config batch conflicts": (
        lambda t: ["--ds_config", str(t / "conflict.json")],
        [
            "train_micro_batch_size_per_gpu=8",
            "per_device_train_batch_size=16",
            "gradient_accumulation_steps=4",
            '"auto"',
        ],
    ),
    "unknown dataset": (
        lambda t: ["--dataset_name", "no-such-user/no-such-dataset"],
        ["--dataset_name", "no-such-user/no-such-dataset", "Fix"],
    ),
    "unknown column": (
        lambda t: ["--dataset_name", make_saved_dataset(t / "ds", [0, 1, 0, 1]), "--label_column_name", "lbl"],
        ["--label_column_name 'lbl'", "columns: image, label"],
    ),
    "string labels": (
        lambda t: ["--dataset_name", make_saved_dataset(t / "ds", ["a", "b", "a", "b"], Value("string"))],
        ["'label'", "not an integer or ClassLabel"],
    ),
    "folder without images": (
        lambda t: ["--train_dir", make_image_folder(t / "imgs", classes=("cat",), empty=True)],
        ["--train_dir", "holds no images"],
    ),
    "corrupt image": (
        lambda t: [
            "--train_dir",
            make_image_folder(t / "imgs", [("RGB", (8, 8))], ("cat",), corrupt=["bad_photo.jpg"]),
            "--on_bad_image",
            "fail",
        ],
        ["bad_photo.jpg", "cannot be decoded", "--on_bad_image skip"],
    ),
    "fsdp_config without --fsdp": (
        lambda t: ["--fsdp_config", str(FSDP_CONFIGS / "fsdp2.json")],
        ["--fsdp_config is read only with --fsdp", "Fix: add --fsdp"],
    ),
    "missing fsdp_config": (
        lambda t: ["--fsdp", "--fsdp_config", str(t / "nope.json")],
        ["nope.json", "does not exist"],
    ),
    "fsdp_config not JSON": (
        lambda t: ["--fsdp", "--fsdp_config", str(t / "bad.json")],
        ["bad.json", "not valid JSON"],
    ),
    "fsdp version 1": (lambda t: ["--fsdp", "--fsdp_config", str(t / "v1.json")], ["FSDP2 only", '"version": 2']),
    "fsdp and ds_config": (
        lambda t: [*fsdp_args(), "--ds_config", "ds_configs/zero2.json"],
        ["--fsdp and --ds_config are two engines", "Fix: pass one"],
    ),
    "fsdp on one process": (lambda t: fsdp_args(), ["--fsdp", "this is 1 process", "Fix: launch 2 or more"]),
    "preset and checkpoint": (
        lambda t: ["--model_preset", "vit-b-16", "--model_name_or_path", "google/vit-base-patch16-224"],
        ["--model_preset", "--model_name_or_path", "exclusive"],
    ),
    "model_name_or_path missing folder": (
        lambda t: ["--model_name_or_path", str(t / "no" / "such" / "model")],
        ["--model_name_or_path", "does not exist", "not a Hub id", "Fix:"],
    ),
    "output_dir a file": (
        lambda t: ["--output_dir", str(t / "bad.json")],  # written by write_case_files
        ["--output_dir", "bad.json", "is a file, not a folder", "Fix:"],
    ),
    "num_train_epochs nan": (
        lambda t: ["--num_train_epochs", "nan"],
        ["--num_train_epochs must be a finite number, got nan", "Fix:"],
    ),
    "negative weight_decay": (
        lambda t: ["--weight_decay", "-0.1"],
        ["--weight_decay must be >= 0, got -0.1", "e.g. --weight_decay 0.05"],
    ),
    "unknown flag": (lambda t: ["--no_such_flag", "1"], ["--no_such_flag is not a flag", "--help"]),
}


# One fresh process runs the recipe's main() once per case (what `python recipes/train_vit.py ARGS` runs after its
# imports), so the refusals cost one start-up, not one each; `test_the_process_exits_2_with_one_error_line` checks
# the exit code and stderr of a real `python recipes/train_vit.py` process.
REFUSE_EACH = """
import contextlib
import importlib.util
import io
import json
import os
import sys

os.chdir(sys.argv[3])  # where `python recipes/train_vit.py` runs from: relative paths such as ds_configs/ resolve
spec = importlib.util.spec_from_file_location("train_vit", sys.argv[1])
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)
results = {}
for name, argv in json.loads(open(sys.argv[2]).read()).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = recipe.main(argv)
        except SystemExit as stop:
            code = stop.code
        except Exception as crash:  # a traceback where one error line belongs
            code = f"crashed: {crash!r}"
    results[name] = {"code": code, "stderr": err.getvalue()}
print(json.dumps(results))
"""


def write_case_files(folder) -> None:
    (folder / "bad.json").write_text("{ this is not json")
    (folder / "v1.json").write_text(json.dumps({"version": 1, "transformer_layer_cls_to_wrap": ["ViTLayer"]}))
    (folder / "stage5.json").write_text(json.dumps({"zero_optimization": {"stage": 5}}))
    (folder / "conflict.json").write_text(
        json.dumps(
            {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}}
        )
    )


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """{case: (result, output_dir, case folder)}: every case of CASES refused in one fresh process."""
    root = tmp_path_factory.mktemp("bad_input")
    argvs, folders = {}, {}
    for i, (name, (make_args, _)) in enumerate(CASES.items()):
        folder = root / f"case{i}"
        folder.mkdir()
        write_case_files(folder)
        folders[name] = folder
        argvs[name] = [
            "--output_dir",
            str(folder / "out"),
            *TINY_ARGS,
            *map(str, make_args(folder)),
            "--max_steps",
            "2",
        ]
    (root / "cases.json").write_text(json.dumps(argvs))
    results = printed_json(run_script(root, "refuse_each.py", REFUSE_EACH, RECIPE, root / "cases.json", REPO))
    return {name: (results[name], folders[name] / "out") for name in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_clearly(refusals, case):
    result, out = refusals[case]
    _, expected = CASES[case]
    assert result["code"] == 2, result
    errors = error_lines(result["stderr"])
    assert len(errors) == 1, result["stderr"][-3000:]
    for text in expected:
        assert text in errors[0], errors[0]
    assert "Traceback" not in result["stderr"]
    written = list(out.rglob("*")) if out.exists() else []
    assert written == [], written


def test_the_process_exits_2_with_one_error_line(tmp_path):
    """The same refusal as a real process: exit status 2, one `error:` line, no traceback, nothing written."""
    out = tmp_path / "out"
    proc = run_recipe(out, "--ds_config", str(tmp_path / "nope.json"), "--max_steps", "2", check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "nope.json" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists() or list(out.rglob("*")) == []


@pytest.mark.distributed
@pytest.mark.parametrize(
    "args, flag, expected",
    [
        (["--ds_config", "ds_configs/zero3.json", "--balance_batches", "1,2"], "--balance_batches",
         ["ZeRO-3", "Fix: use ZeRO-2"]),
        (["--balance_batches", "1,2,3"], "--balance_batches",
         ["--balance_batches '1,2,3'", "one positive share per rank (2 ranks)"]),
        ([*fsdp_args(), "--ema_decay", "0.99"], "--fsdp", ["--ema_decay", "only its shard", "Fix: drop --ema_decay"]),
        ([*fsdp_args(), "--balance_batches", "calibrate"], "--fsdp", ["calibrate", "Fix: pass explicit shares"]),
        (fsdp_args("fsdp2_offload"), "--fsdp", ["cpu_offload", "no accelerator", "fsdp2.json"]),
    ],
    ids=["zero3-balance", "share-count", "fsdp2-ema", "fsdp2-calibrate", "fsdp2-offload-without-accelerator"],
)  # fmt: skip
def test_two_process_setups_are_refused_before_loading(tmp_path, args, flag, expected):
    out = tmp_path / "out"
    proc = run_recipe(out, *args, "--max_steps", "2", launcher="torchrun", nproc=2, check=False)
    assert proc.returncode != 0
    errors = error_lines(proc.stderr, prefix=f"error: {flag}")
    assert len(errors) == 1, proc.stderr[-3000:]  # printed once, by the main process
    for text in expected:
        assert text in errors[0], errors[0]
    # torchrun prints its own ChildFailedError traceback for the exit code 2; the recipe itself must not crash.
    assert 'train_vit.py", line' not in proc.stderr
    assert not out.exists() or list(out.rglob("*")) == []
