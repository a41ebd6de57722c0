"""Optimization, in one room: the learning rate for the global batch, per-layer learning rates, the optimizer and
its schedule, built by one builder for every engine.

- `lr_scaling`: the learning rate for the run's global batch (`--lr_scaling` linear or sqrt) and the values a
  DeepSpeed config's own optimizer block must carry too;
- `layer_decay`: BEiT's per-layer learning rates (`--layer_decay`) as the optimizer's parameter groups, and the
  report of the groups the optimizer holds;
- `schedules`: the project's own learning-rate schedules by name (`SCHEDULES`); without one, the Trainer's
  `--lr_scheduler_type`;
- `build`: `Optimization`, the one builder `VitTrainer.create_optimizer` and `create_scheduler` call.

A new schedule is a function and its entry in `schedules.SCHEDULES`, and the flag that names it in
`arguments/engine.py` (`LearningRateArguments`): two files."""
