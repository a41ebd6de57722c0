"""Checkpoints that survive kills, full disks and a changed number of processes.

The Trainer writes `checkpoint-N/` in place, file by file, and `get_last_checkpoint` picks the highest N whether or
not its save finished. Here:

- `mark_checkpoint_complete` writes `checkpoint_complete.json` (step, world size, ZeRO stage, every file with its
  size) once all ranks' files are on disk, atomically (temp file + rename). `VitTrainer` calls it before the
  Trainer rotates old checkpoints away, so a complete checkpoint always exists once one was saved.
- `checkpoint_problem` says why a folder is not a usable checkpoint (no marker, a file missing or truncated).
- `resolve_resume_checkpoint` turns `--resume_from_checkpoint latest` into the newest complete checkpoint in
  `output_dir` (or none: start fresh), and checks an explicit path.
- `prepare_world_size_change`: a ZeRO checkpoint saved by W processes only loads on W processes. DeepSpeed's
  universal checkpoint (`deepspeed.checkpoint.ds_to_universal`) stores each parameter's full fp32 value and optimizer
  moments, which any world size can load with `"checkpoint": {"load_universal": true}`. We convert once, on the main
  process, into `checkpoint-N/global_stepN_universal/`, and turn that key on.
- `load_model_weights`: a checkpoint's model weights into a plain (not DeepSpeed, not FSDP) model, the one way every
  load of ours goes (resume, `--load_best_model_at_end`; the EMA shadow uses its two steps, `converted_state_dict`
  and `state_dict_problems`).
  transformers 5 saves ViT weights in the original key format (`vit.encoder.layer.N.attention.attention.query`) and
  only `from_pretrained` converts them to the modules' names (`vit.layers.N.attention.q_proj`);
  `converted_state_dict` applies that same conversion (transformers' own tables and functions), and keys already in
  the model's format stay as they are. The load is strict: any tensor the model has and the checkpoint lacks, or the
  reverse, or a shape that differs, raises an error naming the keys and the checkpoint, before anything is copied.
"""

import glob
import json
import os
import subprocess
import sys

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.weights import checkpoint_step
from hf_vit_scaling.utils import write_json_atomically

MARKER = "checkpoint_complete.json"
LATEST = "latest"  # --resume_from_checkpoint latest: the newest complete checkpoint in output_dir


def _files_with_sizes(folder: str) -> dict[str, int]:
    sizes = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel != MARKER and "_universal" not in rel:
                sizes[rel] = os.path.getsize(path)
    return sizes


def mark_checkpoint_complete(folder: str, step: int, world_size: int, zero_stage: int | None) -> None:
    """Call on the main process once every rank finished writing `folder` (DeepSpeed's save ends in a barrier)."""
    write_json_atomically(
        os.path.join(folder, MARKER),
        {
            "step": step,
            "world_size": world_size,
            "zero_stage": zero_stage,
            "files": _files_with_sizes(folder),
        },
    )


