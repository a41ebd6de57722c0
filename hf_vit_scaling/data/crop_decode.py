"""Variable-size images on a fast path (`--input_path host_crop`): fixed-size uint8 crops cut on the host, flip and
normalisation on the device.

The per-sample path decodes each image at full size, then crops, resizes, flips and normalises it in float32 on the
host. Here each stored image becomes a uint8 (3, S, S) crop on the host instead:

1. The crop box is drawn from the size in the file's header, before any pixel is decoded. Training: torchvision's
   random resized crop (area in [crop_scale_min, 1], aspect ratio in [3/4, 4/3]; `random_resized_crop_box`, the
   per-sample path's own sampler), or the whole image without --random_resized_crop. Evaluation: the whole image,
   resized to S x S as the per-sample path and the saved image processor do; with --eval_crop_pct, timm's centre crop
   (shorter side to floor(S / crop_pct), centre S x S).
2. A JPEG is decoded at the largest DCT reduction (1/2, 1/4 or 1/8: libjpeg's scaled decoding, PIL's `Image.draft`)
   that still leaves the box at least S px on both sides, so the crop never loses detail it would keep at full size.
   E.g. a 2000 x 1500 photo evaluated at 224 px decodes at 500 x 375 (1/4): about 1/16 of the pixels. At 224 px from
   ImageNet-sized photos (~500 x 375) the box is rarely 448 px on both sides, so there it almost never fires: the
   gain there comes from step 3. Other formats decode at full size.
3. The box (rounded to whole pixels of the decoded image) is cut out by PIL, which copies only that region, and
   resized to S x S by torch's uint8 antialiased bilinear kernel (the filter of PIL's resize and of the per-sample
   path's float interpolate; vectorised for uint8 RGB), giving a contiguous (3, S, S) tensor that stacks cheaply.

Batches are then uint8 (B, 3, S, S) of one size; `DevicePreprocessor` (crop off) flips and normalises them on the
model's device. 3 x 224 x 224 = 150,528 bytes per image cross from host to device, 1/4 of float32.
Measured in `benchmarks/imagenet_shaped.py` (see benchmarks/README.md).
"""

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from hf_vit_scaling.data.decoding import _DECODE_ERRORS, open_image_header, set_pixel_transforms, to_gray, to_rgb
from hf_vit_scaling.data.host_transforms import crops_at, random_resized_crop_box

JPEG_REDUCTIONS = (8, 4, 2, 1)  # what libjpeg (and so PIL's draft) can decode at: 1/8, 1/4, 1/2, full size


