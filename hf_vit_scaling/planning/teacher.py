"""The distillation teacher a plan carries (`--teacher_model`): what it adds to every rank's memory and step.

The recipe loads the teacher once per process, whole, in the run's precision, outside DeepSpeed and FSDP
(`training.distillation.Teacher`): under every engine, ZeRO-3 and FSDP2 included, each rank holds one full copy, never
partitioned, and no gradients or optimizer states for it. Its forward runs under `no_grad` inside the loss, after the
student's forward and before its backward, on the student's micro-batch at the student's image size. So per rank:

* static: its weights, parameters + floating buffers (batch-norm statistics) at p bytes each (2 in bf16, 4 in fp32);
* at the end of the student's forward: what the teacher's no_grad forward holds at its own peak. Without autograd
  each intermediate tensor is freed as soon as the next one no longer needs it, so the peak is the largest set of
  tensors live at once, usually one layer's input and output. That set is found by running the teacher once on the
  meta device (shapes only, no memory, no compute) and following every tensor it makes from allocation to release
  (`no_grad_peak_elements`); it grows with the batch, so it is kept per image;
* per image of compute: its forward FLOPs (no backward), `flops.forward_flops_per_image` at the student's size.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch

from hf_vit_scaling.models.flops import forward_flops_per_image
from hf_vit_scaling.planning.shapes import bytes_per_element  # the teacher is cast to the run's dtype


@dataclass(frozen=True)
class TeacherShape:
    """The numbers of a teacher the planner needs, at the run's image size."""

    name: str
    weight_elements: int  # parameters + floating buffers: one whole copy per rank
    forward_flops_per_image: int
    forward_peak_elements_per_image: int  # the largest set of tensors its no_grad forward holds at once

    def weight_bytes(self, precision: str) -> int:
        return self.weight_elements * bytes_per_element(precision)

    def forward_bytes(self, batch: int, precision: str) -> int:
        return self.forward_peak_elements_per_image * batch * bytes_per_element(precision)


class _LiveTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Follows every tensor an operator makes, from its allocation until Python frees it, and keeps the largest
    number of elements live at once. An output the operator's schema marks as aliasing an input (a view such as
    `t` or `view`, an in-place result such as `relu_`'s) is not new memory and is not counted."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key)

    def _new_tensors(self, func, out) -> list[torch.Tensor]:
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        returns = func._schema.returns
        fresh = [o for i, o in enumerate(outputs) if i >= len(returns) or returns[i].alias_info is None]
        return [t for t in torch.utils._pytree.tree_leaves(fresh) if isinstance(t, torch.Tensor)]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in self._new_tensors(func, out):
            if id(tensor) not in self.live:
                self.live[id(tensor)] = tensor.numel()
                self.now += tensor.numel()
                weakref.finalize(tensor, self._free, id(tensor))
        self.peak = max(self.peak, self.now)
        return out


def no_grad_peak_elements(model: torch.nn.Module, pixels: torch.Tensor) -> int:
    """The most elements `model`'s no_grad forward on `pixels` holds at once (the pixels themselves not counted:
    they are the student's batch). Works on the meta device."""
    tracker = _LiveTensors()
    with torch.no_grad(), tracker:
        model(pixel_values=pixels)
    return tracker.peak


def teacher_shape(config, image_size: int, name: str) -> TeacherShape:
    """A `TeacherShape` from a classifier's config (a saved teacher's config.json, or a preset's), at the student's
    image size, built and run on the meta device.

    resnet-tiny-cpu with 10 classes: 312,490 parameters + 1,344 batch-norm statistics (running mean and variance of
    672 channels over its 9 norms) = 313,834 elements, 0.63 MB per rank in bf16. Its no_grad forward peaks at the
    stem, where the 7 x 7 stride-2 convolution's output and its batch norm's output are live together: at 32 px
    2 x 32 channels x 16 x 16 = 16,384 elements per image, + 2 x 32 for the statistics the norm returns = 16,448.
    Batch 256 in bf16: 16,448 x 256 x 2 bytes = 8.4 MB.
    """
    from transformers import AutoModelForImageClassification

    config = copy.deepcopy(config)
    config.image_size = image_size  # the teacher sees the student's pixels (a ViT teacher's table sized to them)
    with torch.device("meta"):
        model = AutoModelForImageClassification.from_config(config).eval()
    weights = sum(p.numel() for p in model.parameters())
    weights += sum(b.numel() for b in model.buffers() if b.is_floating_point())
    pixels = torch.zeros(1, config.num_channels, image_size, image_size, device="meta")
    return TeacherShape(
        name=name,
        weight_elements=weights,
        forward_flops_per_image=forward_flops_per_image(config, image_size=image_size),
        forward_peak_elements_per_image=no_grad_peak_elements(model, pixels),
    )
