"""The GPU check's processes: the budget clock, a supervised child with a time limit, the wheels the GPU machine lacks,
and the environment every child gets. Part of benchmarks/gpu_check.py."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpu_check_settings import NEEDED_MODULES, REPO, Settings

# --------------------------------------------------------------------------- processes, packages, budget


class Clock:
    def __init__(self, budget_s: float):
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def log_tail(path: Path, lines: int = 25, chars: int = 2500) -> str:
    """The end of a log; its `error:` lines when it has any (the recipe's one-line user errors)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in text if line.startswith("error:")]
    return "\n".join(errors or text[-lines:])[-chars:]


def stop_group(proc: subprocess.Popen) -> None:
    """End a timed-out command and everything it started (torchrun's workers, loader workers): its process group,
    which it leads (start_new_session), TERM first so torchrun can stop its workers, then KILL."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_process(cmd: list, log: Path, timeout: float, env: dict | None = None) -> tuple[str, int | None]:
    """Run `cmd` from the repository root with its output appended to `log`: ("ok" | "failed" | "timeout", rc).
    `env`: variables set for it on top of this process's."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(
            [str(c) for c in cmd],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            stop_group(proc)
            out.write(f"\n[gpu_check] stopped after its limit of {timeout:.0f} s\n")
            return "timeout", None
    return ("ok" if rc == 0 else "failed"), rc


def prepend_pythonpath(*paths) -> None:
    """Children import this checkout's package (the GPU machine has it installed nowhere) and the installed wheels:
    PYTHONPATH, which the recipe's processes and torchrun's workers inherit."""
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [str(p) for p in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(new + [p for p in current if p not in new])
    for path in reversed(new):
        if path not in sys.path:
            sys.path.insert(0, path)


def ensure_packages(wheels: Path, site: Path, modules=NEEDED_MODULES) -> dict:
    """Install the wheels in `wheels` into `site` when one of `modules` cannot be imported, as the GPU machine's
    documented line does (pip --no-index: nothing is downloaded), and make them importable here and in children."""
    start = time.monotonic()
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    result = {"missing": missing, "wheels": str(wheels), "site": None}
    if not missing:
        return {**result, "status": "ok", "note": f"{', '.join(modules)} already importable: nothing installed"}
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        return {
            **result,
            "status": "failed",
            "error": f"{', '.join(missing)} missing and no wheels in {wheels}. Fix: run ../shared/tools/device-wheels "
            "in the project root before the device call, and carry .whl.",
        }
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *found]  # fmt: skip
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    result.update(site=str(site), installed=[w.name for w in found], seconds=round(time.monotonic() - start, 1))
    if proc.returncode != 0:
        return {**result, "status": "failed", "error": (proc.stdout + proc.stderr)[-2500:]}
    prepend_pythonpath(site)
    importlib.invalidate_caches()
    still = [m for m in modules if importlib.util.find_spec(m) is None]
    if still:
        return {**result, "status": "failed", "error": f"installed, yet {', '.join(still)} cannot be imported"}
    return {**result, "status": "ok"}


def set_child_env(settings: Settings) -> None:
    """What every child process gets (set once in this process's environment, which they inherit): no launcher's
    leftovers (a 1-process run would wait for a world), offline (the GPU machine reaches nothing, and a Hub lookup
    would wait for its timeouts), no FutureWarnings (ZeRO-3 prints one per step, a deprecated torch collective inside
    DeepSpeed, which buries the logs)."""
    from hf_vit_scaling.utils import OFFLINE, child_env  # this checkout's: prepend_pythonpath(REPO) ran first

    # The dry run is a check, not a measurement: one thread per process (unless set), so its 2-process runs and a
    # CI worker beside it do not oversubscribe the cores (each torch process takes every core it finds).
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    cpu = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": threads} if settings.dry_run else {}
    env = child_env(**OFFLINE, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                    PYTHONWARNINGS="ignore::FutureWarning", **cpu)  # fmt: skip
    os.environ.clear()
    os.environ.update(env)
