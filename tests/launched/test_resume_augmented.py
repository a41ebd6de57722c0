"""A resume is exact with every random transform on, on every input path, and provably a resume.

Each case trains 12 steps with a checkpoint every 6, copies checkpoint-6 into a new folder (what a run killed after
step 6 leaves) and resumes from it. The resumed run must
- run only steps 7-12 in its own process: its `--trace_samples` file is new, so it lists exactly the steps that
  process trained (a run that silently restarted from step 1 would list 1-12, even with the same final weights);
- see, at every one of those steps, the same rows and the same pixels (the trace's fingerprint of what the model was
  given, after the crop, flip, shift, RandAugment, erasing and Mixup/CutMix) as the uninterrupted run;
- log the same loss at every step after the resume and end with the same weights.

The cases cover the host paths (per_sample, host_crop: their draws are seeded per sample, `data.sample_randomness`),
the device path, prepared shards map-style and streamed, Parquet files of encoded images streamed, DataLoader
workers 0 and 2, 1 and 2 processes, a resume in
the middle of an epoch and one at an epoch boundary. Before the per-sample seeding, the per_sample and host_crop cases
differed from step 7 on.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, Features
from datasets import Image as ImageFeature
from PIL import Image
from safetensors.torch import load_file

from tests.helpers.builders import make_uint8_shards
from tests.helpers.launchers import losses_by_step, run_recipe, sample_trace, side_by_side
from tests.tiers import selected_params

pytestmark = pytest.mark.distributed

STEPS, RESUME_AT = 12, 6
# Every random transform the recipe has, on together (drop path, Mixup/CutMix and erasing draw on the device).
AUGMENTATION = (
    "--random_resized_crop true --horizontal_flip true --random_crop_padding 2 --rand_augment rand-m9-mstd0.5-inc1 "
    "--random_erasing 0.25 --mixup_alpha 0.8 --cutmix_alpha 1.0 --drop_path_rate 0.1"
).split()
SCHEDULE = [
    "--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps", str(RESUME_AT), "--logging_steps", "1",
    "--learning_rate", "1e-3", "--lr_scheduler_type", "constant", "--seed", "7", "--trace_samples", "true",
]  # fmt: skip

# name -> (processes, DataLoader workers, flags). Samples per epoch: 16 images a step per process, so 160 images on
# one process are 10 steps an epoch (step 6 mid-epoch, the resumed run crosses into epoch 1 at step 10), 96 are 6
# (step 6 ends epoch 0), and 192 on two processes are 6.
CASES = {
    "per_sample-1proc-0workers-mid_epoch": (1, 0, ["--input_path", "per_sample", "--max_train_samples", "160"]),
    "per_sample-2proc-2workers-epoch_end": (2, 2, ["--input_path", "per_sample", "--max_train_samples", "192"]),
    "host_crop-1proc-2workers-epoch_end": (1, 2, ["--input_path", "host_crop", "--max_train_samples", "96"]),
    "host_crop-2proc-0workers-mid_epoch": (2, 0, ["--input_path", "host_crop", "--max_train_samples", "160"]),
    "device-1proc-2workers-mid_epoch": (1, 2, ["--input_path", "device", "--max_train_samples", "160"]),
    "shards-1proc-2workers-mid_epoch": (1, 2, ["--input_path", "per_sample", "--dataset_name", "SHARDS"]),
    # 16 shards x 10 rows, 80 rows a rank and pass: 5 steps a pass, so step 6 is one step into pass 1.
    "streamed_shards-2proc-2workers-mid_pass": (2, 2, ["--input_path", "per_sample", "--streaming", "--dataset_name",
                                                       "SHARDS", "--shuffle_buffer_size", "16"]),
    # Parquet files of encoded PNGs (8 x 20 rows), decoded per sample: 10 steps a pass on one process.
    "streamed_files-1proc-2workers-mid_pass": (1, 2, ["--input_path", "per_sample", "--streaming", "--train_files",
                                                      "FILES/train-*.parquet", "--validation_files",
                                                      "FILES/validation.parquet", "--shuffle_buffer_size", "16"]),
}  # fmt: skip


def case_args(name: str, data) -> tuple[int, list[str]]:
    nproc, workers, flags = CASES[name]
    flags = [str(data["shards"]) if flag == "SHARDS" else flag.replace("FILES", str(data["files"])) for flag in flags]
    return nproc, [*AUGMENTATION, *SCHEDULE, "--dataloader_num_workers", str(workers), *flags]


def encoded_parquet_files(root) -> Path:
    """8 Parquet files of 20 encoded 16 px PNGs each (a ClassLabel of 3 classes), and one of 32 for evaluation."""
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=["a", "b", "c"])})
    rng = np.random.default_rng(0)
    for name, files, rows in (("train", 8, 20), ("validation", 1, 32)):
        for part in range(files):
            images = [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(rows)]
            split = Dataset.from_dict({"image": images, "label": [i % 3 for i in range(rows)]}, features=features)
            split.to_parquet(str(root / (f"{name}-{part}.parquet" if name == "train" else f"{name}.parquet")))
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # Shards: 160 training rows, 16 px: a 1-process epoch of 10 steps map-style; 5 steps a pass for each of 2
    # streaming ranks. Files: 160 encoded rows.
    return {"shards": make_uint8_shards(tmp_path_factory.mktemp("shards"), shards=16, rows=10),
            "files": encoded_parquet_files(tmp_path_factory.mktemp("files"))}  # fmt: skip


def uninterrupted_then_resumed(tmp_path, name: str, data):
    nproc, args = case_args(name, data)
    launcher = "torchrun" if nproc > 1 else "python"
    reference, resumed = tmp_path / f"{name}-reference", tmp_path / f"{name}-resumed"
    run_recipe(reference, *args, launcher=launcher, nproc=nproc)
    resumed.mkdir()
    shutil.copytree(reference / f"checkpoint-{RESUME_AT}", resumed / f"checkpoint-{RESUME_AT}")
    run_recipe(resumed, *args, "--resume_from_checkpoint", "latest", launcher=launcher, nproc=nproc)
    return reference, resumed, nproc


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory, data):
    """Every case this session runs (`make test` runs the core ones: tests/tiers.py), two at a time (the 2-process
    ones alone)."""
    tmp = tmp_path_factory.mktemp("resume_augmented")
    cases = selected_params(request, "name")
    one = [name for name in cases if CASES[name][0] == 1]
    two = [name for name in cases if CASES[name][0] == 2]
    done = dict(zip(one, side_by_side(*[lambda n=n: uninterrupted_then_resumed(tmp, n, data) for n in one])))
    done |= {name: uninterrupted_then_resumed(tmp, name, data) for name in two}
    return done


@pytest.mark.parametrize("name", list(CASES))
def test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps(runs, name):
    reference, resumed, nproc = runs[name]
    ref_trace, got_trace = sample_trace(reference), sample_trace(resumed)
    remaining = list(range(RESUME_AT + 1, STEPS + 1))
    for rank in range(nproc):
        assert sorted(step for r, step in got_trace if r == rank) == remaining, f"rank {rank} ran other steps"
        for step in remaining:
            got, ref = got_trace[(rank, step)], ref_trace[(rank, step)]
            assert got["indices"] == ref["indices"], f"rank {rank} step {step}: other rows"
            assert got["pixels"] == ref["pixels"], f"rank {rank} step {step}: other pixels (augmentation draws)"
    ref_losses, got_losses = losses_by_step(reference), losses_by_step(resumed)
    assert [got_losses[s] for s in remaining] == pytest.approx([ref_losses[s] for s in remaining], rel=0, abs=1e-6)
    ref_model, got_model = load_file(reference / "model.safetensors"), load_file(resumed / "model.safetensors")
    differing = [k for k in ref_model if not torch.allclose(got_model[k], ref_model[k], rtol=0, atol=1e-6)]
    assert differing == [], f"{len(differing)}/{len(ref_model)} tensors differ, e.g. {differing[:3]}"
