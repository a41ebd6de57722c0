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
"""

import glob
import json
import os
import re
import subprocess
import sys

from hf_vit_scaling.errors import UserInputError

MARKER = "checkpoint_complete.json"
LATEST = "latest"  # --resume_from_checkpoint latest: the newest complete checkpoint in output_dir
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def _files_with_sizes(folder: str) -> dict[str, int]:
    sizes = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel != MARKER and "_universal" not in rel:
                sizes[rel] = os.path.getsize(path)
    return sizes


def write_json_atomically(path: str, payload: dict) -> None:
    """Write to a temp file, fsync, rename: readers see the old file or the whole new one, never half."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    found = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := _CHECKPOINT_RE.match(name))]
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


def needs_universal_checkpoint(folder: str | None, world_size: int, zero_stage: int | None) -> bool:
    """ZeRO 1-3 partition the optimizer state per rank: loading on another world size needs the universal format.
    (ZeRO-0 and plain DDP save the whole optimizer state, which loads on any world size.)"""
    if folder is None or not zero_stage:
        return False
    saved = saved_world_size(folder)
    return saved is not None and saved != world_size


def prepare_world_size_change(folder: str, training_args, world_size: int, is_main: bool) -> str | None:
    """Convert `folder` to a universal checkpoint (main process; the others wait) and make DeepSpeed load it.
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
    # TrainingArguments holds the loaded config; the Trainer builds the engine from it when train() starts.
    training_args.hf_deepspeed_config.config.setdefault("checkpoint", {})["load_universal"] = True
    return (
        f"{folder} was saved by {saved} process(es), this run has {world_size}: loading DeepSpeed's universal "
        "checkpoint (converted once, next to the original)"
    )
