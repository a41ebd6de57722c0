"""Tests `parallel.weight_gathers` without a process group: which callbacks let a ZeRO-1/2 step leave its weight
gather in flight, and which Trainer events finish it. Whole runs: tests/launched/test_weights_gathered_late.py."""

from hf_vit_scaling.parallel import weight_gathers as gathers


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
    assert alone(ThroughputCallback)  # it says so
    assert not alone(AtStepEnd) and not alone(EMACallback)


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
