"""ZeRO-1/2's gather of the updated weights, left in flight between two training steps.

On several CPU processes a ZeRO-1/2 step ends with one all-gather of every rank's updated weights
(`deepspeed_fast_paths`, `zero12_one_param_gather`). Nothing reads the weights until the next forward, and between
the two the Trainer runs its step-end callbacks and loads the next batch: inside `weights_gathered_late` the step
starts the gather and returns, and `finish_weight_gathers` waits for it and writes it into the weights. The Trainer
mixin `FinishesWeightGathers` calls it at the next training step's start, before an evaluation or a prediction, in
a `state_dict()` pre-hook on the model (every save) and, through `WeightGatherWaits` (at the front of the callback
list: only the throughput report, which reads no weight, goes before it), at every Trainer event but those of a
step's edges; `attach_weight_gather_waits` puts both in place (the Trainer calls it where its features attach). It
leaves a gather in flight only while every callback is known to leave the weights alone at those edges
(`LEAVE_WEIGHTS_ALONE`, the one list of them; an EMA callback, or any callback not in it that acts at those edges,
turns it off). What it saves: benchmarks/README.md,
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
# The callbacks that read no weight at a step's edges (between one step's optimizer step and the next forward), by
# qualified name, with what they do read there. Besides these, a callback with no method for those events leaves the
# weights alone too; any other (an EMA, a user's) makes every step wait for its gather. A benchmark's own callbacks
# join with `leave_weights_alone`.
LEAVE_WEIGHTS_ALONE: dict[str, str] = {
    "transformers.trainer_callback.DefaultFlowCallback": "the Trainer's flow flags",
    "transformers.trainer_callback.PrinterCallback": "the logs",
    "transformers.trainer_callback.ProgressCallback": "the logs, for the progress bar",
    "hf_vit_scaling.throughput.timing.ThroughputCallback": "clocks and the logs",
    "hf_vit_scaling.training.faults.FaultInjector": "signals and sleeps",
    "hf_vit_scaling.training.nonfinite.NonFiniteLossPolicy": "its non-finite flag",
    "hf_vit_scaling.training.interruption.StopOnSignal": "the signal flag",
}


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


def qualified_name(callback_class: type) -> str:
    return f"{callback_class.__module__}.{callback_class.__qualname__}"


def leave_weights_alone(callback_class: type, what_it_reads: str) -> type:
    """Add a callback class defined outside the package (a benchmark's) to `LEAVE_WEIGHTS_ALONE`; return it."""
    LEAVE_WEIGHTS_ALONE[qualified_name(callback_class)] = what_it_reads
    return callback_class


def leaves_weights_alone_at_step_edges(callback_class: type) -> bool:
    """Whether a callback of `callback_class` reads no weight at the events between one step's optimizer step and
    the next step's forward: it is in `LEAVE_WEIGHTS_ALONE`, or it does nothing at those events (TrainerCallback's
    own methods). It takes the class, not the callback: what is asked is the class's."""
    from transformers.trainer_callback import TrainerCallback

    if qualified_name(callback_class) in LEAVE_WEIGHTS_ALONE:
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


def attach_weight_gather_waits(trainer) -> None:
    """`WeightGatherWaits` at the front of `trainer`'s callbacks, and a `state_dict()` pre-hook on its model (every
    save reads the weights through it) that finishes the gathers in flight."""
    trainer.callback_handler.callbacks.insert(0, WeightGatherWaits())
    if trainer.model is not None:
        trainer.model.register_state_dict_pre_hook(lambda *args: finish_weight_gathers())


class FinishesWeightGathers:
    """Trainer mixin (before the Trainer in the bases): a DeepSpeed ZeRO-1/2 step's weight gather left in flight
    while the next batch loads, finished at the next step's start, an evaluation or a prediction (the module
    docstring); what waits at the other events is `attach_weight_gather_waits`'s."""

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
