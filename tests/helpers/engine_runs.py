"""Runs shared by the launched tests: one 2-process run of the recipe per engine, made the first time a test asks
for it and checked many ways (test_recipe_distributed.py: every ds_config trains, saves, reloads, names itself;
test_fsdp.py: every engine's loss at every step and trained weights equal plain DDP's). One run each instead of one
per test keeps `make test` within its budget.

Every run: the same seed, data and schedule (tiny ViT at 16 px on the digits, 12 steps of 2 x 16 images, a loss
logged at every step, an evaluation on 64 images and a checkpoint every 3 steps), built from the preset, so the
engines differ only in where parameters live and in summation order. DeepSpeed configs run under `accelerate
launch` (the README's launcher), DDP and FSDP2 under torchrun."""

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
    """`runs[name]` -> (output_dir, completed process, args): the engine's run, made on first use."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory, self.done = tmp_path_factory, {}

    def __getitem__(self, name: str):
        if name not in self.done:
            launcher, engine_args = ENGINES[name]
            out = self.tmp_path_factory.mktemp(f"engine_{name}")
            args = [*engine_args, *ENGINE_RUN_ARGS]
            self.done[name] = (
                out,
                run([*launcher_cmd(launcher, 2), RECIPE, "--output_dir", out, *TINY_ARGS, *args]),
                args,
            )
        out, proc, args = self.done[name]
        # A failed run is reported to every test that asks for it, and not run again.
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return out, proc, args
