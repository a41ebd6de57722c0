"""`--torch_compile` under every engine: the model the training loop runs is compiled once, after the engine has
wrapped it and before the first step, whichever engine it is.

The Trainer hands `--torch_compile` to accelerate, which compiles the model as it prepares it (`torch.compile` of the
DDP module or the plain model, of the FSDP2 model before `fully_shard`, and `DeepSpeedEngine.compile()` after
`deepspeed.initialize`; the version read: docs/recipe.md, "torch.compile"). Older pairs of transformers and
accelerate dropped it silently under DeepSpeed or FSDP (transformers issues 23095 and 34656), so at `on_train_begin`
`CompileEngine` checks the object the loop trains and compiles it in place where nobody did
(`DeepSpeedEngine.compile()`, or `nn.Module.compile()`: the same object, so the loop's own reference is compiled
too). Whether dynamo really compiled graphs is read from its counters by the throughput report
(`throughput.compilation`), not from this flag.
"""

import torch
from transformers import TrainerCallback

from hf_vit_scaling.log import logger


def is_deepspeed_engine(model) -> bool:
    return type(model).__name__ == "DeepSpeedEngine" or hasattr(model, "is_deepcompile_enabled")


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether `model` (what the training loop calls) runs through torch.compile: a DeepSpeed engine compiled by
    `engine.compile()`, a `torch.compile` wrapper (`OptimizedModule`), or a module compiled in place
    (`nn.Module.compile()` sets `_compiled_call_impl`)."""
    if is_deepspeed_engine(model):
        return bool(getattr(model, "is_compiled", False))
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return True
    return getattr(model, "_compiled_call_impl", None) is not None


def compile_in_place(model: torch.nn.Module, backend: str | None, mode: str | None) -> None:
    """Compile `model` without replacing it: the training loop keeps calling the same object."""
    options = {"mode": mode} if mode is not None else {}
    if is_deepspeed_engine(model):
        model.compile(backend=backend or "inductor", compile_kwargs=options)
    else:
        model.compile(backend=backend or "inductor", **options)


class CompileEngine(TrainerCallback):
    """Under `--torch_compile`, make sure the model the loop trains (`trainer.model_wrapped`: the DeepSpeed engine,
    the DDP module, the FSDP2 model or the plain model) is compiled before the first step; compile it in place if
    the Trainer's own path left it eager. `compiled_here` says whether this callback had to."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.compiled_here = False

    def on_train_begin(self, args, state, control, **kwargs):
        if not args.torch_compile:
            return
        model = self.trainer.model_wrapped
        if is_compiled(model):
            return
        compile_in_place(model, args.torch_compile_backend, args.torch_compile_mode)
        self.compiled_here = True
        logger.info(f"--torch_compile: the Trainer left {type(model).__name__} eager; compiled it in place.")
