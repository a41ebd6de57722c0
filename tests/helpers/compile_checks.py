"""What ran under `--torch_compile_backend aot_eager`, read from dynamo's counters rather than from the backend's
name the report echoes: aot_eager hands every graph dynamo captures to AOTAutograd (its forward and backward
graphs, then run eagerly); dynamo's plain `eager` backend hands them to nothing. Used by the compile probe
(tests/launched/workers/compile_probe.py) and the tests that read it: the plain Trainer's in test_compile.py, every
2-process engine's in test_conformance.py's compiled arm."""

# Graphs dynamo compiles inside the training steps on each rank with aot_eager (setup.cfg's torch), input hooks' graphs
# included: a change is a change in what is compiled (a graph break more or less), to be read in the probe's frames.
# ZeRO-3: 9 since the tiny model is kept whole on 2 processes and its per-module gather hooks are gone (14 with them).
GRAPHS_PER_RANK = {"plain": 2, "ddp": 2, "zero2": 2, "zero3": 9, "fsdp2": 5, "fsdp2_sharded": 5}
# Engines whose hooks stay outside the model's forward: the forward compiles as one graph, with no graph break (a
# `.item()`, a device sync or an untraceable hook inside it would split it and show in dynamo's graph_break counter).
# ZeRO-3's gather hooks and FSDP2's unshard hooks break the graph at each wrapped submodule by design.
ONE_GRAPH_FORWARD = {"plain", "ddp", "zero2"}
# accelerate compiles the DDP wrapper, so dynamo traces DDP.forward too and breaks in it, before the model's forward
# (torch/nn/parallel/distributed.py: `_inside_ddp_forward` is on dynamo's skip list; `Logger.set_runtime_stats_and_log`
# is C++): breaks with these reasons are the wrapper's, outside the model's graph.
WRAPPER_BREAKS = {"ddp": ("set_runtime_stats_and_log", "DistributedDataParallel._inside_ddp_forward")}


def aot_autograd_graphs() -> int:
    """Graphs AOTAutograd compiled in this process (dynamo's `counters["aot_autograd"]["ok"]`)."""
    from torch._dynamo.utils import counters

    return int(counters["aot_autograd"]["ok"])


def assert_aot_eager_ran(probe: dict, model_graphs: int, rank: int = 0) -> None:
    """Every model graph the probe recorded went through AOTAutograd: the backend that ran is aot_eager's."""
    assert probe["aot_autograd_graphs"] >= model_graphs > 0, (
        f"rank {rank}: {probe['aot_autograd_graphs']} graphs went through AOTAutograd for {model_graphs} model "
        "graphs: the backend that ran is not aot_eager"
    )


def wrapper_break(name: str, reason: str) -> bool:
    return any(method in reason for method in WRAPPER_BREAKS.get(name, ()))


def assert_compiled_on_every_rank(name: str, facts: dict, ranks: list[dict], modes: int = 1) -> None:
    """`facts`: the run's throughput.json `compile` section; `ranks`: each rank's compile probe record; `modes`: 2
    for a run that also evaluates (`model.eval()` fails dynamo's guard on `training`: the forward is compiled again,
    as one graph of its own). Fails if a rank left the model eager (the object the loop trains not compiled, no graph
    traced from the model's forward), another backend than aot_eager ran, the forward of an engine whose hooks stay
    outside it is not one graph per mode, the graph count per rank in the training steps moved, or anything
    recompiled after the warm-up."""
    assert facts["requested"] and facts["backend"] == "aot_eager", facts
    assert facts["compiled"], ("--torch_compile accepted but nothing compiled", facts)
    for rank, probe in enumerate(ranks):
        assert probe["loop_model_compiled"], f"rank {rank}: the {probe['loop_model']} the loop trains is not compiled"
        model_graphs = [f for f in probe["frames"] if f["model_forward"] and f["graph_ops"] > 0]
        assert model_graphs, (f"rank {rank}: no graph traced from {probe['model']}.forward; compiled frames: "
                              f"{[(f['function'], f['file'], f['graph_ops']) for f in probe['frames']]}")  # fmt: skip
        assert_aot_eager_ran(probe, len(model_graphs), rank)  # the backend that ran, not the name asked for
        if name in ONE_GRAPH_FORWARD:
            resumed = [f["function"] for f in probe["frames"] if f["resumed_in_model"]]
            breaks = [reason for reason in probe["graph_breaks"] if not wrapper_break(name, reason)]
            assert len(model_graphs) <= modes and not resumed and not breaks, (
                f"rank {rank}: the model's forward is not one graph: {len(model_graphs)} graphs, resumed after a "
                f"graph break in {resumed}, graph breaks {breaks}"
            )
    assert facts["graphs_per_rank"] == [GRAPHS_PER_RANK[name]] * len(ranks), facts
    assert facts["recompiles_after_warmup"] == 0 and facts["compiled_within_warmup"], facts
