"""The input path `--input_path` resolves to, one rule for map-style data and streams, as one `InputPath` object:

- `device`: uint8 originals cross to the device, resized, augmented and normalised there in batches;
- `host_crop`: images of different sizes, cut to fixed-size uint8 crops on the host (map-style data only);
- `per_sample`: the Hugging Face example's per-image transforms on the host (the reference path).

`auto` reads image headers only (`decoding.open_image_header`: no pixels decoded) to tell one size from many. For
images of many sizes it picks by where the model runs: with an accelerator, `host_crop` (the host does the least);
on a CPU-only run, where the "device" half runs on the host's own cores, the path with the least CPU time end to end,
measured on a few batches (`input_transforms.cpu_seconds_per_image`).

`choose_input_path` picks the path once per run; everything else asks the `InputPath` it returns (its host
transforms, its device half, its eval crop, its form for a stream) and never compares its name.
"""

from collections.abc import Callable
from dataclasses import dataclass

from hf_vit_scaling.data.crop_decode import attach_host_crop_transforms
from hf_vit_scaling.data.decoding import _DECODE_ERRORS, open_image_header, pil_to_uint8_tensor, stack_batch
from hf_vit_scaling.data.device_transforms import (
    DevicePreprocessor,
    EvalCenterCrop,
    attach_uint8_transforms,
    collate_uint8_batch,
)
from hf_vit_scaling.data.host_transforms import ImageTransform, attach_transforms
from hf_vit_scaling.data.types import ImageClassificationData
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger

INPUT_PATHS = ("auto", "device", "host_crop", "per_sample")
SIZE_PROBE = 64  # images read per split (headers only) to tell one size from many


@dataclass(frozen=True)
class InputPath:
    """One resolved input path and what it does on each side. `device_half`: uint8 batches cross to the device and a
    `DevicePreprocessor` resizes, augments and normalises them there; `crops_on_host`: the random resized crop and
    the --eval_crop_pct centre crop are cut on the host instead (host_crop). A stream never gets host_crop
    (`resolve_input_path` refuses it), so `stream_pixels` serves the other two."""

    name: str
    device_half: bool
    crops_on_host: bool

    def __str__(self) -> str:
        return self.name

    @property
    def collate(self):
        """The batch collate: uint8 pixels for a device half, normalised floats otherwise."""
        return collate_uint8_batch if self.device_half else stack_batch

    def preprocessor(self, size: int, mean, std, data_args) -> DevicePreprocessor | None:
        """The device half (None when the host does everything), with the crop left out when the host cuts it."""
        if not self.device_half:
            return None
        return DevicePreprocessor.from_data_args(size, mean, std, data_args, crop_on_device=not self.crops_on_host)

    def attach_map_style(self, data, size: int, mean, std, data_args, eval_crop_pct: float | None = None):
        """(splits, collate, device preprocessor or None): this path's host transforms set on map-style `data`."""
        preprocessor = self.preprocessor(size, mean, std, data_args)
        if self.crops_on_host:  # uint8 crops at the model's size (the random resized crop, or the eval centre crop)
            splits = attach_host_crop_transforms(data, size, data_args, eval_crop_pct)
        elif self.device_half:  # uint8 originals; everything else batched on the device
            splits = attach_uint8_transforms(data)
        else:  # the Hugging Face example's per-image transforms
            splits = attach_transforms(data, size, mean, std, data_args)
        return splits, self.collate, preprocessor

    def stream_pixels(self, size: int, mean, std, train: bool, data_args):
        """A stream's per-row pixels: the uint8 tensor as it is for a device half, else the per-image transform."""
        if self.device_half:
            return pil_to_uint8_tensor  # a shard row's uint8 tensor passes through
        return ImageTransform.from_data_args(size, mean, std, train, data_args)

    def eval_crop(self, size: int, eval_crop_pct: float | None) -> EvalCenterCrop | None:
        """The --eval_crop_pct centre crop on the device, or None: off, or cut on the host (host_crop)."""
        on_device = eval_crop_pct and self.device_half and not self.crops_on_host
        return EvalCenterCrop(size, eval_crop_pct) if on_device else None

    def check_eval_crop(self, eval_crop_pct: float | None) -> None:
        """--eval_crop_pct crops on the device and host_crop paths only."""
        if eval_crop_pct is not None and not self.device_half:
            raise UserInputError(
                "--eval_crop_pct runs on the device and host_crop input paths, but the per-sample path was chosen "
                f"(--input_path {self.name}). Fix: --input_path auto (device for images of one size, host_crop "
                "for variable sizes), or drop --eval_crop_pct."
            )


RESOLVED_PATHS = {
    "device": InputPath("device", device_half=True, crops_on_host=False),
    "host_crop": InputPath("host_crop", device_half=True, crops_on_host=True),
    "per_sample": InputPath("per_sample", device_half=False, crops_on_host=False),
}


