"""Bad input: one clear message naming the flag or file and the fix, exit code 2, nothing passed off as a result.

The one-process cases share one fresh process that runs the recipe's main() per case, and one case also runs as its
own `python recipes/train_vit.py` process (the exit status); the refusals of --balance_batches and FSDP2 setups share
one torchrun launch of 2 processes, main() per case on each rank (the message comes once, from the main process)."""

import json
import sys

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
    read_json,
    run,
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
    "negative bucket size": (
        lambda t: ["--ds_config", str(t / "negative_bucket.json")],
        ["--ds_config", "zero_optimization.reduce_bucket_size = -5", "greater than 0", '"auto"'],
    ),
    "unknown compile backend": (
        lambda t: ["--torch_compile", "true", "--torch_compile_backend", "nope"],
        ["--torch_compile_backend 'nope'", "inductor"],
    ),
    "unknown compile mode": (
        lambda t: ["--torch_compile", "true", "--torch_compile_mode", "fastest"],
        ["--torch_compile_mode 'fastest'", "max-autotune-no-cudagraphs"],
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
    "config file with a YAML syntax error": (
        lambda t: [str(t / "bad.yaml")],  # the config file comes first, the case's flags after it
        ["bad.yaml", "is not valid YAML", "line 2", "Fix: correct the file"],
    ),
    "config file holding a list": (lambda t: [str(t / "list.yaml")], ["list.yaml", "not a mapping of flag names"]),
    "negative dataloader_num_workers": (
        lambda t: ["--dataloader_num_workers", "-1"],
        ["--dataloader_num_workers must be >= 0, got -1", "Fix:"],
    ),
    "output_dir where no folder can be made": (
        lambda t: ["--output_dir", "/proc/nope/out"],
        ["--output_dir '/proc/nope/out' cannot be made", "Fix:"],
    ),
    "negative eval_steps": (
        lambda t: ["--eval_strategy", "steps", "--eval_steps", "-3"],
        ["--eval_steps must be above 0", "got -3", "Fix:"],
    ),
    "negative save_steps": (
        lambda t: ["--save_strategy", "steps", "--save_steps", "-2"],
        ["--save_steps must be above 0", "got -2", "Fix:"],
    ),
    "negative logging_steps": (lambda t: ["--logging_steps", "-1"], ["--logging_steps must be above 0", "got -1"]),
    "distillation flag without a teacher": (
        lambda t: ["--distillation_tau", "2"],
        ["--distillation_tau without --teacher_model", "Fix: add --teacher_model"],
    ),
    "teacher folder missing": (
        lambda t: ["--teacher_model", str(t / "no_teacher")],
        ["--teacher_model", "no_teacher", "does not exist"],
    ),
    "teacher without weights": (
        lambda t: ["--teacher_model", save_teacher(t / "teacher", [str(i) for i in range(10)], weights=False)],
        ["--teacher_model", "could not be read", "save_pretrained"],
    ),
    "teacher with other classes": (
        lambda t: ["--teacher_model", save_teacher(t / "teacher", [f"c{i}" for i in range(10)])],
        ["teacher ['c0', 'c1'", "data ['0', '1'", "Fix:"],
    ),
    "teacher trained on other rows": (
        lambda t: ["--teacher_model", save_teacher(t / "teacher_rows", [str(i) for i in range(10)], drawn_by=7)],
        ["--teacher_model", "100 of the 1797 training images of sklearn-digits, drawn by seed 7", "Fix: train"],
    ),
}


