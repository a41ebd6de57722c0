"""The device input path (fast): uint8 batches on the host;
resize + augmentation + normalisation batched on the device.

Why: resizing CIFAR-sized images to 224 px one by one on the CPU (the per-sample path, as the HF example does) and
moving float32 224x224 tensors costs 3*224*224*4 = 602,112 bytes per image; the uint8 32x32 original is
3*32*32 = 3,072 bytes, 196x less. Here the DataLoader only decodes to uint8 and stacks; the model's forward
pre-hook turns the uint8 batch into normalised float pixels at the model's size, on whatever device the model is.

Training augmentation (random resized crop with scale in [crop_scale_min, 1] and ratio in [3/4, 4/3], horizontal
flip) is one batched `affine_grid` + `grid_sample` (bilinear): each sample gets its own crop box and flip.
Evaluation only resizes (bilinear). All images in a batch must share one size (true for CIFAR, digits, prepared
uint8 shards, any pre-resized dataset); variable-size images take `--input_path host_crop` (`crop_decode`), which cuts
fixed-size uint8 crops on the host and hands them to this preprocessor for the flip and normalisation.
"""

import math

import torch
import torch.nn.functional as F

from hf_vit_scaling.data.decoding import (
    decode_then,
    pil_to_uint8_tensor,
    set_pixel_transforms,
    stack_batch,
)
from hf_vit_scaling.data.host_transforms import crops_at, flips_at
from hf_vit_scaling.data.types import ImageClassificationData
from hf_vit_scaling.errors import UserInputError


def attach_uint8_transforms(data: ImageClassificationData):
    """Host side of the fast path: each example becomes a uint8 (3, H, W) tensor at its stored size (None, with a
    `bad_image` note, when it cannot be decoded). Prepared shards' raw bytes are only reshaped."""
    return set_pixel_transforms(data, lambda train: decode_then(pil_to_uint8_tensor, data.raw_shape))


def collate_uint8_batch(examples: list[dict]) -> dict:
    """Stack uint8 images of one size (resizing happens on the device)."""
    shapes = {tuple(e["pixel_values"].shape) for e in examples if e["pixel_values"] is not None}
    if len(shapes) > 1:
        raise UserInputError(
            f"--input_path device needs images of one size per batch, found {sorted(shapes)}. "
            "Fix: use --input_path host_crop (what auto picks for variable-size images), or prepare uint8 shards "
            "once (recipes/prepare_shards.py)."
        )
    return stack_batch(examples, stack_uint8)


def stack_uint8(pixels: list[torch.Tensor]) -> torch.Tensor:
    """Stack (3, H, W) uint8 images into (B, 3, H, W). Images that are views of H x W x 3 arrays (decoded images,
    prepared shards' rows, windows of them) are stacked as they lie and the batch is returned channels-last: the same
    shape and values, row copies instead of a transposing copy per image (the host's largest cost for prepared
    shards). `DevicePreprocessor` returns a contiguous batch whatever the layout it receives."""
    hwc = [p.permute(1, 2, 0) for p in pixels]
    if all(q.stride(2) == 1 and q.stride(1) == 3 for q in hwc):  # each pixel's 3 bytes together, pixels in a row
        return torch.stack(hwc).permute(0, 3, 1, 2)
    return torch.stack(pixels)


def random_crop_flip_theta(
    batch: int, scale_min: float | None, flip: bool, generator=None, device=None, padding: int = 0, size: int = 1
) -> torch.Tensor:
    """Per-sample affine matrices (B, 2, 3) for `affine_grid`: a random resized crop, optionally mirrored and
    shifted.

    In normalised coordinates ([-1, 1]) a crop of relative width w and height h centred at (cx, cy) is
    x_in = w * x_out + cx, y_in = h * y_out + cy; a flip negates w. `scale_min=None`: no crop (w = h = 1).
    `padding` N shifts by a whole number of output pixels k in [-N, N] per axis: one pixel of a `size`-pixel output
    spans 2 / size normalised units, so cx += w * 2k / size (an exact shift, no blur, when w = 1).
    """
    if scale_min is None:
        w, h = torch.ones(batch, device=device), torch.ones(batch, device=device)
        cx, cy = torch.zeros(batch, device=device), torch.zeros(batch, device=device)
    else:
        w, h, cx, cy = _random_crop_boxes(batch, scale_min, generator, device)
    if flip:
        sign = torch.where(torch.rand(batch, device=device, generator=generator) < 0.5, -1.0, 1.0)
        w = w * sign
    if padding:
        shifts = torch.randint(-padding, padding + 1, (2, batch), device=device, generator=generator).float()
        cx, cy = cx + w.abs() * shifts[0] * 2 / size, cy + h * shifts[1] * 2 / size
    theta = torch.zeros(batch, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 2] = w, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    return theta


