"""`launch_command`: the command line that starts N processes per node through an existing launcher (torchrun,
accelerate, deepspeed; `python` is one process, no launcher). The study's cells, the GPU check and the tests all
build their launches here."""

import sys
from pathlib import Path

LAUNCHERS = ("python", "torchrun", "accelerate", "deepspeed")


def launch_command(
    launcher: str, nproc: int, port: int, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1"
) -> list[str]:
    """The launcher's argv up to the script: `nproc` processes on each of `nnodes` nodes (this one is `node_rank`),
    meeting at `master_addr:port`. torchrun runs as `python -m torch.distributed.run` (what its console script
    does), so it works wherever this Python's torch does; accelerate and deepspeed are the console scripts beside
    this Python."""
    bin_dir = Path(sys.executable).parent
    if launcher == "python":
        return [sys.executable]
    if launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--nnodes",
            str(nnodes),
            "--node_rank",
            str(node_rank),
            "--master_addr",
            master_addr,
            "--master_port",
            str(port),
        ]
    if launcher == "accelerate":
        world = nproc * nnodes
        return [
            str(bin_dir / "accelerate"),
            "launch",
            *(["--multi_gpu"] if world > 1 else []),
            "--num_processes",
            str(world),
            "--num_machines",
            str(nnodes),
            "--machine_rank",
            str(node_rank),
            "--main_process_ip",
            master_addr,
            "--main_process_port",
            str(port),
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ]
    if launcher == "deepspeed":
        return [str(bin_dir / "deepspeed"), "--num_accelerators", str(nproc), "--master_port", str(port)]
    raise ValueError(f"unknown launcher {launcher!r}: one of {', '.join(LAUNCHERS)}")


def accelerate_deepspeed_config(ds_config: str, port: int, nproc: int) -> str:
    """An accelerate config file's text (what `accelerate config` writes) that launches `nproc` CPU processes on this
    machine with accelerate's DeepSpeed plugin naming `ds_config`: the route a user takes with `accelerate launch
    --config_file it.yaml script.py` and no engine flag (ds_configs/README.md)."""
    return (
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
        f"  deepspeed_config_file: {ds_config}\nmachine_rank: 0\nmain_process_port: {port}\nnum_machines: 1\n"
        f"num_processes: {nproc}\nuse_cpu: true\n"
    )