def save_teacher(folder, labels: list[str], weights: bool = True, drawn_by: int | None = None) -> str:
    """A tiny ResNet classifier with these classes, saved (or only its config) as a --teacher_model folder; with
    `drawn_by`, its model_card.json says the recipe trained it on 100 digits drawn by that seed."""
    import json

    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1], layer_type="basic",
                          num_labels=len(labels), id2label=dict(enumerate(labels)),
                          label2id={name: i for i, name in enumerate(labels)})  # fmt: skip
    if weights:
        ResNetForImageClassification(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    if drawn_by is not None:
        selection = {"source": "sklearn-digits", "rows": 100, "of": 1797, "seed": drawn_by}
        (folder / "model_card.json").write_text(json.dumps({"train_selection": selection}))
    return str(folder)


# One launch of fresh process(es) runs every case's script as `python SCRIPT ARGS` would (runpy as `__main__`,
# sys.argv set, from the repository root, so relative paths such as ds_configs/ resolve), so the refusals cost one
# start-up, not one each; each refusal happens before the script's work, so a case leaves nothing behind for the next.
# `test_the_process_exits_2_with_one_error_line` and `test_a_script_s_refusal_is_its_process_s_exit_status_2` check
# the exit status and stderr of a real process.
RUN_EACH = """
import contextlib
import io
import json
import os
import runpy
import sys
import traceback

repo, cases, results_path = sys.argv[1:4]
os.chdir(repo)
results = {}
for name, argv in json.loads(open(cases).read()).items():
    err = io.StringIO()
    sys.argv = list(argv)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code
        except Exception:  # a traceback where one error line belongs
            code = "crashed"
            err.write(traceback.format_exc())
    results[name] = {"code": code, "stderr": err.getvalue()}
with open(results_path.format(rank=os.environ.get("RANK", "0")), "w") as f:  # one file per rank
    json.dump(results, f)

from hf_vit_scaling.parallel.distributed import shutdown_distributed  # noqa: E402

shutdown_distributed()  # a case may have started the process group; gloo must be done before exit
"""


def run_each(root, argvs: dict[str, list[str]], nproc: int = 1) -> list[dict]:
    """[{case: {"code": exit status, "stderr": what it printed}} per rank] of every case's argv (a script and its
    arguments), all run in one launch of `nproc` fresh processes (`RUN_EACH`)."""
    (root / "cases.json").write_text(json.dumps(argvs))
    results = str(root / "results.rank{rank}.json")
    launcher = "torchrun" if nproc > 1 else "python"
    run_script(root, "run_each.py", RUN_EACH, REPO, root / "cases.json", results, launcher=launcher, nproc=nproc)
    return [read_json(results.format(rank=rank)) for rank in range(nproc)]


def write_case_files(folder) -> None:
    (folder / "bad.json").write_text("{ this is not json")
    (folder / "bad.yaml").write_text("model_preset: vit-tiny-cpu\nlearning_rate: [1e-3\n")
    (folder / "list.yaml").write_text("- learning_rate\n- 1e-3\n")
    (folder / "v1.json").write_text(json.dumps({"version": 1, "transformer_layer_cls_to_wrap": ["ViTLayer"]}))
    (folder / "stage5.json").write_text(json.dumps({"zero_optimization": {"stage": 5}}))
    (folder / "negative_bucket.json").write_text(
        json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": -5}})
    )
    (folder / "conflict.json").write_text(
        json.dumps(
            {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}}
        )
    )


def refuse_each(root, cases: dict, nproc: int = 1) -> tuple[list[dict], dict]:
    """([{case: result} per rank], {case: output dir}): every case's recipe command (made in its own folder) run in
    one launch of `nproc` fresh processes (`run_each`)."""
    argvs, outs = {}, {}
    for i, (name, make_args) in enumerate(cases.items()):
        folder = root / f"case{i}"
        folder.mkdir()
        write_case_files(folder)
        outs[name] = folder / "out"
        args = list(map(str, make_args(folder)))
        config_file = args[:1] if args and args[0].endswith((".yaml", ".json")) else []  # first, as users pass it
        argvs[name] = [str(RECIPE.relative_to(REPO)), *config_file, "--output_dir", str(outs[name]), *TINY_ARGS,
                       *args[len(config_file):], "--max_steps", "2"]  # fmt: skip
    return run_each(root, argvs, nproc), outs


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """{case: (result, output_dir)}: every case of CASES refused in one fresh process."""
    (results,), outs = refuse_each(tmp_path_factory.mktemp("bad_input"), {n: make for n, (make, _) in CASES.items()})
    return {name: (results[name], outs[name]) for name in CASES}


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


