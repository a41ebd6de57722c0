"""The conformance matrix: every engine resumes, accumulates, keeps its best model and fine-tunes as the reference
says (docs/reliability.md has the table).

Each engine's reference is its own uninterrupted 2-process run (`engine_runs`: 12 steps of 2 x 16 images, a
checkpoint at steps 6 and 12), which test_fsdp.py already holds to plain DDP's losses and weights. One more run per
engine checks the rest, resumed from that run's checkpoint-6:
  - DDP, ZeRO 0-2 and both offloads resume on ONE process (DDP's whole checkpoint as the plain Trainer, ZeRO 1-3
    through DeepSpeed's universal checkpoint); FSDP2, which the recipe refuses on one process, and ZeRO-3 resume on 2
    (ZeRO-3's 2 -> 1 resume is a test of its own);
  - the same global batch of 32 as 2 micro-batches (gradient accumulation 2: 1 x 16 x 2, or 2 x 8 x 2 for FSDP2)
    instead of one: the data order and loss are the reference's, so steps 7-12 must log its losses and checkpoint-12
    must hold its final weights: (b) exact resume, (c) accumulation, (d) another world size at once;
  - evaluation and a checkpoint every 3 steps, `--load_best_model_at_end` with the HIGHEST eval loss as "best", so
    the best is checkpoint-9, not the last step: the final model must be exactly checkpoint-9's weights (e);
  - (f): `--model_name_or_path` on each engine's saved model (the recipe's `load_model_for_finetuning`) loads every
    encoder tensor as saved.
A failure names the engine, the check and the first differing step or tensor.
"""

import shutil
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import ViTConfig, ViTForImageClassification

from hf_vit_scaling.models.presets import load_model_for_finetuning
from hf_vit_scaling.training.checkpoints import convert_to_universal, universal_tag_folder
from tests.helpers.compile_checks import assert_compiled_on_every_rank
from tests.helpers.engine_runs import CHECK_EVERY, ENGINE_RUN_ARGS, ENGINE_STEPS, ENGINES
from tests.helpers.launchers import (
    RECIPE,
    TINY_ARGS,
    WORKERS,
    launcher_cmd,
    losses_by_step,
    read_json,
    run,
    side_by_side,
    steps_trained_since,
)
from tests.tiers import selected_params

pytestmark = pytest.mark.distributed

KEY_BIAS = ".attention.k_proj.bias"  # its true gradient is 0: AdamW steps on rounding noise (see test_fsdp.py)
RESUME_AT = 6
# The reference runs' eval loss is 2.404 at step 9 and 2.378 at step 12 (every engine: test_fsdp.py), so "higher is
# better" makes checkpoint-9 the best: the final model is then an earlier checkpoint's, not the last step's.
BEST_IS_HIGHER = "true"
RESUMED_STEPS = list(range(RESUME_AT + 1, ENGINE_STEPS + 1))
# The engines (docs/reliability.md): the plain Trainer is DDP's resumed run on one process; ZeRO-3 + offload
# and FSDP2 with full state dicts are held to DDP by test_fsdp.py and fine-tuned from below, but not resumed here (each
# resumed run costs ~20 s of a make test that must stay under 25 minutes).
MATRIX = ["ddp", "zero0", "zero1", "zero2", "zero2_offload", "zero3", "fsdp2_sharded"]


def resumes_on_one_process(engine: str) -> bool:
    """FSDP2: the recipe refuses one process. ZeRO-3: its matrix cells resume on the 2 processes that saved it, and
    its 2 -> 1 resume is a test of its own (below)."""
    return not engine.startswith("fsdp2") and engine != "zero3"


