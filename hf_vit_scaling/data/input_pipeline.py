"""The one place a run's input path is chosen and attached, streamed or map-style: `attach_input_path`.

The input path (`input_path.choose_input_path`: an `InputPath`, device, host_crop or per_sample) decides what the
host does per image and what the device does per batch; its transforms come from its own `attach_map_style`
(map-style, through `input_transforms.build_input_transforms`) or `streaming.load.attach_streaming_transforms` (a
stream). Map-style items carry their row as `sample_index` and draw their host randomness per (seed, epoch, row)
(`decoding.with_sample_index`); a stream's items already carry theirs."""

from dataclasses import dataclass
from functools import partial

from hf_vit_scaling.data.decoding import with_sample_index
from hf_vit_scaling.data.host_transforms import crops_at, flips_at
from hf_vit_scaling.data.input_path import InputPath, choose_input_path
from hf_vit_scaling.data.input_transforms import build_input_transforms, cpu_seconds_per_image
from hf_vit_scaling.data.streaming.load import StreamBatches, attach_streaming_transforms, is_streaming
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import gather_object


@dataclass
class InputPipeline:
    """The splits with their transforms, the collate, the device half of the path (a `DevicePreprocessor`, or None
    when the host does everything) and the path itself (`input_path.InputPath`: its eval crop, its name)."""

    splits: dict
    collate: object
    preprocessor: object | None
    path: InputPath


def attach_input_path(
    data,
    data_args,
    size: int,
    mean,
    std,
    on_cpu: bool,
    seed: int,
    stream_batches: StreamBatches,
    eval_crop_pct: float | None = None,
    resume_from: str | None = None,
) -> InputPipeline:
    """Choose the input path (`--input_path`, `auto` measured where it must be) and attach its transforms to `data`'s
    splits. `data_args`: the data flags; `on_cpu`: the model runs on the host's cores; `seed`: the run's (host draws
    are seeded per sample from it); `stream_batches`: how a stream batches (the Trainer's loader settings);
    `resume_from`: the checkpoint a stream continues from (its data position)."""
    if is_streaming(data):  # batches are made in the stream; its items already carry their sample ids
        splits, collate, preprocessor, path = attach_streaming_transforms(
            data, data_args, stream_batches, size, mean, std, resume_from
        )
    else:
        splits, collate, preprocessor, path = attach_map_style_transforms(
            data, data_args, size, mean, std, eval_crop_pct, on_cpu
        )
        # Batches say which rows they hold (skipped images, --trace_samples); host draws are seeded per sample.
        splits = with_sample_index(splits, seed=seed)
    path.check_eval_crop(eval_crop_pct)
    return InputPipeline(splits, collate, preprocessor, path)


def attach_map_style_transforms(
    data, data_args, size: int, mean, std, eval_crop_pct: float | None = None, on_cpu: bool = False
):
    """(splits, collate, device preprocessor or None, `InputPath`) for the input path `--input_path` resolves to.
    `on_cpu`: the model runs on the host's cores, so `auto` times the paths there (rank 0's figures decide for every
    rank)."""
    # The CPU probe builds its own copies of each path on a few training images.
    build = partial(
        build_input_transforms, size=size, mean=mean, std=std, data_args=data_args, eval_crop_pct=eval_crop_pct
    )
    cpu_timer = (lambda paths: gather_object(cpu_seconds_per_image(data, paths, build))[0]) if on_cpu else None
    input_path = choose_input_path(data, data_args.input_path, cpu_timer)
    crop, flip = crops_at(data_args.random_resized_crop, size), flips_at(data_args.horizontal_flip, size)
    crop_text = f"on (scale {data_args.crop_scale_min}-1)" if crop else "off"
    logger.info(
        f"Training augmentation at {size} px: random resized crop {crop_text}, horizontal flip "
        f"{'on' if flip else 'off'}, random shift of up to {data_args.random_crop_padding} px."
    )
    return *input_path.attach_map_style(data, size, mean, std, data_args, eval_crop_pct), input_path
