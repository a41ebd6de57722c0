"""Every rank draws its own augmentation, reproducibly from the seed (`training.seeding`).

Two processes train on a folder of one image copied many times, so the pixels the model sees on a rank differ from
the other rank's only through the random draws (crop, flip, RandAugment, erasing, Mixup/CutMix). `--trace_samples`
records, per rank and step, a fingerprint of the pixels after every input hook. Under sequence parallelism the ranks
of one group draw alike and the groups apart: on the one image, since on different images the groups' pixels differ
whatever they draw (the core tier checks the same on the one image, resumed: test_sequence_parallel_launched.py)."""

import pytest

from tests.helpers.builders import one_image_folder
from tests.helpers.launchers import DS_CONFIGS, run_recipe, sample_trace

STEPS = 4
AUGMENTED = [
    "--train_dir", None, "--image_size", "16", "--random_resized_crop", "true", "--horizontal_flip", "true",
    "--rand_augment", "rand-m9-mstd0.5", "--random_erasing", "0.25", "--mixup_alpha", "0.8", "--cutmix_alpha", "1.0",
    "--drop_path_rate", "0.1", "--trace_samples", "true", "--max_steps", str(STEPS), "--eval_strategy", "no",
    "--per_device_train_batch_size", "8",
]  # fmt: skip


@pytest.mark.distributed
def test_two_ranks_draw_different_augmentations_of_the_same_image(tmp_path):
    args = [str(one_image_folder(tmp_path / "images")) if a is None else a for a in AUGMENTED]
    out = tmp_path / "out"
    run_recipe(out, *args, launcher="torchrun", nproc=2)
    trace = sample_trace(out)
    for step in range(1, STEPS + 1):
        rank0, rank1 = trace[(0, step)]["pixels"], trace[(1, step)]["pixels"]
        assert rank0 != rank1, f"step {step}: both ranks augmented their identical images identically"


@pytest.mark.distributed
def test_sequence_parallel_groups_draw_alike_within_and_apart_across_on_the_same_image(tmp_path):
    """4 processes, --sequence_parallel_size 2 (ZeRO-2): ranks 0-1 are data-parallel rank 0, ranks 2-3 rank 1. On the
    device input path every draw comes from the default generator, so rank 2's pixels differ from rank 0's only if
    its group was reseeded. Fails if every sequence-parallel rank keeps data-parallel rank 0's stream (one seed for
    all groups: `PerRankRandomness` with `seed = None` whenever sequence_parallel_size > 1)."""
    args = [str(one_image_folder(tmp_path / "images")) if a is None else a for a in AUGMENTED]
    out = tmp_path / "out"
    run_recipe(out, *args, "--ds_config", str(DS_CONFIGS / "zero2.json"), "--sequence_parallel_size", "2",
               "--input_path", "device", launcher="torchrun", nproc=4)  # fmt: skip
    trace = sample_trace(out)
    for step in range(1, STEPS + 1):
        group0, group1 = ([trace[(r, step)]["pixels"] for r in ranks] for ranks in ((0, 1), (2, 3)))
        assert group0[0] == group0[1] and group1[0] == group1[1], f"step {step}: a group's ranks drew apart"
        assert group0[0] != group1[0], f"step {step}: both groups augmented their identical images identically"
