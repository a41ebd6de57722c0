"""The DeepSpeed this session imports trains the recipe: a ZeRO-2 and a ZeRO-3 run on 2 processes, each with the
fast paths this DeepSpeed allows and with DeepSpeed's own code (the switch at 0), log the same losses bit for bit
and record the version. `make test-deepspeed-lowest` runs this file and the fast paths' bit-for-bit tests over
setup.cfg's lowest DeepSpeed (which turns some fast paths off); the highest is the one `make install` puts in."""

import pytest

from hf_vit_scaling.parallel.fast_paths.registry import ENV_SWITCH
from tests.helpers.deepspeed_range import deepspeed_range, installed_deepspeed
from tests.helpers.launchers import DS_CONFIGS, losses_by_step, read_json, run_recipe

pytestmark = [pytest.mark.distributed, pytest.mark.extended]


def test_the_installed_deepspeed_is_an_end_of_the_range():
    """Fails if `make test-deepspeed-lowest` ran over another DeepSpeed than the range's lowest (its PYTHONPATH lost)
    or setup.cfg's range moved without the CI's runs."""
    assert installed_deepspeed() in deepspeed_range()


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_runs_train_the_same_with_and_without_the_fast_paths(tmp_path, stage):
    config = DS_CONFIGS / f"zero{stage}.json"
    args = ["--ds_config", config, "--max_steps", "6", "--logging_steps", "1"]
    fast = run_recipe(tmp_path / "fast", *args, launcher="torchrun", nproc=2)
    own = run_recipe(tmp_path / "own", *args, launcher="torchrun", nproc=2, **{ENV_SWITCH: "0"})
    assert len(losses_by_step(tmp_path / "fast")) == len(losses_by_step(tmp_path / "own")) == 6
    assert losses_by_step(tmp_path / "fast") == losses_by_step(tmp_path / "own")
    setup = read_json(tmp_path / "fast" / "throughput.json")["setup"]
    assert setup["versions"]["deepspeed"] == installed_deepspeed() and setup["zero_stage"] == stage
    assert "on" in setup["deepspeed_fast_paths"].values(), setup["deepspeed_fast_paths"]
    assert set(read_json(tmp_path / "own" / "throughput.json")["setup"]["deepspeed_fast_paths"].values()) == {
        f"off ({ENV_SWITCH}=0)"
    }
    assert (
        f"fast paths (hf_vit_scaling/parallel/fast_paths/README.md, {ENV_SWITCH}=0 turns them off)"
        in fast.stdout + fast.stderr
    )
    assert f"ZeRO-{stage}, 2 process(es))" in own.stdout
