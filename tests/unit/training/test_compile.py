"""Tests `training.compile`: what counts as compiled, per engine, and `CompileEngine` compiling in place the model the
loop trains when the Trainer's own path left it eager (never twice). Real compiles under each engine:
tests/launched/test_compile.py."""

from types import SimpleNamespace

import torch

from hf_vit_scaling.training.compile import CompileEngine, is_compiled


class DeepSpeedEngine(torch.nn.Module):
    """Stands in for deepspeed's engine: `is_compiled` and `compile(backend=, compile_kwargs=)` as in 0.19."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def is_compiled(self) -> bool:
        return bool(self.calls)

    def compile(self, backend, compile_kwargs):
        self.calls.append((backend, compile_kwargs))


def _args(torch_compile=True):
    return SimpleNamespace(torch_compile=torch_compile, torch_compile_backend="inductor", torch_compile_mode=None)


def _begin(model, args) -> CompileEngine:
    callback = CompileEngine(SimpleNamespace(model_wrapped=model))
    callback.on_train_begin(args, None, None)
    return callback


def test_an_eager_model_is_compiled_in_place_and_a_compiled_one_is_left_alone():
    """Fails if the callback skips an eager model under --torch_compile (the silent skip of transformers issues
    23095/34656), replaces it instead of compiling in place (the loop would keep the eager one), compiles one
    accelerate already compiled, or compiles without the flag."""
    model = torch.nn.Linear(2, 2)
    assert not is_compiled(model)
    assert _begin(model, _args()).compiled_here and is_compiled(model)  # the same object
    wrapped = torch.compile(torch.nn.Linear(2, 2))
    assert is_compiled(wrapped) and not _begin(wrapped, _args()).compiled_here
    eager = torch.nn.Linear(2, 2)
    assert not _begin(eager, _args(torch_compile=False)).compiled_here and not is_compiled(eager)


def test_a_deepspeed_engine_is_compiled_through_engine_compile():
    """Fails if a DeepSpeed engine is compiled as a plain module (it must go through `engine.compile`, which keeps
    its hooks in order) or compiled a second time."""
    engine = DeepSpeedEngine()
    assert not is_compiled(engine)
    assert _begin(engine, _args()).compiled_here and engine.calls == [("inductor", {})]
    assert not _begin(engine, _args()).compiled_here and len(engine.calls) == 1
