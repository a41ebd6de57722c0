"""Reading a stream's rows: uint8 Parquet shards listed by a manifest (`data.shards`), or Parquet/Arrow files and
Hub datasets through `load_dataset(..., streaming=True)`; every row gets a sample id."""

import hashlib
import os

import numpy as np
from datasets import Features, IterableDataset, Value, load_dataset
from datasets import Image as ImageFeature

from hf_vit_scaling.errors import UserInputError

SAMPLE_ID = "sample_id"


READ_ROWS = 64  # rows converted to Python at a time per open shard (256 left the peak RSS creeping up with more data)


FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}


def read_uint8_shards(shards):
    """Rows of uint8 Parquet shards: gen_kwargs {"shards": [(URL, first row id), ...]} (datasets splits the list
    into shards). Reads READ_ROWS rows at a time: memory does not grow with the shard."""
    import fsspec
    import pyarrow.parquet as pq

    for url, first_id in shards:
        with fsspec.open(url, "rb") as f:
            row = first_id
            for batch in pq.ParquetFile(f).iter_batches(batch_size=READ_ROWS, columns=["image", "label"]):
                for image, label in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                    yield {"image": image, "label": label, SAMPLE_ID: row}
                    row += 1


UINT8_FEATURES = Features({"image": Value("binary"), "label": Value("int64"), SAMPLE_ID: Value("int64")})


def uint8_shard_stream(shards: list[tuple[str, int]]) -> IterableDataset:
    """One IterableDataset over the shards, one datasets shard per file; row ids continue from file to file."""
    offsets = np.cumsum([0] + [rows for _, rows in shards])[:-1].tolist()
    gen_kwargs = {"shards": [(url, int(first)) for (url, _), first in zip(shards, offsets)]}
    return IterableDataset.from_generator(read_uint8_shards, features=UINT8_FEATURES, gen_kwargs=gen_kwargs)


def content_id(value) -> int:
    """A 56-bit id of an encoded image: its bytes, else its path (rows of a stream have no global row number)."""
    if isinstance(value, dict):
        value = value.get("bytes") or (value.get("path") or "").encode()
    return int.from_bytes(hashlib.blake2b(value, digest_size=7).digest(), "big")


def _with_content_id(row: dict, image_column: str) -> dict:
    return {SAMPLE_ID: content_id(row[image_column])}


def _split_patterns(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def _file_builder(patterns: list[str]) -> str:
    kinds = {FILE_BUILDERS.get(os.path.splitext(p)[1].lower()) for p in patterns}
    if len(kinds) != 1 or None in kinds:
        raise UserInputError(
            f"--train_files/--validation_files {', '.join(patterns)}: give files of one kind, "
            f"ending in {' or '.join(FILE_BUILDERS)}. Fix: point the patterns at .parquet or .arrow files."
        )
    return kinds.pop()


def open_streams(data_args, stream_args, cache_dir: str | None) -> dict:
    """{split: IterableDataset} for a Hub id or file patterns, through `load_dataset(..., streaming=True)`."""
    try:
        if stream_args.train_files:
            data_files = {"train": _split_patterns(stream_args.train_files)}
            if stream_args.validation_files:
                data_files["validation"] = _split_patterns(stream_args.validation_files)
            builder = _file_builder([p for files in data_files.values() for p in files])
            return dict(load_dataset(builder, data_files=data_files, streaming=True, cache_dir=cache_dir))
        name = data_args.dataset_name
        return dict(load_dataset(name, data_args.dataset_config_name, streaming=True, cache_dir=cache_dir))
    except UserInputError:
        raise
    except Exception as err:  # datasets raises many types (not found, offline, no files match)
        source = stream_args.train_files or data_args.dataset_name
        raise UserInputError(
            f"--streaming could not open {source!r} ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
            "Fix: check the Hub id or the file patterns and your network."
        ) from err


def _encoded_stream(stream: IterableDataset, image_column: str, label_column: str) -> IterableDataset:
    """Images kept encoded (decoded per sample, where a bad one can be skipped) and a content id per row."""
    stream = stream.select_columns([image_column, label_column])
    if isinstance(stream.features[image_column], ImageFeature):
        stream = stream.cast_column(image_column, ImageFeature(decode=False))
    return stream.map(_with_content_id, fn_kwargs={"image_column": image_column})