TWO_PROCESS_CASES = {
    "zero3-balance": (["--ds_config", "ds_configs/zero3.json", "--balance_batches", "1,2"], "--balance_batches",
                      ["ZeRO-3", "Fix: use ZeRO-2"]),
    "share-count": (["--balance_batches", "1,2,3"], "--balance_batches",
                    ["--balance_batches '1,2,3'", "one positive share per rank (2 ranks)"]),
    "fsdp2-ema": ([*fsdp_args(), "--ema_decay", "0.99"], "--fsdp", ["--ema_decay", "only its shard",
                                                                   "Fix: drop --ema_decay"]),
    "fsdp2-calibrate": ([*fsdp_args(), "--balance_batches", "calibrate"], "--fsdp",
                        ["calibrate", "Fix: pass explicit shares"]),
    "fsdp2-offload-without-accelerator": (fsdp_args("fsdp2_offload"), "--fsdp",
                                          ["cpu_offload", "no accelerator", "fsdp2.json"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def two_process_refusals(tmp_path_factory):
    """Every case of TWO_PROCESS_CASES refused by the recipe's main() on each of 2 torchrun processes."""
    cases = {name: (lambda folder, args=args: args) for name, (args, _, _) in TWO_PROCESS_CASES.items()}
    return refuse_each(tmp_path_factory.mktemp("two_process"), cases, nproc=2)


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(TWO_PROCESS_CASES))
def test_two_process_setups_are_refused_before_loading(two_process_refusals, case):
    (rank0, rank1), outs = two_process_refusals
    _, flag, expected = TWO_PROCESS_CASES[case]
    assert rank0[case]["code"] == rank1[case]["code"] == 2, (rank0[case], rank1[case])
    errors = error_lines(rank0[case]["stderr"] + rank1[case]["stderr"], prefix=f"error: {flag}")
    assert len(errors) == 1 and error_lines(rank1[case]["stderr"]) == [], rank1[case]  # once, by the main process
    for text in expected:
        assert text in errors[0], errors[0]
    assert "Traceback" not in rank0[case]["stderr"] + rank1[case]["stderr"]
    assert not outs[case].exists() or list(outs[case].rglob("*")) == []


# The other scripts' siblings of the cases above: an output folder that cannot be made, a count below its floor.
SCRIPT_CASES = {
    "prepare_shards output_dir in /proc": (
        ["recipes/prepare_shards.py", "--output_dir", "/proc/nope/shards", "--size", "16"],
        ["--output_dir '/proc/nope/shards' cannot be made", "Fix:"],
    ),
    "scaling_study output_dir in /proc": (
        ["recipes/scaling_study.py", "--study", "batch", "--output_dir", "/proc/nope/study"],
        ["--output_dir '/proc/nope/study' cannot be made", "Fix:"],
    ),
    "scaling_study negative global batch": (
        ["recipes/scaling_study.py", "--study", "strong", "--output_dir", "OUT", "--global_batch_size", "-64"],
        ["--global_batch_size must be >= 1, got -64", "Fix:"],
    ),
    "scaling_study zero weak fraction": (
        ["recipes/scaling_study.py", "--study", "weak", "--output_dir", "OUT", "--weak_fraction_per_process", "0"],
        ["--weak_fraction_per_process must be in (0, 1]", "Fix:"],
    ),
    "medical prepare negative near-duplicate threshold": (
        ["recipes/medical_brain_mri/prepare.py", "--output_dir", "OUT", "--near_duplicate_threshold", "-1"],
        ["--near_duplicate_threshold must be in [0, 128]", "Fix:"],
    ),
    "medical prepare fractions not summing to 1": (
        ["recipes/medical_brain_mri/prepare.py", "--output_dir", "OUT", "--split_fractions", "0.7", "0.7", "0.1"],
        ["--split_fractions must be three fractions", "Fix:"],
    ),
    "medical prepare output_dir in /proc": (
        ["recipes/medical_brain_mri/prepare.py", "--output_dir", "/proc/nope/br35h"],
        ["--output_dir '/proc/nope/br35h' cannot be made", "Fix:"],
    ),
    "medical evaluate zero bootstrap resamples": (
        ["recipes/medical_brain_mri/evaluate_model.py", "--model_dir", "OUT", "--bootstrap_resamples", "0"],
        ["--bootstrap_resamples must be >= 1, got 0", "Fix:"],
    ),
    "medical evaluate negative batch size": (
        ["recipes/medical_brain_mri/evaluate_model.py", "--model_dir", "OUT", "--batch_size", "-8"],
        ["--batch_size must be >= 1, got -8", "Fix:"],
    ),
    "fashion prepare output_dir in /proc": (
        ["recipes/fashion_mnist/prepare.py", "--output_dir", "/proc/nope/fm", "--source", "OUT"],
        ["--output_dir '/proc/nope/fm' cannot be made", "Fix:"],
    ),
}


def out_of(folder, argv: list[str]) -> list[str]:
    return [str(folder / "out") if arg == "OUT" else arg for arg in argv]


@pytest.fixture(scope="module")
def script_refusals(tmp_path_factory):
    """{case: (result, its out folder)} for every case of SCRIPT_CASES and every script's unknown flag."""
    root = tmp_path_factory.mktemp("scripts")
    argvs, outs = {}, {}
    cases = {**{name: argv for name, (argv, _) in SCRIPT_CASES.items()},
             **{f"unknown flag: {script}": [script, *args, "--no_such_flag", "1"]
                for script, args in SCRIPT_REQUIRED_ARGS.items()}}  # fmt: skip
    for i, (name, argv) in enumerate(cases.items()):
        outs[name] = root / f"case{i}"
        outs[name].mkdir()
        argvs[name] = out_of(outs[name], argv)
    (results,) = run_each(root, argvs)
    return {name: (results[name], outs[name] / "out") for name in cases}


@pytest.mark.parametrize("case", list(SCRIPT_CASES))
def test_the_other_scripts_refuse_bad_input_with_one_error_line(script_refusals, case):
    result, out = script_refusals[case]
    _, expected = SCRIPT_CASES[case]
    assert result["code"] == 2, result["stderr"][-3000:]
    (line,) = error_lines(result["stderr"])
    assert all(text in line for text in expected), line
    assert "Traceback" not in result["stderr"]
    assert not out.exists() or list(out.iterdir()) == []


# The recipe folders' shell scripts: their settings come from the environment and config files, checked before the
# first step (recipes/common.sh: require_count, require_whole, require_config, require_writable).
SHELL_CASES = {
    "medical run.sh negative processes": (
        "recipes/medical_brain_mri/run.sh",
        {"NUM_PROCESSES": "-2"},
        ["NUM_PROCESSES=-2 is not a whole number"],
    ),
    "medical run.sh config with a syntax error": (
        "recipes/medical_brain_mri/run.sh",
        {"CONFIG": "BAD_YAML"},
        ["cannot be read as YAML", "line 3"],
    ),
    "medical run.sh missing teacher config": (
        "recipes/medical_brain_mri/run.sh",
        {"TEACHER_CONFIG": "OUT/nope.yaml"},
        ["TEACHER_CONFIG=", "not a file"],
    ),
    "medical run.sh output_dir that cannot be made": (
        "recipes/medical_brain_mri/run.sh",
        {"CONFIG": "PROC_YAML"},
        ["output_dir in", "cannot be made or written"],
    ),
    "fashion distil.sh zero processes": (
        "recipes/fashion_mnist/distil.sh",
        {"NUM_PROCESSES": "0"},
        ["NUM_PROCESSES=0 is not a whole number"],
    ),
    "fashion distil.sh negative seed": (
        "recipes/fashion_mnist/distil.sh",
        {"SEED": "-1"},
        ["SEED=-1 is not a whole number"],
    ),
    "fashion distil.sh student config with a syntax error": (
        "recipes/fashion_mnist/distil.sh",
        {"STUDENT_CONFIG": "BAD_YAML"},
        ["STUDENT_CONFIG=", "cannot be read"],
    ),
    "fashion distil.sh output root that cannot be made": (
        "recipes/fashion_mnist/distil.sh",
        {"OUTPUT_ROOT": "/proc/nope"},
        ["OUTPUT_ROOT=/proc/nope cannot be made"],
    ),
}


@pytest.mark.parametrize("case", list(SHELL_CASES))
def test_the_folder_scripts_refuse_bad_settings_before_any_step(tmp_path, case):
    script, settings, expected = SHELL_CASES[case]
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "bad.yaml").write_text("output_dir: x\nimage_size: [16,\n")
    (tmp_path / "proc.yaml").write_text(
        "train_dir: OUT/br35h/train\noutput_dir: /proc/nope/model\n".replace("OUT", str(out))
    )
    paths = {"BAD_YAML": str(tmp_path / "bad.yaml"), "PROC_YAML": str(tmp_path / "proc.yaml")}
    env = {key: paths.get(value, value.replace("OUT", str(out))) for key, value in settings.items()}
    proc = run(["bash", script], timeout=120, PYTHON=sys.executable, **env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = error_lines(proc.stderr)
    assert all(text in line for text in expected) and "Fix:" in line, line
    assert "==" not in proc.stdout  # no step started ("== prepare", "== teacher")
    assert list(out.iterdir()) == []


# Every script under recipes/ with a `__main__`, and the arguments it needs before an unknown flag can be the first
# thing it refuses (a required flag missing is refused first).
SCRIPT_REQUIRED_ARGS = {
    "recipes/train_vit.py": [],
    "recipes/pretrain_mae.py": [],
    "recipes/train_vit_minimal.py": [],
    "recipes/plan.py": [],
    "recipes/scaling_study.py": ["--study", "batch", "--output_dir", "OUT"],
    "recipes/prepare_shards.py": ["--output_dir", "OUT"],
    "recipes/fashion_mnist/prepare.py": ["--output_dir", "OUT"],
    "recipes/medical_brain_mri/prepare.py": ["--output_dir", "OUT"],
    "recipes/medical_brain_mri/evaluate_model.py": ["--model_dir", "OUT"],
    "recipes/medical_brain_mri/imbalance_demo.py": ["subsample"],
}


def test_every_recipe_script_is_covered_by_the_unknown_flag_test():
    """Fails if a script is added under recipes/ without joining SCRIPT_REQUIRED_ARGS (its unknown flags untested)."""
    scripts = {
        str(path.relative_to(REPO))
        for path in (REPO / "recipes").rglob("*.py")
        if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
    }
    assert scripts == set(SCRIPT_REQUIRED_ARGS)


@pytest.mark.parametrize("script", list(SCRIPT_REQUIRED_ARGS))
def test_every_script_refuses_an_unknown_flag_with_one_line(script_refusals, script):
    """An unknown flag: exit 2, exactly one `error:` line naming it and the script's --help, no traceback, no usage
    text, nothing written. Fails if a script parses with a bare HfArgumentParser (a ValueError traceback), a plain
    argparse.ArgumentParser (usage text and `prog: error:`), or lets the flag through."""
    result, out = script_refusals[f"unknown flag: {script}"]
    assert result["code"] == 2, result["stderr"][-3000:]
    (line,) = error_lines(result["stderr"])
    assert "--no_such_flag is not a flag" in line and f"python {script} --help" in line, line
    assert "Traceback" not in result["stderr"] and "usage:" not in result["stderr"], result["stderr"][-3000:]
    assert not out.exists()


def test_a_script_s_refusal_is_its_process_s_exit_status_2(tmp_path):
    """The refusals above run in one process (runpy): one script run as its own process exits 2 with the line."""
    argv, expected = SCRIPT_CASES["scaling_study negative global batch"]
    proc = run([sys.executable, *out_of(tmp_path, argv)], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = error_lines(proc.stderr)
    assert all(text in line for text in expected) and "Traceback" not in proc.stderr, line
