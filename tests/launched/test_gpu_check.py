"""`make gpu-check DRY_RUN=1`: the GPU check's whole code path on the CPU (benchmarks/gpu_check.py, docs/gpu.md), so
the script that gets one 15-minute GPU window cannot rot: every item runs (prepared shards, the recipe under the plain
Trainer, ZeRO-1, ZeRO-2, ZeRO-3 and FSDP2 on 2 processes, ZeRO-2 and ZeRO-3 with transformers' "auto" fill, one
compiled run, the synthetic floor, the profile of the floor, the plain Trainer and ZeRO-2) and writes figures of the
right kinds into gpu_check.json and the table into gpu_check.md. Also: the GPU mode's order and time budget, the wheel
install the GPU machine needs, from a hand-made wheel (no network), and the make target's command line."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from hf_vit_scaling.parallel.fast_paths.registry import ENV_SWITCH
from tests.helpers.launchers import REPO, launch_env

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
OK_RUNS = ("ddp-eager", "zero2-eager", "zero3-eager", "zero1-eager", "fsdp2-eager", "zero2_auto-eager",
           "zero3_auto-eager", "zero2_own-eager", "zero3_own-eager", "ddp-compiled")  # fmt: skip


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # dataclasses look their module up there
    spec.loader.exec_module(sys.modules["gpu_check"])
    return sys.modules["gpu_check"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = launch_env()
    env.pop("OMP_NUM_THREADS")  # as `make gpu-check DRY_RUN=1` runs it: the script sets one thread per process
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry_run", "--output_dir", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert proc.returncode == 0, (
        f"gpu_check --dry_run failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    )
    return out, json.loads((out / "gpu_check.json").read_text())


def in_unit_interval(value, low_open: bool) -> bool:
    return isinstance(value, float) and (0 < value if low_open else 0 <= value) and value <= 1


@pytest.mark.distributed  # FSDP2 runs as 2 processes (torchrun)
def test_dry_run_runs_every_part(dry_run):
    _, result = dry_run
    assert result["mode"] == "dry_run" and result["exit_code"] == 0
    assert result["setup"]["status"] == "ok"
    for part in ("a", "b", "c", "e"):
        assert result["parts"][part]["status"] == "ok", (part, result["parts"][part])
        assert result["parts"][part]["complete"], (part, result["parts"][part])  # nothing skipped for lack of time
    # planner_memory_gpu.py reads the CUDA allocator: skipped in the dry run, with the reason
    assert result["parts"]["d"]["status"] == "skipped"
    assert "GPU only" in result["items"]["planner-grid"]["reason"]
    items = result["items"]
    assert all(items[name]["status"] == "ok" for name in OK_RUNS), {n: items[n] for n in OK_RUNS}
    for name in ("zero2-compiled", "zero3-compiled", "zero1-compiled", "fsdp2-compiled"):  # one compiled run here
        assert items[name]["status"] == "skipped" and "dry run" in items[name]["reason"]
    assert items["ddp-max-autotune"]["status"] == "skipped" and "GPU only" in items["ddp-max-autotune"]["reason"]
    assert list(items) == load_gpu_check().item_order()  # every item, in the order they run


@pytest.mark.distributed
def test_dry_run_figures_have_the_right_kinds(dry_run):
    _, result = dry_run
    items = result["items"]
    for name in OK_RUNS:
        f = items[name]["figures"]
        assert isinstance(f["images_per_s"], float) and f["images_per_s"] > 0, name
        # On a CPU the peak is a matmul timed at the start of the run, on cores the test shares: a compiled run
        # timed at a quieter moment can pass it. A GPU's peak comes from its table: there MFU is in (0, 1].
        assert isinstance(f["mfu"], float) and f["mfu"] > 0 and f["peak_source"] == "matmul-probe", name
        assert in_unit_interval(f["data_wait_fraction"], low_open=False), name
        assert isinstance(f["floor_ratio"], float) and f["floor_ratio"] > 0, name
        assert f["memory_kind"] == "rss_peak_bytes" and f["memory_bytes"] > 0, name
        assert isinstance(f["predicted_peak_bytes"], int) and f["predicted_peak_bytes"] > 0, name
        assert items[name]["input"] == "shards", name
    assert items["fsdp2-eager"]["figures"]["world_size"] == 2
    b = result["parts"]["b"]["figures"]
    assert b["run"] == "ddp-compiled" and b["target"] == 0.05 and isinstance(b["passed"], bool)
    assert in_unit_interval(b["data_wait_fraction"], low_open=False)
    floor = items["floor"]["figures"]
    for variant in ("eager", "compiled"):
        assert floor[variant]["steps_per_s"] > 0 and floor[variant]["step_s"] > 0, variant
        assert isinstance(floor[variant]["mfu"], float) and floor[variant]["mfu"] > 0, variant


@pytest.mark.distributed
def test_dry_run_auto_arms_run_transformers_fill_and_the_others_the_resolved_values(dry_run):
    _, result = dry_run
    items, hidden = result["items"], 96  # vit-tiny-cpu's hidden size
    for name in ("zero2_auto-eager", "zero3_auto-eager"):
        zero = items[name]["auto_values"]["zero_optimization"]
        assert zero["reduce_bucket_size"] == hidden * hidden, name  # transformers' hidden^2 rule, as numbers
        assert items[name]["figures"]["deepspeed_resolved"] == {}, name  # numbers in the file win over resolution
        assert set(items[name]["figures"]["deepspeed_fast_paths"].values()) == {f"off ({ENV_SWITCH}=0)"}, name
    assert items["zero3_auto-eager"]["auto_values"]["zero_optimization"]["stage3_param_persistence_threshold"] == 960
    for name in ("zero1-eager", "zero2-eager", "zero3-eager"):
        resolved = items[name]["figures"]["deepspeed_resolved"]
        assert resolved["zero_optimization.reduce_bucket_size"]["value"] > hidden * hidden, name
        assert set(items[name]["figures"]["deepspeed_fast_paths"].values()) == {"on"}, name
    for name in ("zero2_own-eager", "zero3_own-eager"):  # the resolved values, DeepSpeed's own loops
        own, fast = items[name]["figures"], items[name.replace("_own", "")]["figures"]
        assert own["deepspeed_resolved"] == fast["deepspeed_resolved"], name
        assert set(own["deepspeed_fast_paths"].values()) == {f"off ({ENV_SWITCH}=0)"}, name


@pytest.mark.distributed
def test_dry_run_profiles_the_floor_the_plain_trainer_and_zero2(dry_run):
    _, result = dry_run
    profile, steps = result["items"]["profile"], load_gpu_check().DRY_RUN.profile_steps
    assert profile["status"] == "ok" and profile["part"] == "e", profile
    assert list(profile["figures"]) == ["floor", "ddp", "zero2"]
    for run, summary in profile["figures"].items():
        assert summary["activities"] == ["CPU"] and summary["steps"] == steps, run
        assert in_unit_interval(summary["device_busy_fraction"], low_open=True), run
        assert summary["wall_s"] > 0 and summary["kernel_time_sum_s"] > 0, run
        kernels = summary["top_kernels"]
        assert 1 <= len(kernels) <= 10 and all(k["name"] and k["self_s"] > 0 and k["calls"] > 0 for k in kernels), run
        assert [k["self_s"] for k in kernels] == sorted((k["self_s"] for k in kernels), reverse=True), run
        assert any(k["name"].startswith("aten::") for k in kernels), run


@pytest.mark.distributed
def test_dry_run_writes_the_table_and_the_runs(dry_run):
    out, result = dry_run
    table, steps = (out / "gpu_check.md").read_text(), load_gpu_check().DRY_RUN.profile_steps
    assert "| part | run | status | images/s | MFU | data wait | step ms | x floor |" in table
    rows = [
        "| a | plain Trainer eager | ok |",
        "| a | ZeRO-3 eager | ok |",
        "| a | FSDP2 eager, 2 processes | ok |",
        "| a | plain Trainer compiled | ok |",
        "| a | ZeRO-1 eager | ok |",
        '| a | ZeRO-2 "auto" eager | ok |',
        '| a | ZeRO-3 "auto" eager | ok |',
        "| b | data wait",
        "| c | floor eager",
        "| c | floor compiled",
        f"Profile (part e, torch.profiler, {steps} steps per run): ok",
        "| floor | cpu |",
        "| ddp | cpu |",
        "| zero2 | cpu |",
    ]
    for row in rows:
        assert row in table, row
    for name in OK_RUNS:  # each run's folder, its report kept, its weights deleted
        assert (out / "runs" / name / "throughput.json").is_file(), name
        assert not list((out / "runs" / name).rglob("*.safetensors")), name
    assert (out / "runs.tar.gz").is_file()


def test_gpu_order_puts_the_figures_that_matter_first_and_fits_them_in_the_budget():
    """The GPU mode's plan, walked with each item taking its expected time (no GPU needed): resolved engines and the
    plain Trainer before the "auto" arms, the max-autotune arm last, and the items the issue's targets read
    (plain, floor, compiled, ZeRO-2/3 resolved, the profile) inside the 515 s budget."""
    load_gpu_check()  # puts benchmarks/ on sys.path
    settings_module = sys.modules["gpu_check_settings"]
    order = settings_module.item_order()
    position = {name: index for index, name in enumerate(order)}
    assert order[-1] == "ddp-max-autotune"
    for first in ("ddp-eager", "floor", "ddp-compiled", "zero2-eager", "zero3-eager", "zero1-eager"):
        for later in ("zero2_auto-eager", "zero3_auto-eager", "zero2-compiled", "zero3-compiled"):
            assert position[first] < position[later], (first, later)
    gpu = settings_module.GPU
    elapsed, ran = gpu.times["setup"][0], []
    for name in order:
        if name.startswith("fsdp2"):  # not applicable on one GPU
            continue
        expect = settings_module.item_times(gpu, *settings_module.item_kind(name))[0]
        if gpu.budget_s - elapsed >= expect:
            elapsed, ran = elapsed + expect, ran + [name]
    assert elapsed <= gpu.budget_s
    must = ["shards", "ddp-eager", "floor", "ddp-compiled", "zero2-eager", "zero3-eager", "zero1-eager", "profile"]
    assert ran[: len(must)] == must, ran
    for name in order:  # docs/gpu.md's table names every item
        assert f"`{name}`" in (REPO / "docs" / "gpu.md").read_text(), name


def make_wheel(folder, name: str, version: str = "0.1"):
    """A pure-Python wheel holding one module with VALUE = 42 (the format pip installs, written by hand)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def test_missing_modules_are_installed_from_the_wheels_folder(tmp_path, monkeypatch):
    gpu_check = load_gpu_check()
    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    wheel = make_wheel(wheels, "gpu_check_probe")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = gpu_check.ensure_packages(wheels, site, modules=("gpu_check_probe",))
    assert result["status"] == "ok" and result["missing"] == ["gpu_check_probe"], result
    assert result["installed"] == [wheel.name]
    assert os.environ["PYTHONPATH"].split(os.pathsep)[:2] == [str(site), str(REPO)]
    child = subprocess.run([sys.executable, "-c", "import gpu_check_probe; print(gpu_check_probe.VALUE)"],
                           capture_output=True, text=True, env=dict(os.environ), cwd=tmp_path)  # fmt: skip
    assert child.stdout.strip() == "42", child.stderr  # what the recipe's processes inherit


