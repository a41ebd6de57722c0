"""Building a model whole on this rank while the Trainer's ZeRO-3 config is active (`zero3_init_off`): for a
distillation teacher, which every rank needs all of, and for the meta-device model a CNN's FLOPs are counted on."""

import contextlib


@contextlib.contextmanager
def zero3_init_off():
    """Inside, transformers builds models whole on this rank even while the Trainer's ZeRO-3 config is active.

    While an `HfDeepSpeedConfig` of stage 3 is alive (the Trainer makes one), transformers builds every model
    `from_config` / `from_pretrained` under `deepspeed.zero.Init`, partitioned over the ranks: right for the student,
    wrong for a distillation teacher (each rank needs all of it) and for a model built on the meta device only to
    count its FLOPs (an empty partition has no shape: the first convolution fails). The config's weak reference is
    set aside here and put back after.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if config is not None:
            hf_deepspeed.set_hf_deepspeed_config(config)
