"""The one place a run's input path is chosen and attached, streamed or map-style: `attach_input_path`.

The input path (`input_path.choose_input_path`: device, host_crop or per_sample) decides what the host does per
image and what the device does per batch; its transforms come from `input_transforms.build_input_transforms`
(map-style) or `streaming.load.attach_streaming_transforms` (a stream). Map-style items carry their row as
`sample_index` and draw their host randomness per (seed, epoch, row) (`decoding.with_sample_index`); a stream's items
already carry theirs."""

from dataclasses import dataclass
from functools import partial

from hf_vit_scaling.data.decoding import with_sample_index
from hf_vit_scaling.data.input_path import check_eval_crop_path, choose_input_path
from hf_vit_scaling.data.input_transforms import build_input_transforms, cpu_seconds_per_image
from hf_vit_scaling.data.streaming.load import attach_streaming_transforms, is_streaming
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import gather_object


@dataclass
class InputPipeline:
    """The splits with their transforms, the collate, the device half of the path (a `DevicePreprocessor`, or None
    when the host does everything) and the path's name."""

    splits: dict
    collate: object
    preprocessor: object | None
    input_path: str


def attach_input_path(data, args, size: int, mean, std, resume_from: str | None = None) -> InputPipeline:
    """Choose the input path (`--input_path`, `auto` measured where it must be) and attach its transforms to `data`'s
    splits. `args`: the recipe's parsed groups (`data`, `regularization`, `training`); `resume_from`: the checkpoint a
    stream continues from (its data position)."""
    eval_crop_pct = args.regularization.eval_crop_pct
    if is_streaming(data):  # batches are made in the stream; its items already carry their sample ids
        splits, collate, preprocessor, path = attach_streaming_transforms(data, args, size, mean, std, resume_from)
    else:
        on_cpu = args.training.device.type == "cpu"
        splits, collate, preprocessor, path = attach_map_style_transforms(data, args.data, size, mean, std,
                                                                          eval_crop_pct, on_cpu)  # fmt: skip
        # Batches say which rows they hold (skipped images, --trace_samples); host draws are seeded per sample.
        splits = with_sample_index(splits, seed=args.training.seed)
    check_eval_crop_path(eval_crop_pct, path)
    return InputPipeline(splits, collate, preprocessor, path)


def attach_map_style_transforms(
    data, data_args, size: int, mean, std, eval_crop_pct: float | None = None, on_cpu: bool = False
):
    """(splits, collate, device preprocessor or None, input path) for the input path `--input_path` resolves to.
    `on_cpu`: the model runs on the host's cores, so `auto` times the paths there (rank 0's figures decide for every
    rank)."""
    build = partial(build_input_transforms, size=size, mean=mean, std=std, data_args=data_args,
                    eval_crop_pct=eval_crop_pct)  # fmt: skip
    cpu_timer = (lambda paths: gather_object(cpu_seconds_per_image(data, paths, build))[0]) if on_cpu else None
    input_path = choose_input_path(data, data_args.input_path, cpu_timer)
    crop, flip = data_args.crops_at(size), data_args.flips_at(size)
    crop_text = f"on (scale {data_args.crop_scale_min}-1)" if crop else "off"
    logger.info(f"Training augmentation at {size} px: random resized crop {crop_text}, horizontal flip "
                f"{'on' if flip else 'off'}, random shift of up to {data_args.random_crop_padding} px.")  # fmt: skip
    return *build(data, input_path), input_path
