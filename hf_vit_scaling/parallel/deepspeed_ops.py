"""Build DeepSpeed's CPU ops once, at install time, instead of in the middle of the first run that needs them.

On a machine without a GPU DeepSpeed runs on its CPU accelerator and compiles two C++ ops with g++ the first time a
run asks for them (torch.utils.cpp_extension's JIT build, cached in ~/.cache/torch_extensions):
  - `deepspeed_shm_comm`: the CPU accelerator's shared-memory collectives, loaded by every DeepSpeed run;
  - `cpu_adam`: DeepSpeedCPUAdam, the optimizer of every ZeRO-Offload config.
Each build's time, measured from a fresh clone: ds_configs/README.md, "CPU ops".
The cache is keyed on the build command, which names the virtual environment's include paths: a fresh environment
(a new clone, CI) rebuilds both, and the first ZeRO run of `make train` or of the tests waits a minute for g++.
`make install` runs this module, so that minute is spent once, while installing:

    DS_ACCELERATOR=cpu python -m hf_vit_scaling.parallel.deepspeed_ops

On a GPU machine it builds nothing: DeepSpeed's CUDA ops are its own business (DS_BUILD_OPS at pip install).
"""

import os
import sys
import time

CPU_OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")


def build_cpu_ops(names=CPU_OPS) -> dict[str, float]:
    """{op name: seconds to build or load it} for DeepSpeed's CPU accelerator; an op already built loads in about a
    second. Raises if DeepSpeed cannot build one (no compiler): the run that needs it would fail the same way."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return {}
    seconds = {}
    for name in names:
        builder = accelerator.create_op_builder(name)
        start = time.monotonic()
        builder.load(verbose=False)
        seconds[builder.NAME] = round(time.monotonic() - start, 1)
    return seconds


def main() -> int:
    import torch

    built = {} if torch.cuda.is_available() else build_cpu_ops()  # DS_ACCELERATOR=cuda: build_cpu_ops returns {}
    if not built:
        print("deepspeed_ops: not DeepSpeed's CPU accelerator: no CPU ops to build")
    else:
        print("deepspeed_ops: " + ", ".join(f"{name} ready in {s:.0f} s" for name, s in built.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
