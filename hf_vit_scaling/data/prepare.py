"""The prepare step: any image-classification source -> fixed-size uint8 shards (format: `shards`), in parallel over
processes, resumable. `recipes/prepare_shards.py` is its command line.

Each image: the shorter side resized to S and the centre S x S kept, as one PIL resize of the centred square
(bilinear with antialias; a JPEG decodes at reduced size when that still leaves >= S px: `crop_decode`). Grayscale
16-bit is scaled to 8 bit (not clipped), CMYK, palette and RGBA become RGB (`decoding.to_rgb`). Stored as raw
H x W x C bytes: S = 256, C = 3 is 196,608 bytes per image (ImageNet's 1.28 M training images: 252 GB).

Same flags, same shards: the rows of each split are put in a fixed random order (--shuffle_seed; classes mixed in
every shard, which a streaming reader needs: image folders list one class after another), and shard i holds rows
[i * R, (i + 1) * R) of that order (R = --shard_rows), less the images that cannot be decoded (named in the
manifest's `skipped`) and rows without a label.

Resumable: a shard is written under a temporary name, hashed, its record written to `.progress/`, then renamed into
place, so a killed run leaves only complete shards (and temporary files, which the next run removes). A rerun keeps
every shard whose file exists and whose sha256 matches its record, and redoes the rest; manifest.json, the mark of a
complete folder, is removed at the start and written last. The flags are kept in `.progress/settings.json`: a rerun
with other flags into the same folder is refused.

Parallel: the shards are the tasks of a process pool (fork on Linux, so the workers share the loaded source's
memory-mapped Arrow tables; spawn elsewhere, each worker loading the source once).
"""

import json
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from hf_vit_scaling.data.crop_decode import centre_square, decode_for_box, resize_box
from hf_vit_scaling.data.decoding import _DECODE_ERRORS, decode_images_lazily, open_image_header
from hf_vit_scaling.data.shards import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PROGRESS_DIR,
    file_sha256,
    is_prepared,
    progress_file,
    read_manifest,
    shard_file,
)
from hf_vit_scaling.data.sources import label_names_of, load_splits
from hf_vit_scaling.data.types import detect_image_column, detect_label_column
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.utils import write_json_atomically

# rows per Parquet row group, what a streaming reader holds at once: at 256 px RGB 128 x 196,608 bytes = 25 MB
ROW_GROUP_ROWS = 128
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")
CHANNEL_PROBE = 100  # images looked at (headers only) by --channels auto


@dataclass
class SourceSpec:
    """Where the images come from: the recipe's own data flags (see `sources.load_splits`)."""

    dataset_name: str | None = None
    dataset_config_name: str | None = None
    train_dir: str | None = None
    validation_dir: str | None = None
    image_column_name: str | None = None
    label_column_name: str | None = None
    cache_dir: str | None = None


@dataclass
class Source:
    splits: dict
    image_column: str
    label_column: str
    class_names: list[str]
    name: str


def load_source(spec: SourceSpec) -> Source:
    """The source's splits as stored (images undecoded), its columns and class names."""
    if is_prepared(spec.dataset_name):
        raise UserInputError(
            f"--dataset_name {spec.dataset_name!r} is already prepared (it has a {MANIFEST}). "
            "Fix: train from it directly (--dataset_name), or prepare from the original images."
        )
    splits, name = load_splits(spec, spec.cache_dir)
    if "train" not in splits:
        raise UserInputError(f"Dataset {name!r} has no 'train' split (splits: {', '.join(splits)}).")
    features = splits["train"].features
    image_column = detect_image_column(features, spec.image_column_name)
    label_column = detect_label_column(features, spec.label_column_name)
    splits = decode_images_lazily(splits, image_column)
    return Source(dict(splits), image_column, label_column, label_names_of(splits, label_column), name)


def resolve_channels(source: Source, requested: str) -> int:
    """--channels 3 or 1 as given; auto: 1 when the first CHANNEL_PROBE training images are all grayscale."""
    if requested != "auto":
        return int(requested)
    split = source.splits["train"]
    for value in split.select(range(min(CHANNEL_PROBE, len(split))))[source.image_column]:
        try:
            if open_image_header(value).mode not in GRAY_MODES:
                return 3
        except _DECODE_ERRORS:
            continue
    return 1


def square_pixels(value, size: int, channels: int) -> bytes:
    """A stored image -> raw uint8 bytes of its centre square at size x size (H x W x C, row-major)."""
    image = open_image_header(value)
    image, box = decode_for_box(image, centre_square(*image.size), (size, size), channels)
    return resize_box(image, box, (size, size)).tobytes()


