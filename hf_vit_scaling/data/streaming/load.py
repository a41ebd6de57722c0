"""The recipe's entry points for --streaming: load this rank's stream and the evaluation rows
(`load_streaming_data`), then attach the input path and the examples the stream makes
(`attach_streaming_transforms`)."""

import itertools
from dataclasses import dataclass
from typing import ClassVar

import torch
from datasets import ClassLabel

from hf_vit_scaling.data.decoding import decode_then, image_name, pixels_or_note
from hf_vit_scaling.data.input_path import choose_input_path
from hf_vit_scaling.data.shards import MANIFEST, find_manifest, manifest_shards, raw_shape
from hf_vit_scaling.data.streaming.loader import StreamingTrainData
from hf_vit_scaling.data.streaming.reader import (
    SAMPLE_ID,
    _encoded_stream,
    open_streams,
    uint8_shard_stream,
)
from hf_vit_scaling.data.types import EVAL_SPLIT_CANDIDATES, detect_image_column, detect_label_column
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import rank_and_world


@dataclass(frozen=True)
class StreamBatches:
    """How a stream batches its training examples: the Trainer's --per_device_train_batch_size,
    --dataloader_drop_last and --dataloader_num_workers (the stream makes the batches, not the Trainer's loader)."""

    batch_size: int
    drop_last: bool = False
    num_workers: int = 0


@dataclass
class StreamingData:
    """`load_image_classification_data`'s result under --streaming: a training stream and in-memory eval rows."""

    train: StreamingTrainData
    validation_rows: list[dict]  # {image, label, sample_id}: the evaluation split is read once, into memory
    image_column: str
    label_column: str
    label_names: list[str]
    source: str
    on_bad_image: str
    raw_shape: tuple[int, int, int] | None  # (H, W, C) of uint8 shard rows (`decoding.decode_raw`); None: encoded

    streaming: ClassVar[bool] = True
    train_selection: ClassVar[dict | None] = None  # not recorded for a stream: a teacher's rows go unchecked

    @property
    def splits(self) -> dict:
        return {"train": self.train, "validation": self.validation_rows}

    def stored_images(self, limit: int) -> list:
        """The first `limit` evaluation rows' images, then the first `limit` of this rank's training stream."""
        rows = self.validation_rows[:limit] + list(itertools.islice(self.train.rank_stream, limit))
        return [row[self.image_column] for row in rows]


def is_streaming(data) -> bool:
    return isinstance(data, StreamingData)


def _check_shards_per_rank(n_shards: int, world: int) -> None:
    if n_shards % world:
        logger.warning(
            f"warning: --streaming: {n_shards} shards for {world} processes is not a multiple, so every rank reads "
            f"every shard and keeps one row in {world} ({world}x the reading). Write the data in a multiple of "
            f"{world} shards to give each rank whole shards."
        )


