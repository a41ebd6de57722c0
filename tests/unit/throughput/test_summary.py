"""Tests `throughput.summary`: the per-rank figures summed into the report, the sync-wait estimate."""

import pytest

from hf_vit_scaling.throughput.report import format_report
from hf_vit_scaling.throughput.schema import REPORT_SCHEMA
from hf_vit_scaling.throughput.summary import estimate_sync_wait, summarize
from tests.unit.throughput.figures import SETUP, rank_figures


def test_sync_wait_against_hand_computed_values():
    # Step 1: rank work 1.0 / 3.0 -> rank 0 waits 2.0; step 2: 2.0 / 2.5 -> 0.5. Rank 1 never waits.
    assert estimate_sync_wait([[1.0, 2.0], [3.0, 2.5]]) == pytest.approx([2.5, 0.0])
    assert estimate_sync_wait([[1.0], [1.0], [1.0]]) == [0.0, 0.0, 0.0]


def test_summarize_is_pure_arithmetic_over_the_ranks():
    # Rank 1 is slower: its 4 s is the measured time; 2 x 64 images / 4 s = 32 images/s.
    per_rank = [rank_figures(64, 3.0, [1.0, 1.0]), rank_figures(64, 4.0, [1.5, 2.0], node="other#1")]
    report = summarize(per_rank, SETUP)
    assert report["throughput"]["images_per_s"] == pytest.approx(32.0)
    assert report["setup"]["global_batch_size"] == 8 * 2 * 2 == report["throughput"]["nominal_images_per_step"]
    assert report["setup"]["num_nodes"] == 2 and report["setup"]["tokens_per_image"] == 65
    assert report["ranks"]["slowest_rank"] == 1 and report["ranks"]["spread"] == pytest.approx(1.75)
    assert report["ranks"]["est_sync_wait_s_total"] == pytest.approx(0.5 + 1.0)
    assert report["flops"]["mfu"] == pytest.approx(32.0 * 6e9 / 1e12 / 2)  # per device, peak 1 TFLOP/s
    sp = summarize(per_rank, {**SETUP, "sequence_parallel_size": 2})  # 2 ranks share each image
    assert sp["throughput"]["images_measured"] == 64 and sp["setup"]["global_batch_size"] == 16
    assert sp["setup"]["tokens_per_rank"] == 33
    for section, keys in REPORT_SCHEMA.items():
        assert sorted(report[section]) == sorted(keys), section


def test_mfu_counts_the_teacher_forward_beside_the_student_training_flops():
    # 2 x 64 images over the slowest rank's 4 s = 32 images/s; each costs the student's 6 GFLOP of training and the
    # teacher's 2 GFLOP of forward: 32 x 8e9 = 0.256 TFLOP/s, 0.128 per device against a 1 TFLOP/s peak.
    per_rank = [rank_figures(64, 3.0, [1.0, 1.0]), rank_figures(64, 4.0, [1.5, 2.0])]
    report = summarize(per_rank, {**SETUP, "teacher_forward_flops_per_image": 2 * 10**9})
    flops = report["flops"]
    assert flops["train_flops_per_image"] == 6 * 10**9 and flops["teacher_forward_flops_per_image"] == 2 * 10**9
    assert flops["teacher_flops_fraction"] == pytest.approx(2 / 8)
    assert flops["achieved_tflops_total"] == pytest.approx(32 * 8e9 / 1e12)
    assert flops["mfu"] == pytest.approx(0.128)
    assert "+ teacher 2.000 GFLOP forward/image (25.0% of those counted)" in format_report(report)
    alone = summarize(per_rank, SETUP)["flops"]  # no teacher: the student's FLOPs alone, and the teacher keys null
    assert alone["mfu"] == pytest.approx(32 * 6e9 / 1e12 / 2)
    assert alone["teacher_forward_flops_per_image"] is None and alone["teacher_flops_fraction"] is None
    assert "teacher" not in format_report(summarize(per_rank, SETUP))


def test_sync_and_optimizer_estimate_is_never_negative():
    # Backward cheaper than 2x forward (tiny models, CPU) puts input + 3 x forward above compute: no estimate, and
    # the table says why instead of printing a negative time.
    figures = {**rank_figures(64, 3.0, [1.0]), "compute_mean": 0.05, "forward_mean": 0.02, "input_mean": 0.01}
    report = summarize([figures], SETUP)
    assert report["step_time_s"]["est_sync_and_optimizer_mean"] is None
    table = format_report(report)
    assert "sync + optimizer n/a (compute < input + 3 x forward)" in table and "-0." not in table
    fits = summarize([{**figures, "compute_mean": 0.08}], SETUP)["step_time_s"]["est_sync_and_optimizer_mean"]
    assert fits == pytest.approx(0.08 - 0.01 - 3 * 0.02)
