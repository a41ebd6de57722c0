"""--streaming as real 2-process runs over gloo: coverage of every row per pass, memory that does not grow with the
data set, and an exact resume after a rank is SIGKILLed.

The data are uint8 Parquet shards in the prepare step's format (tests.helpers.make_uint8_shards); rows carry their
global row number, which --trace_samples records per rank and step (with the pass it belongs to).
"""

import json
import os
import shutil
import sys

import pytest

from hf_vit_scaling.training.checkpoints import checkpoint_problem
from tests.helpers.builders import make_uint8_shards
from tests.helpers.launchers import (
    DS_CONFIGS,
    logged_losses,
    read_json,
    run,
    run_recipe,
    sample_trace,
    steps_trained_since,
)

pytestmark = pytest.mark.distributed

ZERO2 = ["--ds_config", str(DS_CONFIGS / "zero2.json")]
FAULTS = "HF_VIT_SCALING_FAULTS"


def streaming_args(root, *args) -> list:
    return ["--streaming", "--dataset_name", str(root), "--random_resized_crop", "false", "--logging_steps", "1",
            "--trace_samples", "true", *args]  # fmt: skip


def trace(output_dir) -> dict:
    """{(rank, step): (pass, rows)}: a resumed run's entry for a step replaces the interrupted run's."""
    return {key: (record["pass"], record["indices"]) for key, record in sample_trace(output_dir).items()}


def rows_by_pass(steps: dict) -> dict:
    """{pass: rows of every rank in that pass}."""
    out = {}
    for (_, _), (pass_index, rows) in steps.items():
        out.setdefault(pass_index, []).extend(rows)
    return out


# --------------------------------------------------------------------------- coverage