def checkpoint_weights(folder, config_dir) -> dict[str, torch.Tensor]:
    """A checkpoint's or a run's model weights under the model's own (in-memory) names, whatever the format:
    model.safetensors (transformers' original key format), FSDP2's full `pytorch_model_fsdp.bin` or its sharded
    (DCP) state made whole; loaded through `from_pretrained`'s key conversion, every key required."""
    if (folder / "model.safetensors").is_file():
        state = load_file(folder / "model.safetensors")
    elif (folder / "pytorch_model_fsdp.bin").is_file():
        state = torch.load(folder / "pytorch_model_fsdp.bin", weights_only=True)
    else:
        whole = folder / "whole_model.pt"
        dcp_to_torch_save(folder / "pytorch_model_fsdp_0", whole)
        state = torch.load(whole, weights_only=True)
        state = state.get("model", state)
    config = ViTConfig.from_pretrained(config_dir)
    model, info = ViTForImageClassification.from_pretrained(None, config=config, state_dict=state,
                                                            output_loading_info=True)  # fmt: skip
    assert not info["missing_keys"] and not info["unexpected_keys"], f"{folder}: {info}"
    return model.state_dict()


def first_difference(expected: dict, got: dict, rtol: float, atol: float, across_runs: bool = True) -> str | None:
    """The first tensor name (and its largest difference) where `got` differs from `expected`, or None.
    `across_runs`: two runs' weights, so the k_proj biases (AdamW steps on rounding noise) are left out; within one
    run (a checkpoint against the model loaded from it) every tensor counts."""
    if expected.keys() != got.keys():
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        return f"other keys: missing {missing[:3]}, extra {extra[:3]}"
    for name, tensor in expected.items():
        if across_runs and name.endswith(KEY_BIAS):
            continue
        if not torch.allclose(got[name], tensor, rtol=rtol, atol=atol):
            return f"{name} (max |diff| {(got[name] - tensor).abs().max().item():.3g})"
    return None


# The resumed runs on one process (the matrix's and ZeRO-3's 2 -> 1): made together, two at a time.
ONE_PROCESS_RESUMES = [(engine, True) for engine in MATRIX if resumes_on_one_process(engine)] + [("zero3", True)]


@pytest.fixture(scope="module")
def resumed_runs(request, engine_runs, tmp_path_factory):
    """`resumed_runs(engine)` -> (output folder, process) of the engine's resumed run (see the module's docstring),
    made on first use; the first one-process run asked for starts every one-process run, two side by side."""
    done = {}
    # The one-process resumes of the engines this session tests (`make test`: the core ones, tests/tiers.py).
    selected = set(selected_params(request, "engine")) | {"zero3"}
    one_process = [key for key in ONE_PROCESS_RESUMES if key[0] in selected]

    def command(engine: str, one: bool) -> tuple:
        """(output folder, command) of the engine's resumed run."""
        reference, _, _ = engine_runs[engine]
        out = tmp_path_factory.mktemp(f"resumed_{engine}_{'one' if one else 'two'}")
        shutil.copytree(reference / f"checkpoint-{RESUME_AT}", out / f"checkpoint-{RESUME_AT}")
        launcher, engine_args = ENGINES[engine]
        return out, [
            *launcher_cmd("python" if one else launcher, 1 if one else 2), RECIPE, "--output_dir", out,
            *TINY_ARGS, *engine_args,
            "--per_device_train_batch_size", "16" if one else "8", "--gradient_accumulation_steps", "2",
            "--max_steps", str(ENGINE_STEPS), "--logging_steps", "1", "--random_resized_crop", "false",
            "--eval_strategy", "steps", "--eval_steps", str(CHECK_EVERY), "--max_eval_samples", "64",
            "--save_strategy", "steps", "--save_steps", str(CHECK_EVERY), "--load_best_model_at_end", "true",
            "--metric_for_best_model", "loss", "--greater_is_better", BEST_IS_HIGHER,
            "--resume_from_checkpoint", out / f"checkpoint-{RESUME_AT}", "--trace_samples", "true",
        ]  # fmt: skip

    def get(engine: str, one: bool | None = None):
        one = resumes_on_one_process(engine) if one is None else one
        if (engine, one) not in done:
            keys = [key for key in one_process if key not in done] if one else [(engine, one)]
            commands = {key: command(*key) for key in keys}  # the references (2-process runs) first, one by one
            procs = side_by_side(*(partial(run, cmd) for _, cmd in commands.values()))
            for (key, (out, _)), proc in zip(commands.items(), procs, strict=True):
                done[key] = (out, proc)
        out, proc = done[engine, one]
        assert proc.returncode == 0, f"{engine}: the resumed run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return out, proc

    return get


