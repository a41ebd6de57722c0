"""recipes/prepare_shards.py in real processes: killed (SIGKILL to its process group, pool workers mid-shard) after
2 shards, a rerun keeps the finished shards untouched and redoes only the rest; bad flags give one error line. The
recipe then trains a few steps from prepared shards (device path) and from variable-size JPEGs (`auto` picks
host_crop)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
from PIL import Image

from tests.helpers.builders import make_prepare_source
from tests.helpers.launchers import PREPARE, error_lines, launch_env, printed_json, run, run_recipe


def _prepare(*args, faults: str | None = None) -> subprocess.CompletedProcess:
    """The prepare command in a new session (so a prepare_sigkill fault kills its process group, workers included)."""
    env = launch_env(**({"HF_VIT_SCALING_FAULTS": faults} if faults else {}))
    return subprocess.run([sys.executable, str(PREPARE), *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, start_new_session=True)  # fmt: skip


def _shards(out) -> dict:
    """{shard path: (inode, mtime_ns)} of the finished shards (temporary files excluded)."""
    folder = out / "train"
    return {
        name: (os.stat(folder / name).st_ino, os.stat(folder / name).st_mtime_ns)
        for name in os.listdir(folder)
        if name.endswith(".parquet")
    }


def test_killed_prepare_resumes_without_redoing_finished_shards(tmp_path):
    make_prepare_source(tmp_path / "src", good_sizes=[(40 + 3 * i, 30 + 2 * i) for i in range(14)])  # 17 files
    args = ["--train_dir", tmp_path / "src", "--output_dir", tmp_path / "out", "--size", 16, "--shard_rows", 2,
            "--num_proc", 2]  # fmt: skip
    killed = _prepare(*args, faults="prepare_sigkill@2")
    assert killed.returncode == -9, killed.stderr[-3000:]
    finished = _shards(tmp_path / "out")
    assert 2 <= len(finished) < 9 and not (tmp_path / "out" / "manifest.json").exists()

    done = _prepare(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = printed_json(done)
    assert (summary["shards_reused"], summary["shards_written"]) == (len(finished), 9 - len(finished))
    after = _shards(tmp_path / "out")
    assert {name: after[name] for name in finished} == finished  # same inode, same mtime: not rewritten
    assert len(after) == 9 and not [p for p in (tmp_path / "out").rglob("*.tmp-*")]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sum(s["rows"] for s in manifest["splits"]["train"]) == 16 and len(manifest["skipped"]) == 1


def test_bad_prepare_flags_give_one_error_line(tmp_path):
    make_prepare_source(tmp_path / "src")
    proc = _prepare("--train_dir", tmp_path / "src", "--dataset_name", "x", "--output_dir", tmp_path / "out")
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1 and "Fix:" in proc.stderr
    assert _prepare("--train_dir", tmp_path / "src", "--output_dir", tmp_path / "out", "--size", 8).returncode == 0
    proc = _prepare("--train_dir", tmp_path / "src", "--output_dir", tmp_path / "out", "--size", 12)
    lines = error_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1 and "size differ" in lines[0] and "Fix:" in lines[0]


def _variable_size_jpegs(root, n_per_class=24) -> None:
    """Two learnable classes (bright left half vs bright right half) as JPEGs of sizes from 20 to 64 px."""
    rng = np.random.default_rng(0)
    for label, name in enumerate(("left", "right")):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n_per_class):
            w, h = (int(v) for v in rng.integers(20, 65, 2))
            pixels = np.full((h, w, 3), 40, np.uint8)
            pixels[:, slice(0, w // 2) if label == 0 else slice(w // 2, w)] = 220
            Image.fromarray(pixels).save(root / name / f"{i}.jpg", quality=90)


def test_recipe_trains_from_variable_size_jpegs_with_host_crop_and_from_prepared_shards(tmp_path):
    _variable_size_jpegs(tmp_path / "jpegs")
    proc = run_recipe(tmp_path / "run_jpegs", "--train_dir", tmp_path / "jpegs", "--max_steps", 3)
    # A CPU-only run: auto timed host_crop and per_sample end to end on this CPU and took the cheaper one.
    chosen = re.search(r"Input path: (\w+) \(images differ in size .*CPU time per image host_crop ([\d.]+) ms, "
                       r"per_sample ([\d.]+) ms", proc.stdout)  # fmt: skip
    assert chosen, proc.stdout[-3000:]
    timed = {"host_crop": float(chosen[2]), "per_sample": float(chosen[3])}
    assert chosen[1] == min(timed, key=timed.get)
    assert "eval_accuracy" in json.loads((tmp_path / "run_jpegs" / "all_results.json").read_text())

    prepared = run([sys.executable, PREPARE, "--train_dir", tmp_path / "jpegs", "--output_dir", tmp_path / "shards",
                    "--size", 20])  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    proc = run_recipe(tmp_path / "run_shards", "--dataset_name", tmp_path / "shards", "--max_steps", 3)
    assert "Input path: device (prepared uint8 shards of 20x20" in proc.stdout
    results = json.loads((tmp_path / "run_shards" / "all_results.json").read_text())
    assert results["train_samples"] + results["eval_samples"] == 48