def finished_record(out_dir: str, split: str, index: int, count: int) -> dict | None:
    """The record of a shard a previous run completed: its file exists and its sha256 matches the record."""
    record_path = os.path.join(out_dir, progress_file(split, index, count))
    shard_path = os.path.join(out_dir, shard_file(split, index, count))
    if not (os.path.isfile(record_path) and os.path.isfile(shard_path)):
        return None
    with open(record_path, encoding="utf-8") as f:
        record = json.load(f)
    return record if file_sha256(shard_path) == record.get("sha256") else None


def write_shard(source: Source, out_dir: str, task: dict, size: int, channels: int, compression: str) -> dict:
    """Build one shard (or keep the finished one); returns its record plus `reused`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    split, index, count, rows_of = (task[k] for k in ("split", "index", "count", "rows"))
    record = finished_record(out_dir, split, index, count)
    if record is not None:
        return {**record, "reused": True}
    rel = shard_file(split, index, count)
    final = os.path.join(out_dir, rel)
    tmp = f"{final}.tmp-{os.getpid()}"
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    counts, skipped, rows = [0] * len(source.class_names), [], 0
    images, labels = [], []
    with pq.ParquetWriter(tmp, schema, compression=compression) as writer:
        for row, example in zip(rows_of, source.splits[split].select(rows_of)):
            value, label = example[source.image_column], example[source.label_column]
            where = (value.get("path") if isinstance(value, dict) else None) or row  # the file, else the source row
            if label is None or not 0 <= label < len(counts):
                skipped.append({"split": split, "source_index_or_path": where, "reason": f"no label ({label})"})
                continue
            try:
                images.append(square_pixels(value, size, channels))
            except _DECODE_ERRORS as err:
                reason = f"{type(err).__name__}: {err}"
                skipped.append({"split": split, "source_index_or_path": where, "reason": reason})
                continue
            labels.append(int(label))
            counts[label] += 1
            if len(images) == ROW_GROUP_ROWS:
                writer.write_table(pa.table({"image": images, "label": labels}, schema=schema))
                rows, images, labels = rows + len(labels), [], []
        if images or rows == 0:
            writer.write_table(pa.table({"image": images, "label": labels}, schema=schema))
            rows += len(labels)
    record = {"file": rel, "rows": rows, "sha256": file_sha256(tmp), "count_per_class": counts, "skipped": skipped}
    write_json_atomically(os.path.join(out_dir, progress_file(split, index, count)), record)
    os.replace(tmp, final)  # the shard appears complete, or not at all
    return {**record, "reused": False}


_WORKER: dict = {}


def _init_worker(spec: SourceSpec, source: Source | None, settings: dict) -> None:
    _WORKER["source"] = source if source is not None else load_source(spec)  # fork: inherited; spawn: loaded
    _WORKER["settings"] = settings


def _run_task(task: dict) -> dict:
    s = _WORKER["settings"]
    return write_shard(_WORKER["source"], s["out_dir"], task, s["size"], s["channels"], s["compression"])


def plan_tasks(source: Source, shard_rows: int, shuffle_seed: int | None) -> list[dict]:
    """One task per shard: its split, index, shard count and source rows (in the fixed shuffled order)."""
    tasks = []
    for split, dataset in source.splits.items():
        order = np.arange(len(dataset))
        if shuffle_seed is not None:
            order = np.random.default_rng(shuffle_seed).permutation(len(dataset))
        count = max(1, -(-len(dataset) // shard_rows))
        for index in range(count):
            rows = order[index * shard_rows : (index + 1) * shard_rows].tolist()
            tasks.append({"split": split, "index": index, "count": count, "rows": rows})
    return tasks


def check_settings(out_dir: str, settings: dict) -> None:
    """Record the flags on the first run; refuse a rerun into the same folder with other flags."""
    path = os.path.join(out_dir, PROGRESS_DIR, "settings.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
        if before != settings:
            changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
            raise UserInputError(
                f"--output_dir {out_dir!r} holds shards prepared with other settings ({', '.join(changed)} differ). "
                "Fix: rerun with the same flags to finish it, or pass a new --output_dir."
            )
    else:
        write_json_atomically(path, settings)


def prepare_shards(
    spec: SourceSpec,
    output_dir: str,
    size: int = 256,
    channels: str = "auto",
    shard_rows: int = 1000,
    num_proc: int = 1,
    compression: str = "none",
    shuffle_seed: int | None = 0,
    after_shard=None,
) -> dict:
    """Write (or finish) the shards and the manifest; returns a summary (shards written and reused, rows, skipped).
    `after_shard(shards_done)`: called after each shard (recipes/prepare_shards.py passes the fault injector's
    `prepare_sigkill@N`)."""
    import datasets
    import PIL
    import pyarrow

    started = time.perf_counter()
    source = load_source(spec)
    resolved_channels = resolve_channels(source, channels)
    settings = {
        "source": source.name,
        "size": size,
        "channels": resolved_channels,
        "shard_rows": shard_rows,
        "compression": compression,
        "shuffle_seed": shuffle_seed,
        "rows_per_split": {split: len(d) for split, d in source.splits.items()},
        "image_column": source.image_column,
        "label_column": source.label_column,
        "format_version": FORMAT_VERSION,
    }
    for split in source.splits:
        os.makedirs(os.path.join(output_dir, split), exist_ok=True)
    os.makedirs(os.path.join(output_dir, PROGRESS_DIR), exist_ok=True)
    check_settings(output_dir, settings)
    if os.path.exists(os.path.join(output_dir, MANIFEST)):
        os.remove(os.path.join(output_dir, MANIFEST))  # complete again only when this run ends
    for folder, _, files in os.walk(output_dir):  # (glob's ** skips the hidden .progress/)
        for name in files:
            if ".tmp-" in name:
                os.remove(os.path.join(folder, name))  # a killed run's unfinished shard or record

    tasks = plan_tasks(source, shard_rows, shuffle_seed)
    logger.info(
        f"Preparing {len(tasks)} shard(s) of {source.name!r} at {size}x{size}x{resolved_channels} into "
        f"{output_dir} with {num_proc} process(es)."
    )
    worker_settings = {"out_dir": output_dir, "size": size, "channels": resolved_channels, "compression": compression}
    records, every = [], max(1, len(tasks) // 20)
    if num_proc > 1:
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        inherited = source if method == "fork" else None
        with multiprocessing.get_context(method).Pool(
            num_proc, initializer=_init_worker, initargs=(spec, inherited, worker_settings)
        ) as pool:
            for record in pool.imap_unordered(_run_task, tasks):
                records.append(record)
                _progress(records, len(tasks), every, after_shard)
    else:
        for task in tasks:
            records.append(write_shard(source, output_dir, task, size, resolved_channels, compression))
            _progress(records, len(tasks), every, after_shard)

    split_order = list(source.splits)
    records.sort(key=lambda r: (split_order.index(r["file"].split("/")[0]), r["file"]))  # imap_unordered's order
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "size": size,
        "channels": resolved_channels,
        "layout": "HWC",
        "dtype": "uint8",
        "resize": f"shorter side to {size} (PIL bilinear, antialiased), centre {size}x{size} kept",
        "class_names": source.class_names,
        "source": source.name,
        "splits": {
            split: [
                {k: r[k] for k in ("file", "rows", "sha256", "count_per_class")}
                for r in records
                if r["file"].startswith(f"{split}/")
            ]
            for split in source.splits
        },
        "skipped": [s for r in records for s in r["skipped"]],
        "settings": settings,
        "created_with": {"pillow": PIL.__version__, "pyarrow": pyarrow.__version__, "datasets": datasets.__version__},
    }
    write_json_atomically(os.path.join(output_dir, MANIFEST), manifest)
    read_manifest(output_dir)  # what training will check
    summary = {
        "output_dir": output_dir,
        "shards_written": sum(not r["reused"] for r in records),
        "shards_reused": sum(r["reused"] for r in records),
        "rows": {split: sum(s["rows"] for s in shards) for split, shards in manifest["splits"].items()},
        "skipped": len(manifest["skipped"]),
        "seconds": round(time.perf_counter() - started, 2),
        "source": asdict(spec),
    }
    for item in manifest["skipped"]:
        logger.info(f"Skipped {item['split']} image {item['source_index_or_path']}: {item['reason']}")
    return summary


def _progress(records: list[dict], total: int, every: int, after_shard=None) -> None:
    done = len(records)
    if done % every == 0 or done == total:
        reused = sum(r["reused"] for r in records)
        logger.info(f"  {done}/{total} shards ({reused} kept from an earlier run)")
    if after_shard is not None:
        after_shard(done)