def assert_resume_gives_the_reference_run(reference, out, engine: str) -> None:
    """The resumed process trained steps 7-12 and no other (two micro-batches each, on every rank, counted from its
    own trace), and steps 7-12's losses, the evaluations at 9 and 12 and checkpoint-12's weights are the reference
    run's."""
    for rank, steps in steps_trained_since(out, {}).items():
        assert steps == [step for step in RESUMED_STEPS for _ in range(2)], f"{engine}, {rank} trained {steps}"
    expected, got = losses_by_step(reference), losses_by_step(out)
    expected_eval, got_eval = losses_by_step(reference, "eval_loss"), losses_by_step(out, "eval_loss")
    assert [got_eval.get(step) for step in (9, 12)] == pytest.approx([expected_eval[9], expected_eval[12]], rel=1e-5)
    for step in RESUMED_STEPS:
        assert got.get(step) == pytest.approx(expected[step], rel=1e-5, abs=0), (
            f"{engine}, resume + accumulation: step {step} logged {got.get(step)}, the reference {expected[step]}"
        )
    differs = first_difference(
        checkpoint_weights(reference, reference),
        checkpoint_weights(out / f"checkpoint-{ENGINE_STEPS}", reference),
        rtol=1e-4,
        atol=1e-6,
    )
    assert differs is None, f"{engine}, resume + accumulation: weights at step {ENGINE_STEPS} differ at {differs}"


MOMENTS = ("exp_avg", "exp_avg_sq", "step")