def read_marker(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def checkpoint_problem(folder: str) -> str | None:
    """None when `folder` is a complete checkpoint, else the reason it is not."""
    if not os.path.isdir(folder):
        return "not a folder"
    marker = read_marker(folder)
    if marker is None:
        return f"no {MARKER} (the save did not finish: killed or out of disk space)"
    for rel, size in marker["files"].items():
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing"
        if os.path.getsize(path) != size:
            return f"{rel} has {os.path.getsize(path)} bytes, {size} were saved"
    return None


def checkpoints_newest_first(output_dir: str) -> list[str]:
    if not os.path.isdir(output_dir):
        return []
    found = [(step, name) for name in os.listdir(output_dir) if (step := checkpoint_step(name)) is not None]
    return [os.path.join(output_dir, name) for _, name in sorted(found, reverse=True)]


def newest_complete_checkpoint(output_dir: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(newest complete checkpoint or None, [(newer incomplete checkpoint, why)])."""
    skipped = []
    for folder in checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder, skipped
        skipped.append((folder, problem))
    return None, skipped


def resolve_resume_checkpoint(value: str | None, output_dir: str) -> tuple[str | None, list[str]]:
    """`--resume_from_checkpoint` -> (folder to resume from or None, messages for the user).

    `latest`: the newest complete checkpoint in output_dir, skipping incomplete ones; none yet -> a fresh start
    (so the same command line works for the first launch and every restart). A path: must be complete.
    """
    if not value:
        return None, []
    if value == LATEST:
        folder, skipped = newest_complete_checkpoint(output_dir)
        notes = [f"skipping {path}: {why}" for path, why in skipped]
        notes.append(
            f"resuming from {folder}" if folder else f"no complete checkpoint in {output_dir}: starting fresh"
        )
        return folder, notes
    problem = checkpoint_problem(value)
    if problem is None:
        return value, [f"resuming from {value}"]
    if os.path.isfile(os.path.join(value, "trainer_state.json")) and read_marker(value) is None:
        # Saved by another tool (or before markers existed): the Trainer wrote trainer_state.json last.
        return value, [f"resuming from {value} (no {MARKER}: saved elsewhere; trainer_state.json is present)"]
    newest, _ = newest_complete_checkpoint(os.path.dirname(os.path.abspath(value)))
    hint = f"resume from {newest}" if newest else "start without --resume_from_checkpoint"
    raise UserInputError(
        f"--resume_from_checkpoint {value!r} is not a complete checkpoint: {problem}. Fix: {hint}, or pass "
        f"--resume_from_checkpoint {LATEST} to pick the newest complete one."
    )


# ---------------------------------------------------------------- whose optimizer state a checkpoint holds

ENGINE_FLAGS = {
    "trainer": "the plain Trainer (no --ds_config, no --fsdp)",
    "fsdp": "FSDP2 (--fsdp with its --fsdp_config)",
}


def saved_optimizer_engine(folder: str) -> tuple[str | None, int | None]:
    """(engine, ZeRO stage) whose optimizer moments `folder` holds, from its files (the Trainer writes one layout per
    engine) and the marker's ZeRO stage:
    - DeepSpeed: a `latest` file naming a `global_stepN/` folder (ZeRO-0: the moments inside
      mp_rank_00_model_states.pt; 1-3: zero_pp_rank_R_mp_rank_00_optim_states.pt per rank; 3 also shards the model
      states);
    - FSDP2: `optimizer_0/` (sharded state dict) or `optimizer.bin` (full);
    - the plain Trainer and DDP: `optimizer.pt`;
    (None, None) when it holds none: saved with --save_only_model, or the files were removed. A DeepSpeed checkpoint
    saved without our marker gives stage None when its files cannot tell ZeRO-1 from ZeRO-2."""
    tag = universal_tag_folder(folder)
    if tag is not None and os.path.isdir(tag):
        stage = (read_marker(folder) or {}).get("zero_stage")
        if stage is None:  # saved without our marker: stage 3 shards the model states, 1-2 only the optimizer's
            sharded_model = glob.glob(os.path.join(tag, "zero_pp_rank_*_model_states.pt"))
            stage = 3 if sharded_model else (None if glob.glob(os.path.join(tag, "*optim_states.pt")) else 0)
        return "deepspeed", stage
    if os.path.isdir(os.path.join(folder, "optimizer_0")) or os.path.isfile(os.path.join(folder, "optimizer.bin")):
        return "fsdp", None
    if os.path.isfile(os.path.join(folder, "optimizer.pt")):
        return "trainer", None
    return None, None


def engine_words(kind: str | None, stage: int | None) -> str:
    if kind == "deepspeed":
        return f"DeepSpeed ZeRO-{stage if stage is not None else '1 or 2'} (--ds_config)"
    return ENGINE_FLAGS[kind]


def check_optimizer_state(folder: str, kind: str, stage: int | None) -> None:
    """Refuse to resume `folder` with an engine that cannot load its optimizer state: the Trainer would load the
    weights, find no optimizer file of its own layout, and train on from fresh AdamW moments without a word.
    Same engine and ZeRO stage only (offload on or off loads the same files; another world size goes through the
    universal checkpoint, `prepare_world_size_change`)."""
    saved_kind, saved_stage = saved_optimizer_engine(folder)
    asked = engine_words(kind, stage)
    if saved_kind is None:
        raise UserInputError(
            f"--resume_from_checkpoint {folder!r} holds no optimizer state (saved with --save_only_model, or its "
            f"optimizer files were removed): this run ({asked}) would restart the AdamW moments and step count from "
            f"zero. Fix: resume from a checkpoint saved without --save_only_model, or start a new run from its "
            f"weights with --model_name_or_path {folder}."
        )
    same_stage = saved_stage == stage or (saved_stage is None and stage in (1, 2))  # None: unmarked, ZeRO-1 or 2
    if saved_kind == kind and (kind != "deepspeed" or same_stage):
        return
    saved = engine_words(saved_kind, saved_stage)
    raise UserInputError(
        f"--resume_from_checkpoint {folder!r} holds the optimizer state of {saved}, but this run uses {asked}: "
        f"its AdamW moments, step count and schedule position would not be loaded and training would go on from a "
        f"fresh optimizer. Fix: resume with the engine that saved it ({saved}), or start a new run from its weights "
        f"with --model_name_or_path {folder}."
    )


def saved_world_size(folder: str) -> int | None:
    marker = read_marker(folder)
    if marker:
        return marker["world_size"]
    optim = glob.glob(os.path.join(folder, "global_step*", "*optim_states.pt"))
    return len(optim) or None


def universal_tag_folder(folder: str) -> str | None:
    """The DeepSpeed tag folder (global_stepN) the `latest` file names, or None without DeepSpeed files."""
    try:
        with open(os.path.join(folder, "latest"), encoding="utf-8") as f:
            tag = f.read().strip()
    except OSError:
        return None
    return os.path.join(folder, tag)


def convert_to_universal(folder: str) -> str:
    """Run DeepSpeed's converter once (main process); returns the universal folder. Idempotent."""
    tag_folder = universal_tag_folder(folder)
    if tag_folder is None:
        raise UserInputError(f"--resume_from_checkpoint {folder!r} has no DeepSpeed 'latest' file to convert.")
    output = f"{tag_folder}_universal"
    if os.path.isfile(os.path.join(folder, "latest_universal")) and os.path.isdir(output):
        return output
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        tag_folder,
        "--output_folder",
        output,
        "--inject_missing_state",
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"DeepSpeed's universal checkpoint conversion of {tag_folder} failed:\n{proc.stderr[-3000:]}"
        )
    return output


def saved_adam_step(folder: str) -> float | None:
    """The optimizer's step count a ZeRO checkpoint saved (rank 0's partition), or None when it holds none."""
    import torch

    tag = universal_tag_folder(folder)
    files = sorted(glob.glob(os.path.join(tag, "zero_pp_rank_0_*optim_states.pt"))) if tag else []
    if not files:
        return None
    saved = torch.load(files[0], map_location="cpu", weights_only=False, mmap=True)["optimizer_state_dict"]
    state = saved.get("optimizer_state_dict", saved).get("state", {})
    steps = [float(entry["step"]) for entry in state.values() if "step" in entry]
    return steps[0] if steps else None


def needs_universal_checkpoint(folder: str | None, world_size: int, zero_stage: int | None) -> bool:
    """ZeRO 1-3 partition the optimizer state per rank: loading on another world size needs the universal format.
    (ZeRO-0 and plain DDP save the whole optimizer state, which loads on any world size.)"""
    if folder is None or not zero_stage:
        return False
    saved = saved_world_size(folder)
    return saved is not None and saved != world_size


UNIVERSAL_LOADING = {"checkpoint.load_universal": True}  # the DeepSpeed value that loads a universal checkpoint


def prepare_world_size_change(folder: str, world_size: int, is_main: bool) -> str | None:
    """Convert `folder` to a universal checkpoint (main process; the others wait). The caller makes DeepSpeed load
    it: `UNIVERSAL_LOADING` in the run's DeepSpeed dict (`Engine.set_values`), or on an engine already built.
    Returns a message for the user."""
    import torch.distributed as dist

    from hf_vit_scaling.parallel.distributed import is_initialized

    saved = saved_world_size(folder)
    error = None
    if is_main:
        try:
            convert_to_universal(folder)
        except Exception as err:  # reported on every rank below, after the barrier
            error = str(err)
    if is_initialized():
        flag = [error]
        dist.broadcast_object_list(flag, src=0)
        error = flag[0]
    if error:
        raise RuntimeError(error)
    return (
        f"{folder} was saved by {saved} process(es), this run has {world_size}: loading DeepSpeed's universal "
        "checkpoint (converted once, next to the original)"
    )


# ---------------------------------------------------------------- a checkpoint's model weights, loaded strictly
