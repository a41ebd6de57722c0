"""`make install` builds DeepSpeed's CPU ops (hf_vit_scaling/parallel/deepspeed_ops.py): the two a CPU run loads,
under the names DeepSpeed's JIT loader gives them, so a run finds them built instead of compiling them."""

import os

import pytest

from hf_vit_scaling.parallel.deepspeed_ops import build_cpu_ops


@pytest.mark.skipif(os.environ.get("DS_ACCELERATOR", "cpu") != "cpu", reason="DeepSpeed's CPU accelerator only")
def test_builds_the_ops_a_cpu_run_loads():
    from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, ShareMemCommBuilder

    built = build_cpu_ops()
    # The names a ZeRO run loads: every DeepSpeed run on the CPU (shared-memory collectives) and ZeRO-Offload's
    # DeepSpeedCPUAdam; a wrong builder name or an op that fails to build fails here (and `make install`).
    assert set(built) == {ShareMemCommBuilder.NAME, CPUAdamBuilder.NAME} == {"deepspeed_shm_comm", "cpu_adam"}
    assert all(seconds >= 0 for seconds in built.values())
