"""The model's hooks run in the documented order: device preprocessing first, so every later hook sees float
pixels at the model's size; submodule hooks (sequence parallelism) after every model-level pre-hook."""

import torch
from transformers import ViTForImageClassification

from hf_vit_scaling.data.device_transforms import DevicePreprocessor
from hf_vit_scaling.training.model_hooks import attach_model_hooks
from tests.helpers.builders import tiny_vit_config


class Recorder:
    """Stands in for a hook owner: records what its pre-hook sees, on the model or one of its submodules."""

    def __init__(self, log: list, name: str, submodule: str | None = None):
        self.log, self.name, self.submodule = log, name, submodule

    def attach(self, model):
        module = model.get_submodule(self.submodule) if self.submodule else model

        def pre(module, args, kwargs):
            pixels = kwargs.get("pixel_values", args[0] if args else None)
            self.log.append((self.name, pixels.dtype, tuple(pixels.shape[-2:])))

        return module.register_forward_pre_hook(pre, with_kwargs=True)


def test_hooks_see_preprocessed_pixels_in_order():
    config = tiny_vit_config(image_size=16)
    model = ViTForImageClassification(config).train()
    log = []
    preprocessor = DevicePreprocessor(16, [0.5] * 3, [0.5] * 3)
    attach_model_hooks(model, preprocessor, sequence_parallel=Recorder(log, "sp", "vit.embeddings"),
                       slow_rank=Recorder(log, "slow"))  # fmt: skip
    uint8 = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)  # stored size 8 px, model size 16 px
    model(pixel_values=uint8, labels=torch.tensor([0, 1]))
    assert log == [("slow", torch.float32, (16, 16)), ("sp", torch.float32, (16, 16))]
