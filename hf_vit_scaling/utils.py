"""Generic helpers that know nothing of ViTs or training: a leaf (the standard library only), importable from every
folder, the recipes, the benchmarks and the tests.

- `write_json_atomically`: a JSON file readers see whole or not at all (checkpoint markers, data positions, reports);
- `child_env`: the environment of a child process this project starts (a recipe run, a benchmark arm, a study cell);
- `lazy_exports`: a package's public names imported on first use (PEP 562), so importing one name loads one module;
- `peak_rss_bytes`: this process's own peak resident memory, not its launcher's.

A free TCP port for a launcher's rendezvous is torchrun's own
`torch.distributed.elastic.utils.distributed.get_free_port`."""

import importlib
import json
import os
import resource
import sys

# What a launcher (torchrun, accelerate, deepspeed, srun) exports to its workers: a child started from inside a
# launched process must not inherit them, or a 1-process run waits for a world that never comes.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Never the Hub: tests, benchmarks and the GPU machine have no network (a lookup would wait for its timeouts).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def write_json_atomically(path: str, payload: dict) -> None:
    """Write to a temp file, fsync, rename: readers see the old file or the whole new one, never half."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def child_env(checkout: str | os.PathLike | None = None, **settings: str) -> dict:
    """This process's environment for a child: no launcher's rank variables, then `settings` (`**OFFLINE`: never
    the Hub).
    `checkout`: put this folder first on PYTHONPATH, so the child imports that checkout's hf_vit_scaling (a script's
    own folder, not the working directory, heads sys.path: without it a child imports whichever hf_vit_scaling is
    installed, e.g. an editable install of another checkout)."""
    env = {key: value for key, value in os.environ.items() if key not in LAUNCHER_VARIABLES}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))
    env.update(settings)
    return env


def lazy_exports(package: str, exports: dict[str, str]):
    """A module `__getattr__` (PEP 562) for `package`'s public names: `exports` maps each name to the module that
    defines it (relative to `package`, e.g. ".training.trainer"), imported only when the name is first used."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name], package), name)

    return __getattr__


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes, as the kernel's high-water mark of its own memory (Linux:
    VmHWM in /proc/self/status, in KiB).
    Not `getrusage(RUSAGE_SELF).ru_maxrss`: Linux keeps that across execve, and a child that Python's subprocess
    starts with vfork takes its parent's high-water mark at exec, so a rank or probe started from a large process
    reports at least its parent's peak however little it uses (measured: docs/streaming.md, "Memory").
    Elsewhere (macOS: no /proc) ru_maxrss, which macOS reports in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
