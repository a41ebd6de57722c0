"""The project's own learning-rate schedules, by name. Each entry builds a `torch.optim.lr_scheduler.LRScheduler`
from (optimizer, num_warmup_steps, num_training_steps, **kwargs), as transformers' `get_scheduler` builds its own:
`build.Optimization.scheduler` builds the one named for the run, with the Trainer's warmup (`--warmup_steps`) and
`--lr_scheduler_kwargs`, for every engine (DeepSpeed steps the Trainer's schedule when its config has no
"scheduler" block). A run that names none gets the Trainer's `--lr_scheduler_type`.

A new schedule: its function here and its entry in `SCHEDULES`; the flag that names it goes in
`arguments/engine.py` (`LearningRateArguments`, its choices: `SCHEDULES`).
"""

from collections.abc import Callable

import torch

ScheduleBuilder = Callable[..., torch.optim.lr_scheduler.LRScheduler]

SCHEDULES: dict[str, ScheduleBuilder] = {}
