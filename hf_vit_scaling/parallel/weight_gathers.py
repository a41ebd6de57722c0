"""ZeRO-1/2's gather of the updated weights, left in flight between two training steps.

On several CPU processes a ZeRO-1/2 step ends with one all-gather of every rank's updated weights
(`deepspeed_fast_paths`, `zero12_one_param_gather`). Nothing reads the weights until the next forward, and between
the two the Trainer runs its step-end callbacks and loads the next batch: inside `weights_gathered_late` the step
starts the gather and returns, and `finish_weight_gathers` waits for it and writes it into the weights. The Trainer
mixin `FinishesWeightGathers` calls it at the next training step's start, before an evaluation or a prediction, in
a `state_dict()` pre-hook on the model (every save) and, through `WeightGatherWaits` (at the front of the callback
list: only the throughput report, which reads no weight, goes before it), at every Trainer event but those of a
step's edges; it leaves a gather in flight only while every callback is known to leave the weights alone at those
edges (`leaves_weights_alone_at_step_edges`: an EMA callback turns it off). What it saves: benchmarks/README.md,
"Engine overhead"; the same numbers bit for bit, a checkpoint and evaluations between steps included:
tests/launched/test_weights_gathered_late.py.
"""

from __future__ import annotations

import contextlib


class GathersInFlight(list):
    """The finishers of the gathers in flight: each waits for its gather and copies it into the weights."""


MAY_LEAVE_IN_FLIGHT: set[int] = set()  # id() of the flat-buffer lists of optimizers in `weights_gathered_late`
IN_FLIGHT = GathersInFlight()
STEP_EDGE_EVENTS = ("on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log", "on_step_begin")


def finish_weight_gathers() -> None:
    """Wait for every weight gather left in flight and copy it into the weights."""
    while IN_FLIGHT:
        IN_FLIGHT.pop(0)()


@contextlib.contextmanager
def weights_gathered_late(optimizer):
    """Inside: a ZeRO-1/2 step of `optimizer` on several CPU processes starts its gather of the updated weights and
    returns without waiting; `finish_weight_gathers()` completes them (the caller's promise: before anything reads
    a weight). Elsewhere, and for any other optimizer, the gather is waited for in the step as before."""
    key = id(getattr(optimizer, "bit16_groups_flat", optimizer))
    MAY_LEAVE_IN_FLIGHT.add(key)
    try:
        yield
    finally:
        MAY_LEAVE_IN_FLIGHT.discard(key)


def leaves_weights_alone_at_step_edges(callback_class: type) -> bool:
    """Whether a callback of `callback_class` reads no weight at the events between one step's optimizer step and
    the next step's forward: the class says so (`reads_weights_between_steps = False`), it is one of transformers'
    flow and progress callbacks, or it does nothing at those events (TrainerCallback's own methods). It takes the
    class, not the callback: what is asked is the class's, and the callback's own values are none of its business."""
    from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback, TrainerCallback

    if getattr(callback_class, "reads_weights_between_steps", True) is False:
        return True
    if callback_class in (DefaultFlowCallback, PrinterCallback, ProgressCallback):
        return True
    return all(getattr(callback_class, event) is getattr(TrainerCallback, event) for event in STEP_EDGE_EVENTS)


def WeightGatherWaits():  # noqa: N802 (a TrainerCallback made where transformers is imported)
    """A callback for the front of the Trainer's list: every event but the step edges' finishes the gathers in
    flight before the callbacks after it run (an epoch's end, an evaluation's, a save's, the training's end ...)."""
    from transformers import TrainerCallback

    def finishing(args, state, control, **kwargs):
        finish_weight_gathers()

    events = [name for name in vars(TrainerCallback) if name.startswith("on_") and name not in STEP_EDGE_EVENTS]
    return type("WeightGatherWaits", (TrainerCallback,), {name: staticmethod(finishing) for name in events})()


class FinishesWeightGathers:
    """Trainer mixin (before the Trainer in the bases): a DeepSpeed ZeRO-1/2 step's weight gather left in flight
    while the next batch loads, finished before anything reads the weights (the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.callback_handler.callbacks.insert(0, WeightGatherWaits())
        if self.model is not None:  # every save reads the weights through it
            self.model.register_state_dict_pre_hook(lambda *args: finish_weight_gathers())

    def training_step(self, model, inputs, num_items_in_batch=None):
        finish_weight_gathers()  # the previous step's, loaded beside this step's batch
        engine = self.deepspeed if self.is_deepspeed_enabled else None
        callback_classes = map(type, self.callback_handler.callbacks)
        late = engine is not None and all(map(leaves_weights_alone_at_step_edges, callback_classes))
        with weights_gathered_late(engine.optimizer) if late else contextlib.nullcontext():
            return super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)

    def evaluate(self, *args, **kwargs):
        finish_weight_gathers()
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        finish_weight_gathers()
        return super().predict(*args, **kwargs)