def load_streaming_data(data_args, stream_args, seed: int, cache_dir: str | None = None) -> StreamingData:
    """The training stream of this rank and the evaluation rows, for --streaming (see the module docstring)."""
    rank, world = rank_and_world()
    root = data_args.dataset_name
    manifest = find_manifest(root) if root and not stream_args.train_files else None
    cap = data_args.max_eval_samples
    if manifest is not None:
        train_shards = manifest_shards(manifest, root, "train")
        eval_split = next((s for s in EVAL_SPLIT_CANDIDATES if manifest_shards(manifest, root, s)), None)
        if not train_shards or eval_split is None:
            raise UserInputError(
                f"{root}/{MANIFEST} lists no train shards or no evaluation split ({', '.join(EVAL_SPLIT_CANDIDATES)})"
                ". Fix: write the shards with a train and a validation split."
            )
        stream = uint8_shard_stream(train_shards)
        eval_rows = list(itertools.islice(uint8_shard_stream(manifest_shards(manifest, root, eval_split)), cap))
        image_column, label_column, names = "image", "label", list(manifest["class_names"])
        num_rows, raw = sum(rows for _, rows in train_shards), tuple(int(n) for n in raw_shape(manifest))
    else:
        streams = open_streams(data_args, stream_args, cache_dir)
        eval_split = next((s for s in EVAL_SPLIT_CANDIDATES if s in streams), None)
        if "train" not in streams or eval_split is None:
            raise UserInputError(
                f"--streaming: {root or stream_args.train_files!r} has splits {', '.join(streams)}; a train split and "
                f"an evaluation split ({', '.join(EVAL_SPLIT_CANDIDATES)}) are needed (a stream is not split by "
                "--train_val_split). Fix: pass --validation_files, or a dataset with both splits."
            )
        features = streams["train"].features
        if features is None:
            raise UserInputError("--streaming: the dataset does not declare its features. Fix: use Parquet files.")
        image_column = detect_image_column(features, data_args.image_column_name)
        label_column = detect_label_column(features, data_args.label_column_name)
        if not isinstance(features[label_column], ClassLabel):
            raise UserInputError(
                f"--streaming: label column {label_column!r} is not a ClassLabel, so the class names are unknown "
                "without reading every row. Fix: cast it once (datasets: dataset.class_encode_column) and save."
            )
        names = list(features[label_column].names)
        stream, eval_stream = (_encoded_stream(streams[s], image_column, label_column) for s in ("train", eval_split))
        eval_rows = list(itertools.islice(eval_stream, cap))
        num_rows, raw = None, None
    if not eval_rows:
        raise UserInputError(f"--streaming: the {eval_split} split of {root or stream_args.train_files!r} is empty.")
    _check_shards_per_rank(stream.num_shards, world)
    source = root or stream_args.train_files
    rows = f"{num_rows:,} rows, " if num_rows is not None else ""
    logger.info(
        f"Streaming {source}: {rows}{stream.num_shards} shards over {world} process(es), shuffle buffer "
        f"{stream_args.shuffle_buffer_size}, {len(eval_rows):,} {eval_split} rows in memory"
    )
    train = StreamingTrainData(
        stream,
        rank=rank,
        world_size=world,
        seed=seed,
        shuffle_buffer_size=stream_args.shuffle_buffer_size,
        num_rows=num_rows,
        image_column=image_column,
        label_column=label_column,
        description=source,
    )
    return StreamingData(train, eval_rows, image_column, label_column, names, source, data_args.on_bad_image, raw)


class EvalRows(torch.utils.data.Dataset):
    """The evaluation rows (in memory, encoded) as a map-style split; each item carries its sample id."""

    def __init__(self, rows: list[dict], to_example):
        self.rows, self.to_example = rows, to_example

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[index]
        return {**self.to_example(row), "sample_index": row[SAMPLE_ID]}


def example_transform(data: StreamingData, pixels_of):
    """row -> {"pixel_values", "labels", "bad_image"}: decode (or read raw pixels), then `pixels_of(uint8 or PIL)`;
    an image that cannot be read gives None and a note (`--on_bad_image fail`: an error naming it), as on the
    map-style path (`decoding.set_pixel_transforms`)."""
    image_column, label_column = data.image_column, data.label_column
    convert = decode_then(pixels_of, data.raw_shape)

    def to_example(row: dict) -> dict:
        value = row[image_column]
        name = f"row {row[SAMPLE_ID]}" if data.raw_shape is not None else image_name(value)
        pixels, note = pixels_or_note(convert, value, data.on_bad_image, name)
        return {"pixel_values": pixels, "labels": row[label_column], "bad_image": note}

    return to_example


def attach_streaming_transforms(
    data: StreamingData, data_args, batches: StreamBatches, size: int, mean, std, resume_from: str | None
):
    """(splits, collate, device preprocessor or None, `InputPath`) for --streaming: the input path
    (`input_path.choose_input_path`, as for map-style data) in its form for a stream (`InputPath.stream_pixels`), the
    examples the stream makes, in `batches`, and the data position of the checkpoint resumed from."""
    path = choose_input_path(data, data_args.input_path)
    preprocessor, collate = path.preprocessor(size, mean, std, data_args), path.collate
    train_example = example_transform(data, path.stream_pixels(size, mean, std, True, data_args))
    data.train.attach(train_example, collate, batches.batch_size, batches.drop_last, batches.num_workers)
    note = data.train.restore(resume_from)
    if note:
        logger.info(f"Resume: {note}")
    eval_example = example_transform(data, path.stream_pixels(size, mean, std, False, data_args))
    validation = EvalRows(data.validation_rows, eval_example)
    return {"train": data.train, "validation": validation}, collate, preprocessor, path


def split_size(split) -> int | None:
    """Rows of a split: len() of a map-style one; one pass over all ranks of a stream (None when unknown)."""
    return split.num_rows if isinstance(split, StreamingTrainData) else len(split)