def input_path_named(path: "str | InputPath") -> InputPath:
    """The `InputPath` of a resolved name ("device", "host_crop", "per_sample"); an `InputPath` as it is."""
    return path if isinstance(path, InputPath) else RESOLVED_PATHS[path]


def distinct_sizes(values) -> list[tuple[int, int]]:
    """The distinct (width, height) of stored images in first-seen order, read from their headers (no pixels
    decoded). A file that cannot be opened is skipped here (and skipped or refused later)."""
    sizes = []
    for value in values:
        try:
            size = open_image_header(value).size
        except _DECODE_ERRORS:
            continue
        if size not in sizes:
            sizes.append(size)
    return sizes


def probe_sizes(data: ImageClassificationData, probe: int = SIZE_PROBE) -> list[tuple[int, int]]:
    """The distinct (width, height) of the first `probe` training and validation images (`distinct_sizes`); `data`
    is map-style data or a stream (`stored_images` of either)."""
    return distinct_sizes(data.stored_images(probe))


def images_share_one_size(data: ImageClassificationData, probe: int = SIZE_PROBE) -> bool:
    """True for prepared uint8 shards, and when the first `probe` training images (and as many validation images)
    have one size."""
    return data.raw_shape is not None or len(probe_sizes(data, probe)) == 1


def resolve_input_path(
    data: ImageClassificationData, requested: str, cpu_timer: Callable[[tuple[str, ...]], dict] | None = None
) -> tuple[str, str]:
    """(input path, why). auto: the fastest path the data allows: `device` for prepared uint8 shards and for images
    of one size (uint8 originals, everything else batched on the device). For images of different sizes,
    `host_crop` (fixed-size uint8 crops cut on the host, flip and normalisation on the device) when the model runs on
    an accelerator; on a CPU-only run (`cpu_timer` given: paths -> CPU seconds per image) whichever of `host_crop` and
    `per_sample` costs less CPU time. A stream of images of different sizes has no host_crop path and gets
    `per_sample`, the reference path (the Hugging Face example's)."""
    if requested not in INPUT_PATHS:
        raise UserInputError(f"--input_path {requested!r}: use one of {', '.join(INPUT_PATHS)}.")
    if data.streaming and requested == "host_crop":
        raise UserInputError(
            "--input_path host_crop reads map-style data (random access to each file); --streaming has no host_crop "
            "path. Fix: --input_path auto, device or per_sample."
        )
    if data.raw_shape is not None:
        height, width, channels = data.raw_shape
        if requested == "host_crop":
            raise UserInputError(
                f"--input_path host_crop decodes image files, but {data.source!r} holds prepared uint8 shards "
                f"({height}x{width}x{channels}, nothing to decode). Fix: --input_path auto or device."
            )
        if requested == "auto":
            return "device", f"prepared uint8 shards of {height}x{width}: crop, flip and normalisation on the device"
    if requested != "auto":
        return requested, f"--input_path {requested}"
    sizes = probe_sizes(data)
    if len(sizes) <= 1:
        shown = f"{sizes[0][0]}x{sizes[0][1]}" if sizes else "unknown"
        return "device", f"the first images share one size ({shown}): uint8 originals, resized on the device"
    shown = ", ".join(f"{w}x{h}" for w, h in sizes[:3])
    if data.streaming:
        return "per_sample", f"streamed images differ in size ({shown}, ...): per-sample transforms on the host"
    why = f"images differ in size ({shown}, ...)"
    if cpu_timer is None:
        return (
            "host_crop",
            f"{why}: uint8 crops at the model's size cut on the host, flip and normalisation on the device",
        )
    return fastest_on_cpu(cpu_timer(("host_crop", "per_sample")), why)


def fastest_on_cpu(seconds: dict, why: str) -> tuple[str, str]:
    """(path, why) for a CPU-only run from {path: CPU seconds per image}; host_crop when nothing was measured (fewer
    training images than one probe batch) and on a tie."""
    if not seconds:
        return "host_crop", f"{why}; too few images to time the paths on this CPU"
    path = min(seconds, key=lambda name: (seconds[name], name != "host_crop"))
    shown = ", ".join(f"{name} {value * 1e3:.2f} ms" for name, value in seconds.items())
    return path, f"{why}; on this CPU the host and the device share the cores: CPU time per image {shown}"


def choose_input_path(data: ImageClassificationData, requested: str, cpu_timer=None) -> InputPath:
    """The input path `--input_path` resolves to (see `resolve_input_path`), logged with the reason."""
    path, why = resolve_input_path(data, requested, cpu_timer)
    logger.info(f"Input path: {path} ({why}).")
    return RESOLVED_PATHS[path]