def flat_tensors(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    """{dotted path: tensor} of a nested dict/list state."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    out = {}
    for key, value in items:
        out.update(flat_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def optimizer_moments(folder, engine: str) -> dict[str, torch.Tensor]:
    """{where: tensor} of every AdamW moment and step count a checkpoint holds, in a layout that does not depend on
    the number of processes that saved it: the torch optimizer's state (plain Trainer, DDP: optimizer.pt; ZeRO-0:
    inside DeepSpeed's model states), DeepSpeed's universal checkpoint for ZeRO 1-3 (one folder per parameter,
    converted here with `ds_to_universal`), FSDP2's sharded optimizer state made whole."""
    if engine == "ddp":
        state = torch.load(folder / "optimizer.pt", weights_only=False)["state"]
    elif engine == "zero0":
        states = Path(universal_tag_folder(str(folder))) / "mp_rank_00_model_states.pt"
        state = torch.load(states, weights_only=False)["optimizer"]["state"]
    elif engine.startswith("fsdp2"):
        whole = folder / "whole_optimizer.pt"
        dcp_to_torch_save(folder / "optimizer_0", whole)
        state = torch.load(whole, weights_only=False)
    else:
        universal = Path(convert_to_universal(str(folder))) / "zero"
        state = {
            param.name: {
                path.stem: torch.load(path, weights_only=False)
                for path in sorted(param.glob("*.pt"))
                if path.stem in MOMENTS
            }  # ZeRO-3's universal folders hold no step.pt
            for param in sorted(universal.iterdir())
            if param.is_dir()
        }
        if engine.startswith("zero3"):
            state["optimizer_files"] = zero3_step_count(folder)
    return {k: v.float() for k, v in flat_tensors(state).items() if k.split(".")[-1] in MOMENTS or k.endswith("param")}


def zero3_step_count(folder) -> dict[str, torch.Tensor]:
    """{"step": AdamW's step count} as every rank's ZeRO-3 optimizer file in `folder` saved it (the universal
    folders hold no step.pt for ZeRO-3, so the moments alone leave it out). The count sets AdamW's bias corrections:
    resumed 2 -> 1 through the universal checkpoint, DeepSpeed 0.19 restored 12 where checkpoint-6 saved 6, and the
    run ended at 18 after 12 steps with exact weights."""
    counts = set()
    for path in sorted(Path(universal_tag_folder(str(folder))).glob("*optim_states.pt")):
        saved = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        state = saved.get("optimizer_state_dict", saved)["state"]
        counts |= {float(entry["step"]) for entry in state.values() if "step" in entry}
    assert len(counts) == 1, f"{folder}: the ranks' optimizer files hold step counts {sorted(counts)}"
    return {"step": torch.tensor(counts.pop())}


def moments_difference(expected: dict, got: dict, rtol: float) -> str | None:
    """The first moment where `got` is off `expected` by more than rtol x the largest value of that kind (a
    moment's scale; the k_proj biases' near-zero moments are held to it too, not to their own rounding noise)."""
    if expected.keys() != got.keys():
        return f"other entries: {sorted(expected.keys() ^ got.keys())[:4]}"
    scale = {}
    for key, tensor in expected.items():
        kind = next(kind for kind in MOMENTS if f".{kind}" in f".{key}")
        scale[kind] = max(scale.get(kind, 0.0), tensor.abs().max().item())
    for key, tensor in expected.items():
        kind = next(kind for kind in MOMENTS if f".{kind}" in f".{key}")
        diff = (got[key] - tensor).abs().max().item()
        if diff > rtol * scale[kind]:
            return f"{key}: max |diff| {diff:.3g}, {kind}'s scale {scale[kind]:.3g}"
    return None


def scheduler_state(folder) -> dict:
    """The learning-rate schedule's state: the Trainer's scheduler.pt, or (ZeRO-Offload, where DeepSpeed owns the
    scheduler) the `lr_scheduler` of DeepSpeed's model states."""
    if (folder / "scheduler.pt").is_file():
        return torch.load(folder / "scheduler.pt", weights_only=False)
    states = Path(universal_tag_folder(str(folder))) / "mp_rank_00_model_states.pt"
    return torch.load(states, weights_only=False)["lr_scheduler"]


@pytest.mark.parametrize("engine", MATRIX)
def test_resumed_optimizer_moments_and_schedule_are_the_reference_run_s(engine_runs, resumed_runs, engine):
    """checkpoint-12 of the resumed run holds the uninterrupted run's AdamW moments (exp_avg, exp_avg_sq), step
    counts (ZeRO-3's from its optimizer files) and learning-rate schedule: compared directly, not only through the
    losses they lead to."""
    out, _ = resumed_runs(engine)
    assert_optimizer_state_is_the_reference_run_s(engine_runs[engine][0], out, engine)
    if engine == "ddp":  # the comparison can fail: three steps earlier the moments are other ones
        expected = optimizer_moments(engine_runs[engine][0] / f"checkpoint-{ENGINE_STEPS}", engine)
        earlier = optimizer_moments(engine_runs[engine][0] / f"checkpoint-{ENGINE_STEPS - CHECK_EVERY}", engine)
        assert moments_difference(expected, earlier, rtol=1e-5) is not None


def assert_optimizer_state_is_the_reference_run_s(reference_run, out, engine: str) -> None:
    """Moments, step counts and schedule at step 12, against the reference's (ZeRO-3's step count required)."""
    reference = reference_run / f"checkpoint-{ENGINE_STEPS}"
    got_folder = out / f"checkpoint-{ENGINE_STEPS}"
    expected, got = optimizer_moments(reference, engine), optimizer_moments(got_folder, engine)
    kinds = {kind for key in expected for kind in MOMENTS if f".{kind}" in f".{key}"}
    required = {"exp_avg", "exp_avg_sq", *(["step"] if engine.startswith("zero3") else [])}
    assert kinds >= required, f"{engine}: {sorted(kinds)} in {sorted(expected)[:4]}"
    differs = moments_difference(expected, got, rtol=1e-5)
    assert differs is None, f"{engine}: the optimizer state at step {ENGINE_STEPS} differs at {differs}"
    schedule = [scheduler_state(folder) for folder in (reference, got_folder)]
    for key in ("last_epoch", "_step_count", "base_lrs"):
        assert schedule[1][key] == schedule[0][key], (
            f"{engine}: scheduler {key} {schedule[1][key]} != {schedule[0][key]}"
        )
    assert schedule[1]["_last_lr"] == pytest.approx(schedule[0]["_last_lr"], rel=1e-9)


@pytest.mark.parametrize("engine", MATRIX)
def test_resume_with_accumulation_gives_the_reference_run(engine_runs, resumed_runs, engine):
    """On one process where the engine allows it (another world size), else on the two that saved it."""
    out, proc = resumed_runs(engine)
    universal = resumes_on_one_process(engine) and engine not in ("ddp", "zero0")
    assert universal == ("saved by 2 process(es), this run has 1" in proc.stdout), f"{engine}: universal checkpoint?"
    assert_resume_gives_the_reference_run(engine_runs[engine][0], out, engine)


# DeepSpeed 0.19's universal checkpoint restored the torch AdamW step count of a ZeRO-3 run resumed 2 -> 1 processes
# wrong (12 where checkpoint-6 saved 6), so the updates after the resume drifted (rel. 9.9e-6 at step 8, 3.1e-4 by
# step 11) while the weights were exact; `VitTrainer._correct_zero3_universal_adam_step` puts the saved count back.
def test_zero3_resumed_on_one_process_through_the_universal_checkpoint(engine_runs, resumed_runs):
    """Fails if the saved step count is not put back (`_correct_zero3_universal_adam_step` returning at once): the
    step count at 12 is 18."""
    out, proc = resumed_runs("zero3", one=True)
    assert "saved by 2 process(es), this run has 1" in proc.stdout
    assert_resume_gives_the_reference_run(engine_runs["zero3"][0], out, "zero3, 2 -> 1")
    assert_optimizer_state_is_the_reference_run_s(engine_runs["zero3"][0], out, "zero3")


@pytest.mark.parametrize("engine", MATRIX)
def test_load_best_model_at_end_gives_the_best_checkpoints_weights(resumed_runs, engine):
    out, _ = resumed_runs(engine)
    best = read_json(out / "trainer_state.json")["best_model_checkpoint"]
    assert best and best.endswith(f"checkpoint-{RESUME_AT + CHECK_EVERY}"), f"{engine}: best checkpoint {best}"
    differs = first_difference(
        checkpoint_weights(out / f"checkpoint-{RESUME_AT + CHECK_EVERY}", out),
        checkpoint_weights(out, out),
        rtol=0,
        atol=0,
        across_runs=False,  # the best checkpoint and the model loaded from it: bit for bit, every tensor
    )
    assert differs is None, f"{engine}, load_best_model_at_end: the final model differs from {best} at {differs}"


@pytest.mark.parametrize("engine", list(ENGINES))
def test_fine_tuning_from_a_saved_run_loads_every_encoder_tensor(engine_runs, engine):
    """`--model_name_or_path <the engine's output>` with other classes: a new head, every other tensor as saved."""
    saved = engine_runs[engine][0]
    reference = checkpoint_weights(saved, saved)
    model = load_model_for_finetuning(str(saved), ["a", "b", "c"])
    tuned = model.state_dict()
    encoder = [name for name in reference if not name.startswith("classifier.")]
    assert len(encoder) == len(reference) - 2 and tuned["classifier.weight"].shape[0] == 3
    for name in encoder:
        assert torch.equal(tuned[name], reference[name]), f"{engine}, fine-tune: {name} was not loaded as saved"


# --------------------------------------------------------------------------- the compiled arm

# `--torch_compile` with aot_eager (dynamo's capture and AOTAutograd's graphs, what meets the engine: see
# test_compile.py, which also has inductor's measured drift, 1.0e-7); its losses equal eager's to this tolerance.
COMPILE_FLAGS = ["--torch_compile_backend", "aot_eager"]
COMPILED_TOLERANCE = 1e-5  # relative, per step, as in test_compile.py


# The compiled arm's engines: DDP and ZeRO-2 resume compiled on ONE process (another world size and accumulation at
# once; ZeRO-2 through the universal checkpoint), ZeRO-3 and FSDP2 on the two that saved them, as the eager matrix.
COMPILED_MATRIX = ["ddp", "zero2", "zero3", "fsdp2_sharded"]
PROBE = "compile_probe"  # the reference run's folder of per-rank compile records


def make_compiled_runs(engine: str, tmp_path_factory) -> tuple[Path, Path]:
    """(reference, resumed): the engine's uninterrupted 2-process run compiled (the engine runs' schedule), through
    the compile probe (tests/launched/workers/compile_probe.py: each rank's compiled frames in reference/PROBE), then
    its checkpoint-6 resumed compiled with 2 micro-batches a step (see COMPILED_MATRIX for where)."""
    launcher, engine_args = ENGINES[engine]
    reference = tmp_path_factory.mktemp(f"compiled_{engine}")
    proc = run([*launcher_cmd(launcher, 2), WORKERS / "compile_probe.py", "--output_dir", reference, *TINY_ARGS,
                *engine_args, *ENGINE_RUN_ARGS, *COMPILE_FLAGS], COMPILE_PROBE_DIR=str(reference / PROBE))  # fmt: skip
    assert proc.returncode == 0, f"compiled {engine} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    one = resumes_on_one_process(engine)
    resumed = tmp_path_factory.mktemp(f"compiled_{engine}_resumed_{'one' if one else 'two'}")
    shutil.copytree(reference / f"checkpoint-{RESUME_AT}", resumed / f"checkpoint-{RESUME_AT}")
    proc = run([
        *launcher_cmd("python" if one else launcher, 1 if one else 2), RECIPE, "--output_dir", resumed, *TINY_ARGS,
        *engine_args, *ENGINE_RUN_ARGS, *COMPILE_FLAGS,
        "--per_device_train_batch_size", "16" if one else "8", "--gradient_accumulation_steps", "2",
        "--resume_from_checkpoint", resumed / f"checkpoint-{RESUME_AT}", "--trace_samples", "true",
    ])  # fmt: skip
    assert proc.returncode == 0, f"compiled {engine} resume failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return reference, resumed


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """`compiled_runs(engine)` -> (reference, resumed) of `make_compiled_runs`, made on first use."""
    done = {}

    def get(engine: str) -> tuple[Path, Path]:
        if engine not in done:
            done[engine] = make_compiled_runs(engine, tmp_path_factory)
        return done[engine]

    return get


def compile_facts(folder) -> dict:
    return read_json(folder / "throughput.json")["compile"]


@pytest.mark.parametrize("engine", COMPILED_MATRIX)
def test_compiled_run_trains_the_eager_run_s_losses(engine_runs, compiled_runs, engine):
    """Fails if the compiled run left the model eager on a rank (FSDP2 on a CPU world: accelerate's state is made
    before the Trainer's, without its compile, so `CompileEngine` must compile it; DeepSpeed: neither
    `engine.compile()` nor the fallback ran), another backend ran, the graphs per rank moved, anything recompiled
    after the warm-up (tests/helpers/compile_checks.py), or it trains, evaluates or saves other numbers than the same
    engine's eager run."""
    reference, _ = compiled_runs(engine)
    ranks = [read_json(reference / PROBE / f"rank{rank}.json") for rank in range(2)]
    assert_compiled_on_every_rank(engine, compile_facts(reference), ranks, modes=2)  # it evaluates every 3 steps
    eager = engine_runs[engine][0]
    for key in ("loss", "eval_loss"):
        expected, got = losses_by_step(eager, key), losses_by_step(reference, key)
        assert got.keys() == expected.keys(), (engine, key)
        assert [got[s] for s in expected] == pytest.approx(list(expected.values()), rel=COMPILED_TOLERANCE), (
            engine, key)  # fmt: skip
    differs = first_difference(checkpoint_weights(eager, eager), checkpoint_weights(reference, reference),
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    assert differs is None, f"compiled {engine}'s final weights differ from eager {engine}'s at {differs}"


@pytest.mark.parametrize("engine", COMPILED_MATRIX)
def test_compiled_run_resumes_exactly(compiled_runs, engine):
    """A compiled run's checkpoint (saved from the compiled model: no `_orig_mod.` keys, or from_pretrained fails
    in `checkpoint_weights`) resumed compiled with accumulation, on one process where the engine allows (DDP, ZeRO-2:
    another world size): only steps 7-12 run, with the reference's losses, evaluations and final weights."""
    reference, resumed = compiled_runs(engine)
    assert compile_facts(resumed)["compiled"], engine
    where = "2 -> 1" if resumes_on_one_process(engine) else "2 -> 2"
    assert_resume_gives_the_reference_run(reference, resumed, f"{engine} compiled, {where}")