def test_missing_modules_without_wheels_fail_with_the_fix(tmp_path):
    gpu_check = load_gpu_check()
    result = gpu_check.ensure_packages(tmp_path / "none", tmp_path / "site", modules=("gpu_check_absent",))
    assert result["status"] == "failed" and "../shared/tools/device-wheels" in result["error"]
    present = gpu_check.ensure_packages(tmp_path / "none", tmp_path / "site", modules=("json",))
    assert present["status"] == "ok" and not (tmp_path / "site").exists()  # nothing to install, nothing installed


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(("dry", "expected"), [(True, "--dry_run"), (False, "")])
def test_make_target_runs_the_script_without_make_install(dry, expected):
    # --no-print-directory: under `make test` this make is nested and would print "make[1]: Entering directory".
    args = ["make", "--no-print-directory", "-n", "gpu-check", "OUT=/tmp/x"] + (["DRY_RUN=1"] if dry else [])
    line = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    python = ".venv/bin/python" if (REPO / ".venv" / "bin" / "python").exists() else "python3"
    assert line == f"{python} benchmarks/gpu_check.py --output_dir /tmp/x {expected}".strip()
    # Where the venv is missing (the GPU machine), the system python3: no `make install`, which downloads torch.
    bare = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check", "OUT=/tmp/x", "PY=/nonexistent/python"],
                          cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert bare.startswith("python3 benchmarks/gpu_check.py --output_dir /tmp/x")