def jpeg_reduction(full_size: tuple[int, int], box, out_size: tuple[int, int]) -> int:
    """The largest of 8, 4, 2, 1 by which a JPEG of `full_size` (w, h) can be decoded while `box` (left, top, right,
    bottom, full-size pixels) keeps at least `out_size` (w, h) pixels: PIL's draft rule, for a box instead of the whole
    image. E.g. a 2000 x 1500 image, whole-image box, out 224 x 224: min(2000 // 299, 1500 // 224) = 6 -> 4."""
    requested = draft_request(full_size, box, out_size)
    scale = min(full_size[0] // requested[0], full_size[1] // requested[1])
    return next((r for r in JPEG_REDUCTIONS if scale >= r), 1)


def draft_request(full_size: tuple[int, int], box, out_size: tuple[int, int]) -> tuple[int, int]:
    """The whole-image size at which `box` measures `out_size`: what to ask `Image.draft` for."""
    box_w, box_h = box[2] - box[0], box[3] - box[1]
    return max(1, math.ceil(full_size[0] * out_size[0] / box_w)), max(1, math.ceil(full_size[1] * out_size[1] / box_h))


def decode_for_box(image: Image.Image, box, out_size: tuple[int, int], channels: int = 3):
    """A lazily opened image (header read, pixels not yet) -> (decoded image in RGB or L, `box` in its pixels).

    JPEGs decode at the largest reduction that keeps the box at least `out_size` (`jpeg_reduction`); other formats at
    full size (`draft` is a no-op for them). Raises one of the decoding errors for a corrupt or truncated file."""
    full_w, full_h = image.size
    # RGB: keep libjpeg's RGB output; L: libjpeg outputs luma directly (no colour conversion of the full image).
    # draft returns where the full image lies in the reduced one: (0, 0, W / s, H / s), exactly 1/s per pixel.
    drafted = image.draft("L" if channels == 1 else "RGB", draft_request(image.size, box, out_size))
    image.load()
    sx, sy = (drafted[1][2] / full_w, drafted[1][3] / full_h) if drafted else (1.0, 1.0)
    image = to_gray(image) if channels == 1 else to_rgb(image)
    return image, (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def resize_box(image: Image.Image, box, out_size: tuple[int, int]) -> Image.Image:
    """The region `box` of a decoded image resized to `out_size` (bilinear with antialias when shrinking, as PIL's
    resize and the image processor do)."""
    return image.resize(out_size, Image.Resampling.BILINEAR, box=box)


def crop_resize_uint8(image: Image.Image, box, size: int) -> torch.Tensor:
    """A decoded RGB image and a box -> uint8 (3, size, size): the box rounded to whole pixels, the region copied out
    by PIL, resized by torch's uint8 antialiased bilinear interpolation."""
    left, top = round(box[0]), round(box[1])
    right, bottom = max(left + 1, round(box[2])), max(top + 1, round(box[3]))
    region = np.asarray(image.crop((left, top, right, bottom)))
    with warnings.catch_warnings():  # a read-only array: torch warns, but the tensor is only read
        warnings.simplefilter("ignore", UserWarning)
        pixels = torch.from_numpy(region).permute(2, 0, 1).unsqueeze(0)
    if pixels.shape[-2:] == (size, size):
        return pixels[0].contiguous()
    # Antialiasing widens the filter only when shrinking (support = max(1, in / out) pixels per side); when neither
    # side shrinks it is plain bilinear, so the cheaper kernel gives the same bytes (most random crops of images near
    # the model's size are enlarged; measured: docs/fast_input.md, "Choices in the code").
    shrinks = max(pixels.shape[-2:]) > size
    return F.interpolate(pixels, size=(size, size), mode="bilinear", antialias=shrinks, align_corners=False)[0]


def centre_square(width: int, height: int) -> tuple[float, float, float, float]:
    """The centred square of side min(width, height): resized to S x S it is "shorter side to S, centre S x S"."""
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    return left, top, left + side, top + side


class CropDecoder:
    """A stored image -> (uint8 (3, S, S) tensor, None), or (None, why) when it cannot be decoded (see the module
    docstring for the boxes). Uses torch's global RNG for training boxes, as the per-sample path does (the Trainer
    seeds it; each DataLoader worker re-seeds it)."""

    def __init__(
        self,
        size: int,
        train: bool,
        random_resized_crop: bool = True,
        crop_scale_min: float = 0.08,
        eval_crop_pct: float | None = None,
    ):
        self.size, self.train = size, train
        self.crop, self.crop_scale_min, self.eval_crop_pct = random_resized_crop, crop_scale_min, eval_crop_pct

    def box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) in full-size pixels."""
        if self.train and self.crop:
            top, left, h, w = random_resized_crop_box(height, width, self.crop_scale_min)
            return left, top, left + w, top + h
        if not self.train and self.eval_crop_pct:
            # Shorter side resized to floor(S / crop_pct) (timm), centre S x S: a centred square of side
            # S * short / floor(S / crop_pct) in full-size pixels. E.g. 224 px, 0.875, 500 x 375: 375 * 224/256 = 328.
            side = self.size * min(width, height) / math.floor(self.size / self.eval_crop_pct)
            left, top = (width - side) / 2, (height - side) / 2
            return left, top, left + side, top + side
        return 0.0, 0.0, float(width), float(height)

    def __call__(self, value) -> tuple[torch.Tensor | None, str | None]:
        try:
            image = open_image_header(value)
            image, box = decode_for_box(image, self.box(*image.size), (self.size, self.size))
        except _DECODE_ERRORS as err:
            return None, f"{err.__class__.__name__}: {err}"
        return crop_resize_uint8(image, box, self.size), None


def attach_host_crop_transforms(data, size: int, data_args, eval_crop_pct: float | None = None):
    """The host half of `--input_path host_crop`: each example becomes a uint8 (3, S, S) crop (None, with a
    `bad_image` note, when it cannot be decoded)."""

    def to_pixels(train: bool) -> CropDecoder:
        crop = crops_at(data_args.random_resized_crop, size)
        return CropDecoder(size, train, crop, data_args.crop_scale_min, eval_crop_pct)

    return set_pixel_transforms(data, to_pixels)
