"""Tests `parallel.fast_paths.weight_gathers` without a process group: which callbacks let a ZeRO-1/2 step leave
its weight gather in flight, and which Trainer events finish it. Whole runs:
tests/launched/test_weights_gathered_late.py."""

from hf_vit_scaling.parallel.fast_paths import weight_gathers as gathers


def test_weights_gathered_late_only_past_callbacks_that_leave_the_weights_alone():
    """Which callbacks let a ZeRO-1/2 step leave its weight gather in flight: transformers' flow and progress
    callbacks, those that say so, those without step-edge events; not one that reads the weights at a step's end
    (EMA) or an unknown one with step-edge events."""
    from transformers.trainer_callback import DefaultFlowCallback, ProgressCallback, TrainerCallback

    from hf_vit_scaling.regularization.ema import EMACallback
    from hf_vit_scaling.throughput.timing import ThroughputCallback

    class AtTrainEnd(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            pass

    class AtStepEnd(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            pass

    alone = gathers.leaves_weights_alone_at_step_edges
    assert all(alone(c) for c in (DefaultFlowCallback, ProgressCallback, AtTrainEnd))
    assert alone(ThroughputCallback)  # listed
    assert not alone(AtStepEnd) and not alone(EMACallback)
    gathers.leave_weights_alone(AtStepEnd, "nothing: a test's")
    try:
        assert alone(AtStepEnd)
    finally:
        del gathers.LEAVE_WEIGHTS_ALONE[gathers.qualified_name(AtStepEnd)]


def test_every_callback_the_list_names_exists():
    """A renamed or moved callback would drop out of the list in silence (its gathers then always waited for)."""
    import importlib

    from transformers import TrainerCallback

    for name in gathers.LEAVE_WEIGHTS_ALONE:
        module, _, qualname = name.rpartition(".")
        callback_class = getattr(importlib.import_module(module), qualname, None)
        assert isinstance(callback_class, type) and issubclass(callback_class, TrainerCallback), name
        assert gathers.leaves_weights_alone_at_step_edges(callback_class), name


def test_every_trainer_event_but_a_step_s_edges_finishes_the_gathers_in_flight(monkeypatch):
    monkeypatch.setattr(gathers, "IN_FLIGHT", gathers.GathersInFlight())
    waits, finished_by_event = gathers.WeightGatherWaits(), {}
    for event in ("on_step_end", "on_pre_optimizer_step", "on_optimizer_step", "on_log", "on_step_begin",
                  "on_save", "on_evaluate", "on_epoch_end", "on_train_end", "on_predict"):  # fmt: skip
        gathers.IN_FLIGHT.append(lambda: None)
        getattr(waits, event)(None, None, None, model=None)
        finished_by_event[event] = not gathers.IN_FLIGHT
        gathers.finish_weight_gathers()
    assert {event for event, finished in finished_by_event.items() if not finished} == set(gathers.STEP_EDGE_EVENTS)
