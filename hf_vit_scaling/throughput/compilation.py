"""What `torch.compile` did in this process, read from dynamo's own counters (not from `--torch_compile`): a flag
that was accepted but never reached the model leaves them at zero.

dynamo's counters are totals for the process; `CompileWatch` takes them at the start and end of every training step,
so each step's new graphs and compile seconds are known (graphs compiled by an evaluation between steps are not
counted: an evaluation's forward is another graph, not a recompilation of the training one). A graph compiled after
the warm-up steps is a recompilation on a shape or guard the first steps did not see (0 on a fixed shape); one in a
step whose batch size no warm-up step had (an epoch's last, partial batch) is said to be a shape change.
"""


def dynamo_totals() -> tuple[int, float]:
    """(graphs dynamo has compiled in this process, seconds it spent compiling them, backward graphs included).

    `counters["stats"]["unique_graphs"]` grows by one per graph dynamo hands to its backend (a new frame, or a
    recompilation after a failed guard); `calculate_time_spent()["total_wall_time"]` is the forward and backward
    compile time (dynamo tracing + the backend, e.g. inductor's C++ kernels). Both are internals of torch._dynamo
    (pinned by tests/unit/throughput/test_compilation.py); (0, 0.0) where they are missing."""
    try:
        from torch._dynamo.utils import calculate_time_spent, counters
    except ImportError:  # a torch without dynamo: nothing was compiled
        return 0, 0.0
    return int(counters["stats"]["unique_graphs"]), float(calculate_time_spent().get("total_wall_time", 0.0))


class CompileWatch:
    """New graphs and compile seconds of each training step of this rank (`begin_step` / `end_step`)."""

    def __init__(self, totals=dynamo_totals):
        self.totals = totals
        self.graphs: list[int] = []  # graphs compiled within each step
        self.seconds: list[float] = []  # compile seconds within each step
        self._at_begin = None

    def begin_step(self) -> None:
        self._at_begin = self.totals()

    def end_step(self) -> None:
        if self._at_begin is None:
            return
        graphs, seconds = self.totals()
        self.graphs.append(graphs - self._at_begin[0])
        self.seconds.append(max(0.0, seconds - self._at_begin[1]))
        self._at_begin = None

    def figures(self, warmup_steps: int, step_seconds: list[float], step_images: list[int]) -> dict:
        """This rank's compile figures for the report (`summary.compile_section`): graphs in all steps and after
        warm-up, the last step (1-based) that compiled one, compile seconds, and the wall seconds of the warm-up
        steps (`step_seconds`: each step's compute + data wait), which the steady-state figures leave out.
        `step_images` (the images each step trained on, one per step as `graphs`): the steps after warm-up that
        compiled, as [step, images], and how many of their graphs came with a batch size no warm-up step had."""
        compiled_in = [i + 1 for i, count in enumerate(self.graphs) if count > 0]
        late = [i for i in range(warmup_steps, len(self.graphs)) if self.graphs[i] > 0]
        seen = set(step_images[:warmup_steps])
        return {
            "graphs": sum(self.graphs),
            "graphs_after_warmup": sum(self.graphs[warmup_steps:]),
            "last_compile_step": compiled_in[-1] if compiled_in else None,
            "compile_time_s": float(sum(self.seconds)),
            "warmup_time_s": float(sum(step_seconds[:warmup_steps])),
            "recompile_steps": [[i + 1, step_images[i]] for i in late],
            "graphs_on_new_batch_size": sum(self.graphs[i] for i in late if step_images[i] not in seen),
        }
