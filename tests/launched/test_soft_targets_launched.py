"""Class weights beside Mixup that never mixes: `--mixup_alpha 0.8 --mixup_prob 0 --class_weighting balanced`
trains (hard targets, class-weighted cross-entropy), as the one soft-target predicate decides in the checks, the
augmenter and the choice of loss."""

from tests.helpers.launchers import read_json, run_recipe


def test_class_weighting_trains_beside_mixup_that_never_mixes(tmp_path):
    """Fails if the checks decide soft targets from the alphas alone: the recipe refuses with exit 2."""
    out = tmp_path / "run"
    proc = run_recipe(out, "--max_steps", "2", "--logging_steps", "1",
                      "--mixup_alpha", "0.8", "--mixup_prob", "0", "--class_weighting", "balanced")  # fmt: skip
    assert proc.returncode == 0
    assert read_json(out / "trainer_state.json")["global_step"] == 2
