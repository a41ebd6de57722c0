"""Reading a checkpoint's tensors, and naming its keys in an error: shared by fine-tuning (`presets`) and by the
strict loads of resume, the best model and the EMA (`training.checkpoints`)."""

SHOWN_KEYS = 3  # an error names this many keys of each kind, then says how many more


def read_state_dict(files: list[str]) -> dict:
    """Every tensor of `files` on the CPU (safetensors, or `weights_only` torch loading)."""
    import torch
    from safetensors.torch import load_file

    state_dict = {}
    for path in files:
        if path.endswith(".safetensors"):
            state_dict.update(load_file(path, device="cpu"))
        else:
            state_dict.update(torch.load(path, map_location="cpu", weights_only=True))
    return state_dict


def some_keys(keys) -> str:
    """The first SHOWN_KEYS of `keys` in sorted order, and how many more there are."""
    keys = sorted(keys)
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(keys[:SHOWN_KEYS]) + more


def loading_problems(info: dict) -> str | None:
    """`from_pretrained(..., output_loading_info=True)`'s report as one phrase, or None when every tensor of the
    model came from the checkpoint and every checkpoint tensor went into the model (transformers only warns)."""
    kinds = (("missing", "missing_keys"), ("unexpected", "unexpected_keys"), ("of another shape", "mismatched_keys"))
    parts = []
    for words, key in kinds:
        keys = [k[0] if isinstance(k, tuple) else k for k in info.get(key) or ()]
        if keys:
            parts.append(f"{len(keys)} {words} ({some_keys(keys)})")
    return "; ".join(parts) or None


def from_pretrained_strictly(model_cls, path: str, error_cls, what: str, fix: str, **kwargs):
    """`model_cls.from_pretrained(path)`, every tensor or `error_cls` naming the keys: `from_pretrained` fills a
    tensor missing from the checkpoint with random values and only warns."""
    model, info = model_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    problem = loading_problems(info)
    if problem:
        raise error_cls(f"{what} {path!r} does not hold every tensor of its model: {problem}. Fix: {fix}")
    return model
