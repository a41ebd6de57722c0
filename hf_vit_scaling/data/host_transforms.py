"""The per-sample input path: resize and augment each image on the host (any image sizes), torch only.

Each image becomes normalised float (3, S, S) in the DataLoader; training adds a random resized crop (as
torchvision's RandomResizedCrop samples it) and a horizontal flip. For same-size datasets the device path
(`device_transforms`) does the same batched on the model's device, much faster.
"""

import math

import torch
import torch.nn.functional as F
from datasets import DatasetDict
from PIL import Image

from hf_vit_scaling.data.decoding import decode_then, pil_to_uint8_tensor, set_pixel_transforms
from hf_vit_scaling.data.sample_randomness import host_randint, host_uniform

# Below this model input size the recipe neither crops nor flips by default; 64 px is the smallest size of the ImageNet
# variants trained with random resized crops (Downsampled ImageNet 64x64, Chrabaszcz et al. 2017, uses none either).
SMALL_IMAGE_PX = 64


def crops_at(random_resized_crop: bool | None, image_size: int) -> bool:
    """Whether training takes random resized crops at this model input size: --random_resized_crop when given, else
    the size-dependent default (torchvision/timm's crop from 8% is an ImageNet-sized default)."""
    return image_size >= SMALL_IMAGE_PX if random_resized_crop is None else random_resized_crop


def flips_at(horizontal_flip: bool | None, image_size: int) -> bool:
    """Whether training flips images at this model input size: --horizontal_flip when given, else as `crops_at`."""
    return image_size >= SMALL_IMAGE_PX if horizontal_flip is None else horizontal_flip


def random_resized_crop_box(height: int, width: int, scale_min: float) -> tuple[int, int, int, int]:
    """(top, left, h, w) as torchvision's RandomResizedCrop samples it: area in [scale_min, 1], ratio in [3/4, 4/3].

    Draws from the training sample's own stream (`sample_randomness`), or torch's default generator outside one.
    """
    area = height * width
    for _ in range(10):
        target_area = area * host_uniform(scale_min, 1.0)
        aspect = math.exp(host_uniform(math.log(3 / 4), math.log(4 / 3)))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = host_randint(0, height - h + 1)
            left = host_randint(0, width - w + 1)
            return top, left, h, w
    return 0, 0, height, width  # fallback: the whole image


class ImageTransform:
    """uint8/PIL image -> normalised float (3, S, S); training adds random resized crop and horizontal flip."""

    def __init__(
        self,
        size: int,
        mean,
        std,
        train: bool,
        random_resized_crop: bool = True,
        crop_scale_min: float = 0.08,
        horizontal_flip: bool = True,
        padding: int = 0,
    ):
        self.size, self.train, self.padding = size, train, padding
        self.crop, self.crop_scale_min, self.flip = random_resized_crop, crop_scale_min, horizontal_flip
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    @classmethod
    def from_data_args(cls, size: int, mean, std, train: bool, data_args) -> "ImageTransform":
        """The augmentation the data flags give at `size` (`crops_at`, `flips_at`, --random_crop_padding)."""
        return cls(
            size,
            mean,
            std,
            train,
            crops_at(data_args.random_resized_crop, size),
            data_args.crop_scale_min,
            flips_at(data_args.horizontal_flip, size),
            data_args.random_crop_padding,
        )

    def __call__(self, image) -> torch.Tensor:
        pixels = pil_to_uint8_tensor(image) if isinstance(image, Image.Image) else image
        if self.train and self.crop:
            top, left, h, w = random_resized_crop_box(pixels.shape[1], pixels.shape[2], self.crop_scale_min)
            pixels = pixels[:, top : top + h, left : left + w]
        x = pixels.unsqueeze(0).float() / 255.0
        if x.shape[-2:] != (self.size, self.size):
            # Antialiased bilinear, as PIL's resize in ViTImageProcessor.
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False)
        if self.train and self.padding:  # torchvision's RandomCrop(size, padding=N, padding_mode="edge")
            x = F.pad(x, [self.padding] * 4, mode="replicate")
            top, left = host_randint(0, 2 * self.padding + 1), host_randint(0, 2 * self.padding + 1)
            x = x[..., top : top + self.size, left : left + self.size]
        x = x.squeeze(0)
        if self.train and self.flip and host_uniform() < 0.5:
            x = x.flip(-1)
        return (x - self.mean) / self.std


def attach_transforms(data, size: int, mean, std, data_args) -> DatasetDict:
    """The per-sample path: each decoded image becomes normalised float (3, S, S) on the host, augmented "
    "in training."""

    def to_pixels(train: bool):
        return decode_then(ImageTransform.from_data_args(size, mean, std, train, data_args), data.raw_shape)

    return set_pixel_transforms(data, to_pixels)
