"""Runs shared by the launched tests: one 2-process run of the recipe per engine, made the first time a test asks
for it and checked many ways (test_recipe_distributed.py: every ds_config trains, saves, reloads, names itself;
test_fsdp.py: every engine's loss at every step and trained weights equal plain DDP's). One run each instead of one
per test keeps `make test` within its budget.

Every run: the same seed, data and schedule (tiny ViT at 16 px on the digits, 12 steps of 2 x 16 images, a loss
logged at every step, an evaluation on 64 images and a checkpoint every 3 steps), built from the preset, so the
engines differ only in where parameters live and in summation order. DeepSpeed configs run under `accelerate
launch` (the README's launcher), DDP and FSDP2 under torchrun."""

import json
import os
import subprocess
from pathlib import Path

from filelock import FileLock

from tests.helpers.launchers import DS_CONFIGS, RECIPE, TINY_ARGS, fsdp_args, launcher_cmd, run

ENGINE_STEPS = 12
# An evaluation and a checkpoint every 3 steps: test_conformance.py resumes from checkpoint-6, and a resumed run
# keeps the checkpoint's save and evaluation intervals (the Trainer restores them from trainer_state.json).
CHECK_EVERY = 3
ENGINE_RUN_ARGS = [
    "--max_steps", str(ENGINE_STEPS), "--logging_steps", "1", "--save_strategy", "steps",
    "--save_steps", str(CHECK_EVERY), "--eval_strategy", "steps", "--eval_steps", str(CHECK_EVERY),
    "--max_eval_samples", "64",
    "--random_resized_crop", "false",
]  # fmt: skip
ENGINES = {
    "ddp": ("torchrun", []),
    **{path.stem: ("accelerate", ["--ds_config", str(path)]) for path in sorted(DS_CONFIGS.glob("*.json"))},
    "fsdp2": ("torchrun", fsdp_args("fsdp2")),
    "fsdp2_sharded": ("torchrun", fsdp_args("fsdp2_sharded")),
}


class EngineRuns:
    """`runs[name]` -> (output_dir, completed process, args): the engine's run, made on first use.

    Under pytest-xdist (`make test`: 2 workers) the workers share the runs: each is made once, in a folder both see
    (the session's base temp folder), by the first worker that asks, under a file lock; the other waits for it and
    reads the same folder and output. Without that, each worker that runs a file asking for an engine made it again."""

    def __init__(self, tmp_path_factory, shared_root: Path | None = None):
        self.tmp_path_factory, self.shared_root, self.done = tmp_path_factory, shared_root, {}

    def __getitem__(self, name: str):
        if name not in self.done:
            self.done[name] = self._shared(name) if self.shared_root is not None else self._make(name, None)
        out, proc, args = self.done[name]
        # A failed run is reported to every test that asks for it, and not run again.
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return out, proc, args

    def _make(self, name: str, out: Path | None):
        launcher, engine_args = ENGINES[name]
        out = out or self.tmp_path_factory.mktemp(f"engine_{name}")
        args = [*engine_args, *ENGINE_RUN_ARGS]
        return out, run([*launcher_cmd(launcher, 2), RECIPE, "--output_dir", out, *TINY_ARGS, *args]), args

    def _shared(self, name: str):
        self.shared_root.mkdir(parents=True, exist_ok=True)
        record = self.shared_root / f"{name}.json"
        with FileLock(str(self.shared_root / f"{name}.lock")):
            if not record.exists():
                out, proc, args = self._make(name, self.shared_root / name)
                record.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                              "stderr": proc.stderr, "args": [str(a) for a in args]}))  # fmt: skip
        saved = json.loads(record.read_text())
        proc = subprocess.CompletedProcess(name, saved["returncode"], saved["stdout"], saved["stderr"])
        return self.shared_root / name, proc, saved["args"]


def engine_runs_for(tmp_path_factory) -> EngineRuns:
    """This session's runs: shared by the pytest-xdist workers of one `pytest -n` run, else its own."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return EngineRuns(tmp_path_factory)
    return EngineRuns(tmp_path_factory, tmp_path_factory.getbasetemp().parent / "engine_runs")