@pytest.mark.parametrize("shards", [16, 15])
def test_every_row_once_per_pass_across_two_ranks(tmp_path, shards):
    """16 shards: each rank reads 8 whole shards. 15: not a multiple of 2, so each rank reads every shard and keeps
    one row in two (warned); either way every row is trained on exactly once per pass."""
    rows = 40
    root = make_uint8_shards(tmp_path / "data", shards=shards, rows=rows)
    total = shards * rows
    steps = -(-(total // 2) // 16) * 2  # two passes of the larger rank (16 rows per batch)
    out = tmp_path / "run"
    proc = run_recipe(out, *streaming_args(root, "--max_steps", str(steps), "--shuffle_buffer_size", "50",
                                           "--save_strategy", "no"), launcher="torchrun", nproc=2)  # fmt: skip
    assert ("is not a multiple" in proc.stdout) == (shards % 2 == 1)
    by_pass = rows_by_pass(trace(out))
    assert sorted(by_pass[0]) == list(range(total))  # every row once in pass 0, over both ranks
    assert sorted(by_pass[1]) == list(range(total))
    assert by_pass[0] != by_pass[1]  # a new shard order and buffer draw each pass
    ranks = {r: {i for (rank, _), (p, idx) in trace(out).items() if rank == r and p == 0 for i in idx} for r in (0, 1)}
    assert not ranks[0] & ranks[1]
    if shards == 16:  # whole shards per rank: row // rows is the shard
        assert not {i // rows for i in ranks[0]} & {i // rows for i in ranks[1]}


# --------------------------------------------------------------------------- memory

RSS_PROBE = """
import sys, json
import datasets
import pyarrow.parquet as pq
from hf_vit_scaling.utils import peak_rss_bytes

data = datasets.Dataset(datasets.table.InMemoryTable(pq.read_table(sys.argv[1:])))  # map-style, held in memory
for batch in data.iter(batch_size=256):  # one epoch
    pass
print(json.dumps({"rss_peak_bytes": peak_rss_bytes()}))  # its own peak, not pytest's (see peak_rss_bytes)
"""


def peak_rss(output_dir) -> int:
    return max(r["rss_peak_bytes"] for r in read_json(output_dir / "throughput.json")["memory"]["per_rank"])


def test_peak_memory_does_not_grow_with_the_data_set(tmp_path):
    """One full pass over 20 shards (~30 MB of 64x64x3 uint8 rows) and over 80 shards (~120 MB), 2 processes, the
    default shuffle buffer: each rank's peak RSS (throughput.json) stays within 10%. With 10 shards per rank or
    more, datasets' buffer is fed from 10 open shards at both sizes. The same shards loaded map-style and held in
    memory grow the peak by about the data size: the contrast that shows the check can fail."""
    rows, batch, report = 128, 64, {}
    for scale, shards in (("1x", 20), ("4x", 80)):
        root = make_uint8_shards(tmp_path / scale, shards=shards, rows=rows, size=64)
        steps = shards * rows // 2 // batch  # exactly one pass per rank
        out = tmp_path / f"run{scale}"
        run_recipe(out, *streaming_args(root, "--max_steps", str(steps), "--per_device_train_batch_size", str(batch),
                                        "--save_strategy", "no", "--trace_samples", "false"),
                   launcher="torchrun", nproc=2)  # fmt: skip
        probe = tmp_path / "rss_probe.py"
        probe.write_text(RSS_PROBE)
        files = sorted(str(p) for p in (root / "train").glob("*.parquet"))
        in_memory = run([sys.executable, probe, *files])
        assert in_memory.returncode == 0, in_memory.stderr[-3000:]
        report[scale] = {
            "shards": shards,
            "bytes": sum(os.path.getsize(f) for f in files),
            "streaming_rss_peak_bytes": peak_rss(out),
            "in_memory_rss_peak_bytes": json.loads(in_memory.stdout.strip().splitlines()[-1])["rss_peak_bytes"],
        }
    (tmp_path / "rss_report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    streamed = report["4x"]["streaming_rss_peak_bytes"] / report["1x"]["streaming_rss_peak_bytes"]
    assert streamed < 1.10, report
    grown = report["4x"]["in_memory_rss_peak_bytes"] - report["1x"]["in_memory_rss_peak_bytes"]
    assert grown > 0.5 * (report["4x"]["bytes"] - report["1x"]["bytes"]), report


# --------------------------------------------------------------------------- SIGKILL and resume

# 16 shards x 24 rows, 2 ranks x 2 workers: each worker reads 4 shards (96 rows = 6 batches of 16), a pass is 12
# steps. Checkpoints every 5 steps; rank 1 is killed as step 17 starts, so the resume from checkpoint-15 starts 3
# batches into pass 1 (next batch from worker 1) and replays each worker's stream up to its position.
STEPS, SAVE_EVERY, KILL_AT = 20, 5, 17
KILL_SCHEDULE = ["--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps", str(SAVE_EVERY),
                 "--dataloader_num_workers", "2", "--shuffle_buffer_size", "64"]  # fmt: skip


def test_resume_trains_on_the_same_rows(tmp_path):
    """The uninterrupted run's checkpoint-15 (mid-pass: its data position), copied to a new folder and resumed: the
    resumed processes train steps 16-20 on both ranks and no other (their own trace lines), on the uninterrupted
    run's rows. Fails if the resume is a restart (steps 1-20 again) or starts the pass over. The SIGKILL before a
    resume is test_reliability.py's (ZeRO-2, core)."""
    root = make_uint8_shards(tmp_path / "data", shards=16, rows=24)
    args = [*ZERO2, *streaming_args(root, *KILL_SCHEDULE)]
    reference = tmp_path / "reference"
    run_recipe(reference, *args, launcher="torchrun", nproc=2)

    out = tmp_path / "run"
    shutil.copytree(reference / "checkpoint-15", out / "checkpoint-15")
    assert checkpoint_problem(out / "checkpoint-15") is None
    marker = read_json(out / "checkpoint-15" / "checkpoint_complete.json")["files"]
    assert {"data_position/rank0.json", "data_position/rank1.json"} <= set(marker)  # listed, so checked on resume
    position = read_json(out / "checkpoint-15" / "data_position" / "rank1.json")
    assert (position["pass"], position["next_worker"]) == (1, 1)

    resumed = run_recipe(out, *args, "--resume_from_checkpoint", "latest", launcher="torchrun", nproc=2)
    resumed_steps = list(range(3 * SAVE_EVERY + 1, STEPS + 1))
    assert steps_trained_since(out, {}) == {f"rank{r}.jsonl": resumed_steps for r in (0, 1)}  # not from step 1
    assert f"resuming from {out / 'checkpoint-15'}" in resumed.stdout
    assert "data position: pass 1, 3 batches into it" in resumed.stdout
    assert read_json(out / "trainer_state.json")["global_step"] == STEPS
    ref, got = trace(reference), trace(out)
    assert sorted(got) == sorted(key for key in ref if key[1] in resumed_steps)
    for key in got:  # every rank, every resumed step: the same pass and the same rows in the same order
        assert got[key] == ref[key], f"rank {key[0]} step {key[1]}"
    assert logged_losses(out)[-1] == pytest.approx(logged_losses(reference)[-1], rel=1e-4)
