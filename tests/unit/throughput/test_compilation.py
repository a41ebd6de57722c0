"""Tests `throughput.compilation` and the report's compile section: dynamo's counters as read (pinned on a real
`torch.compile`), the graphs of each step, recompilations after warm-up, the summary over ranks and the printed
line."""

import pytest
import torch

from hf_vit_scaling.throughput.compilation import CompileWatch, dynamo_totals
from hf_vit_scaling.throughput.report import compile_line, format_report
from hf_vit_scaling.throughput.summary import compile_section, summarize
from tests.unit.throughput.figures import SETUP, rank_figures


class _Totals:
    """Stands in for `dynamo_totals`: graphs and compile seconds so far, moved by the test."""

    def __init__(self):
        self.graphs, self.seconds = 0, 0.0

    def __call__(self):
        return self.graphs, self.seconds

    def compile(self, graphs=1, seconds=2.0):
        self.graphs += graphs
        self.seconds += seconds


def test_dynamo_counts_each_new_graph_once_and_a_new_shape_as_a_recompilation():
    """Pins the dynamo internals `dynamo_totals` reads (torch 2.13). Fails if `unique_graphs` stops counting graphs
    (a compiled model would read as eager), if a cached call counts again, or if the compile time is not kept."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.sin(x) * 2, backend="eager", dynamic=False)
    graphs, seconds = dynamo_totals()
    compiled(torch.ones(3))
    after_first = dynamo_totals()
    assert after_first[0] == graphs + 1 and after_first[1] > seconds
    compiled(torch.ones(3))  # same shape: dynamo's cache, no new graph
    assert dynamo_totals()[0] == graphs + 1
    compiled(torch.ones(5))  # a new shape fails the guard: compiled again
    assert dynamo_totals()[0] == graphs + 2


def test_graphs_are_counted_per_step_and_evaluation_graphs_between_steps_are_not():
    """Fails if a graph compiled outside a step (an evaluation's forward) counted as a training recompilation, or if
    the step that compiled last, the warm-up's graphs or its seconds were misread."""
    totals = _Totals()
    watch = CompileWatch(totals)
    for step in range(1, 6):
        watch.begin_step()
        if step in (1, 2):
            totals.compile(seconds=3.0)  # forward at step 1, a guard failed at step 2
        watch.end_step()
        totals.compile(graphs=1, seconds=1.0)  # an evaluation between steps: its own graph
    figures = watch.figures(warmup_steps=2, step_seconds=[4.0, 3.5, 0.5, 0.5, 0.5], step_images=[16] * 5)
    assert figures == {"graphs": 2, "graphs_after_warmup": 0, "last_compile_step": 2, "compile_time_s": 6.0,
                       "warmup_time_s": 7.5, "recompile_steps": [], "graphs_on_new_batch_size": 0}  # fmt: skip
    late = CompileWatch(totals)
    for step in range(1, 5):
        late.begin_step()
        if step == 4:  # a shape change after warm-up
            totals.compile()
        late.end_step()
    after = late.figures(warmup_steps=2, step_seconds=[1.0] * 4, step_images=[16] * 4)
    assert after["graphs_after_warmup"] == 1 and after["last_compile_step"] == 4


def test_a_recompile_on_a_batch_size_the_warm_up_did_not_see_is_called_a_shape_change():
    """Fails if the report cannot tell an epoch's last, partial batch (a new shape) from another guard: the steps
    after warm-up that compiled, with their images, and the graphs that came with an unseen batch size."""
    totals = _Totals()
    watch = CompileWatch(totals)
    images = [32, 32, 32, 32, 32, 23, 32, 32]  # step 6: the epoch's last batch
    for step in range(1, 9):
        watch.begin_step()
        if step in (1, 6, 8):  # step 8: the same batch size as warm-up, another guard
            totals.compile(graphs=2 if step == 6 else 1)
        watch.end_step()
    figures = watch.figures(warmup_steps=2, step_seconds=[1.0] * 8, step_images=images)
    assert figures["graphs_after_warmup"] == 3 and figures["graphs_on_new_batch_size"] == 2
    assert figures["recompile_steps"] == [[6, 23], [8, 32]]
    setup = {**SETUP, "torch_compile": True, "compile_backend": "inductor", "warmup_steps": 2}
    section = compile_section([rank_figures(8, 1.0, [0.1], compile_figures=figures)], setup)
    assert section["recompiles_on_new_batch_size"] == 2 and section["recompile_steps"] == [[6, 23], [8, 32]]
    line = compile_line(section, 2)
    assert "3 recompiled after warm-up (step 6 (23 images), 8 (32 images); 2 of them on a batch size" in line, line
    only_shape = {**section, "recompiles_after_warmup": 2, "recompile_steps": [[6, 23]]}
    shape_change = "(step 6 (23 images): a batch size the warm-up did not see, a shape change; --dataloader_drop_last"
    assert shape_change in compile_line(only_shape, 2)
    guard = {**section, "recompiles_after_warmup": 1, "recompiles_on_new_batch_size": 0, "recompile_steps": [[8, 32]]}
    assert "(step 8 (32 images): the warm-up's batch size, another guard)" in compile_line(guard, 2)


COMPILED = {"graphs": 2, "graphs_after_warmup": 0, "last_compile_step": 1, "compile_time_s": 20.0,
            "warmup_time_s": 25.0}  # fmt: skip


def test_compiled_only_when_every_rank_compiled_whatever_the_flag():
    """Fails if the section trusts the flag, or one rank's graphs, instead of every rank's counters."""
    setup = {**SETUP, "torch_compile": True, "compile_backend": "inductor"}
    both = [rank_figures(8, 1.0, [0.1], compile_figures=COMPILED)] * 2
    section = compile_section(both, setup)
    assert section["compiled"] and section["graphs_per_rank"] == [2, 2] and section["compiled_within_warmup"]
    one = [rank_figures(8, 1.0, [0.1], compile_figures=COMPILED), rank_figures(8, 1.0, [0.1])]
    assert not compile_section(one, setup)["compiled"]
    skipped = compile_section([rank_figures(8, 1.0, [0.1])], setup)  # flag given, nothing compiled
    assert skipped["requested"] and not skipped["compiled"] and skipped["compiled_within_warmup"] is None
    late = {**COMPILED, "graphs_after_warmup": 1, "last_compile_step": 3}
    section = compile_section([rank_figures(8, 1.0, [0.1], compile_figures=late)] * 2, setup)
    assert section["recompiles_after_warmup"] == 1 and section["compiled_within_warmup"] is False  # warm-up: 2


def test_the_printed_report_says_what_compile_did():
    """Fails if a requested but skipped compile prints like a compiled one, or an eager run grows a compile line."""
    setup = {**SETUP, "torch_compile": True, "compile_backend": "inductor"}
    compiled = format_report(summarize([rank_figures(8, 1.0, [0.1], compile_figures=COMPILED)], setup))
    assert "inductor: [2] graph(s) per rank, 0 recompiled after warm-up; 20.0 s compiling" in compiled
    assert "inside the 2 warm-up steps (25.0 s, excluded)" in compiled
    skipped = format_report(summarize([rank_figures(8, 1.0, [0.1])], setup))
    assert "NOT COMPILED" in skipped
    assert "compile " not in format_report(summarize([rank_figures(8, 1.0, [0.1])], SETUP))
    assert compile_line(dict.fromkeys(summarize([rank_figures(8, 1.0, [0.1])], SETUP)["compile"]), 2) is None


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()
