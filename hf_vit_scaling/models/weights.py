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