def _random_crop_boxes(batch: int, scale_min: float, generator, device):
    """Relative (w, h, cx, cy): area in [scale_min, 1], aspect ratio in [3/4, 4/3] (torchvision's defaults)."""
    area = torch.empty(batch, device=device).uniform_(scale_min, 1.0, generator=generator)
    log_ratio = torch.empty(batch, device=device).uniform_(math.log(3 / 4), math.log(4 / 3), generator=generator)
    ratio = torch.exp(log_ratio)
    w = torch.sqrt(area * ratio).clamp(max=1.0)  # relative width  (1 = whole image)
    h = torch.sqrt(area / ratio).clamp(max=1.0)  # relative height
    cx = (torch.rand(batch, device=device, generator=generator) * 2 - 1) * (1 - w)
    cy = (torch.rand(batch, device=device, generator=generator) * 2 - 1) * (1 - h)
    return w, h, cx, cy


def as_float(x: torch.Tensor) -> torch.Tensor:
    """float32 in the standard (contiguous) layout: a channels-last uint8 batch (`stack_uint8`) is transposed in the
    same pass as the conversion."""
    return x.to(torch.float32, memory_format=torch.contiguous_format)


def mirror_and_shift(pixels: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """What `grid_sample` computes for `theta`s without a crop (w = +-1, h = 1, centres moved by whole output
    pixels), on images already at the output size, as one index gather (exact, any dtype: uint8 here).

    With align_corners=False pixel i sits at u = (2i + 1) / S - 1; u_in = w * u_out + cx maps pixel i to i + k for
    w = 1 and to S - 1 - i + k for w = -1, where k = cx * S / 2 (a shift of k pixels; `random_crop_flip_theta`);
    rows likewise with cy. Border padding repeats the edge: the index is clamped to [0, S - 1]."""
    batch, size = pixels.shape[0], pixels.shape[-1]
    index = torch.arange(size, device=pixels.device)
    shift_x = torch.round(theta[:, 0, 2] * size / 2).long()
    shift_y = torch.round(theta[:, 1, 2] * size / 2).long()
    mirrored = theta[:, 0, 0] < 0
    # flips only: mirror the chosen images (cheaper than the gather: docs/fast_input.md, "Choices in the code")
    if not (shift_x.any() or shift_y.any()):
        out = pixels.clone(memory_format=torch.contiguous_format)
        chosen = mirrored.nonzero().flatten()
        out[chosen] = out[chosen].flip(-1)
        return out
    cols = (torch.where(mirrored[:, None], size - 1 - index, index) + shift_x[:, None]).clamp(0, size - 1)
    rows = (index + shift_y[:, None]).clamp(0, size - 1)
    sample = torch.arange(batch, device=pixels.device)[:, None, None]
    return pixels[sample, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)  # (B, S, S, C) -> (B, C, S, S)


class DevicePreprocessor:
    """uint8 (B, 3, H, W) on the device -> normalised float (B, 3, S, S); augments only when the model trains."""

    def __init__(
        self,
        size: int,
        mean,
        std,
        random_resized_crop: bool = True,
        crop_scale_min: float = 0.08,
        horizontal_flip: bool = True,
        padding: int = 0,
    ):
        self.size = size
        self.mean, self.std = mean, std
        self.crop, self.crop_scale_min, self.flip = random_resized_crop, crop_scale_min, horizontal_flip
        self.padding = padding

    @classmethod
    def from_data_args(cls, size: int, mean, std, data_args, crop_on_device: bool = True) -> "DevicePreprocessor":
        """The training augmentation the data flags give at `size` (`crops_at`, `flips_at`, --random_crop_padding);
        crop_on_device False leaves the random resized crop to the host (`--input_path host_crop`)."""
        crop = crop_on_device and crops_at(data_args.random_resized_crop, size)
        return cls(
            size,
            mean,
            std,
            crop,
            data_args.crop_scale_min,
            flips_at(data_args.horizontal_flip, size),
            data_args.random_crop_padding,
        )

    def __call__(self, pixels: torch.Tensor, train: bool) -> torch.Tensor:
        x = pixels
        if train and (self.crop or self.flip or self.padding):
            scale_min = self.crop_scale_min if self.crop else None
            theta = random_crop_flip_theta(x.shape[0], scale_min, self.flip, None, x.device, self.padding, self.size)
            if self.crop or x.shape[-2:] != (self.size, self.size):
                grid = F.affine_grid(theta, [x.shape[0], 3, self.size, self.size], align_corners=False)
                x = F.grid_sample(as_float(x), grid, mode="bilinear", padding_mode="border", align_corners=False)
            else:  # host_crop's crops, or crops off: only mirrors and whole-pixel shifts, exact as index gathers
                x = mirror_and_shift(x, theta)
        elif x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(
                as_float(x), size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False
            )
        return self.normalize(x, fresh=x is not pixels)

    def normalize(self, x: torch.Tensor, fresh: bool) -> torch.Tensor:
        """(x / 255 - mean) / std = x * (1 / (255 std)) - mean / std, in place on one contiguous float copy. The
        resize and crop above are linear with weights summing to 1, so normalising after them equals normalising
        before. On a CPU this is faster than the four passes over a channels-last batch it replaces (measured:
        docs/fast_input.md, "Choices in the code"), which matters where the "device" is the host's own cores."""
        x = x.to(torch.float32, memory_format=torch.contiguous_format, copy=not fresh)
        std = torch.tensor(self.std, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        mean = torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        return x.mul_(1.0 / (255.0 * std)).sub_(mean / std)

    def attach(self, model: torch.nn.Module):
        """Run on every forward whose `pixel_values` are uint8; returns the hook handle (saved models stay clean)."""

        def pre_hook(module, args, kwargs):
            pixels = kwargs.get("pixel_values")
            if pixels is not None and pixels.dtype == torch.uint8:
                kwargs["pixel_values"] = self(pixels, train=module.training)
            return args, kwargs

        return model.register_forward_pre_hook(pre_hook, with_kwargs=True)


class EvalCenterCrop:
    """timm's evaluation transform on the device: resize the shorter side to floor(size / crop_pct), then centre
    crop size x size (top = round((H' - size) / 2)). E.g. 224 px at crop_pct 0.875: resize to 256, keep the centre
    224. Runs on the uint8 batch and returns uint8 (as PIL does), before the DevicePreprocessor, which then only
    normalises. Bilinear with antialias, as the rest of the device path."""

    def __init__(self, size: int, crop_pct: float):
        self.size, self.crop_pct = size, crop_pct

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        short = math.floor(self.size / self.crop_pct)
        if height <= width:  # torchvision's Resize(int): the longer side is int(short * long / short_side)
            return short, int(short * width / height)
        return int(short * height / width), short

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        new_h, new_w = self.resized_shape(*pixels.shape[-2:])
        x = F.interpolate(pixels.float(), size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
        top, left = int(round((new_h - self.size) / 2.0)), int(round((new_w - self.size) / 2.0))
        x = x[..., top : top + self.size, left : left + self.size]
        return x.round_().clamp_(0, 255).to(torch.uint8)

    def attach(self, model: torch.nn.Module):
        """Forward pre-hook, placed first: evaluation forwards with uint8 pixels get the resize + centre crop."""

        def pre_hook(module, args, kwargs):
            pixels = kwargs.get("pixel_values")
            if not module.training and pixels is not None and pixels.dtype == torch.uint8:
                kwargs["pixel_values"] = self(pixels)
            return args, kwargs

        return model.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True)
