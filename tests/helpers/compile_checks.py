"""What ran under `--torch_compile_backend aot_eager`, read from dynamo's counters rather than from the backend's
name the report echoes: aot_eager hands every graph dynamo captures to AOTAutograd (its forward and backward
graphs, then run eagerly); dynamo's plain `eager` backend hands them to nothing. Used by the compile probe
(tests/launched/workers/compile_probe.py) and its test."""


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
