"""Streaming training data (`--streaming`): each rank reads its own shards, batch after batch, without loading the
data set; the data position is saved in every checkpoint and a resumed run trains on the same rows at every step.

Sources, each a `datasets.IterableDataset` (the library's sharding, shuffling and state):
- a folder of uint8 Parquet shards with a `manifest.json` (`--dataset_name ROOT`, local or any fsspec URL): rows are
  raw H x W x C pixels, so they go to the device path without decoding (`device_transforms`); every row gets its
  global row number as its sample id (shard offset from the manifest + row in the shard);
- `--train_files PATTERN` (Parquet or Arrow files, local or remote) and Hub datasets (`--dataset_name ID`), read
  with `load_dataset(..., streaming=True)`; images are decoded per sample (`decoding`); the sample id is a 56-bit
  hash of the encoded image (of its path when it has no bytes).

Per rank: `split_dataset_by_node` gives each rank whole shards when the shard count is a multiple of the world
size (otherwise every rank reads every shard and keeps one row in W: warned), then `shuffle(seed, buffer_size)`
puts the rank's shards in a seeded order per pass and draws rows from a buffer fed by up to 10 open shards
(`--shuffle_buffer_size 0`: one shard at a time, rows in stored order). With DataLoader workers, datasets gives
each worker its own shards of the rank.

Batches are formed in the stream (in the worker), and the loader takes them from the workers in a fixed round
robin, so the order never depends on which worker is faster. Passes follow each other without end (one pass =
every row of the rank once); `--max_steps` bounds training.

The data position (`data_position/rank{R}.json` in each checkpoint, written before the checkpoint is marked
complete): the pass, the worker whose batch comes next, and per worker the rows its stream has given, the batches
it has made, whether it is exhausted, and (`--shuffle_buffer_size 0` without workers) datasets' own `state_dict()`.
Resuming:
- `--shuffle_buffer_size 0` and `--dataloader_num_workers 0`: the stream is restored with datasets'
  `load_state_dict` (it reopens the shard and skips to the row);
- otherwise each worker replays its stream of that pass from the start (same seed, same pass: the same rows in the
  same order) and drops the rows already given, before any decoding. datasets does not save a shuffle buffer's rows
  ("examples from shuffle buffers are lost when resuming", its `state_dict` docstring), and in datasets 5.2 a
  worker's state does not load back (see `StreamingTrainData.uses_datasets_state`).
Either way the rows of every later step are those of the uninterrupted run. The Trainer's own skipping of trained
batches is off (`ignore_data_skip`): the position comes from the checkpoint.
"""

import copy
import hashlib
import itertools
import json
import logging
import os
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from datasets import ClassLabel, Features, IterableDataset, Value, load_dataset
from datasets import Image as ImageFeature
from datasets.distributed import split_dataset_by_node

from hf_vit_scaling.data.decoding import decode_then, image_name, pil_to_uint8_tensor, pixels_or_note, stack_batch
from hf_vit_scaling.data.device_transforms import DevicePreprocessor, collate_uint8_batch, distinct_sizes
from hf_vit_scaling.data.host_transforms import ImageTransform
from hf_vit_scaling.data.shards import MANIFEST, raw_shape
from hf_vit_scaling.data.sources import EVAL_SPLIT_CANDIDATES, detect_image_column, detect_label_column
from hf_vit_scaling.errors import TrainingStopped, UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import rank_and_world
from hf_vit_scaling.training.checkpoints import write_json_atomically

POSITION_DIRNAME = "data_position"
POSITION_FORMAT = 1
SAMPLE_ID = "sample_id"
SHUFFLE_INPUT_SHARDS = 10  # datasets' default for IterableDataset.shuffle(max_buffer_input_shards)
READ_ROWS = 64  # rows converted to Python at a time per open shard (256 left the peak RSS creeping up with more data)
PROBE_ROWS = 64  # rows probed for one image size (--input_path auto on decoded images)
FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}
# Settings a saved data position only holds for: the same ones on resume, or the rows of each step would differ.
RESUME_KEYS = ("world_size", "num_workers", "per_device_batch", "drop_last", "seed", "shuffle_buffer_size", "n_shards")


@dataclass
class StreamingArguments:
    """Streaming the training data instead of loading it (`--max_steps` sets the schedule)."""

    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the training split: each rank reads its own shards, rows are never all in memory, and "
            "checkpoints hold the data position (exact resume). Needs --max_steps. Sources: --dataset_name (a Hub id, "
            "or a folder/URL of uint8 Parquet shards with manifest.json) or --train_files. See docs/streaming.md."
        },
    )
    shuffle_buffer_size: int = field(
        default=1000,
        metadata={
            "help": "--streaming: rows drawn at random from a buffer of this many (per rank and worker), filled "
            "from up to 10 shards at a time, on top of a seeded shard order per pass. 0: seeded shard order only, one "
            "shard read at a time (least memory; without workers, resume is a seek instead of a replay)."
        },
    )
    train_files: str | None = field(
        default=None,
        metadata={
            "help": "--streaming: Parquet or Arrow files of the training split, local or remote (glob patterns, "
            "comma-separated), e.g. 'hf://datasets/ORG/NAME/data/train-*.parquet'."
        },
    )
    validation_files: str | None = field(
        default=None, metadata={"help": "--streaming: files of the evaluation split, as --train_files."}
    )

    def __post_init__(self):
        if self.shuffle_buffer_size < 0:
            raise UserInputError(f"--shuffle_buffer_size must be >= 0, got {self.shuffle_buffer_size}.")
        for flag in ("train_files", "validation_files"):
            if getattr(self, flag) and not self.streaming:
                raise UserInputError(f"--{flag} reads files as a stream. Fix: add --streaming.")
        if self.validation_files and not self.train_files:
            raise UserInputError("--validation_files needs --train_files. Fix: add --train_files.")


def check_streaming(args) -> None:
    """Refuse, before anything loads, what a stream cannot do (args: the recipe's argument groups)."""
    if not args.streaming.streaming:
        return
    data, training = args.data, args.training

    def refuse(what: str, fix: str):
        raise UserInputError(f"--streaming {what}. Fix: {fix}.")

    if training.max_steps <= 0:
        refuse("has no length to derive a schedule from (the Trainer needs --max_steps with an iterable data set)",
               "pass --max_steps N; one pass is rows / (per-device batch x processes) steps")  # fmt: skip
    if data.train_dir:
        refuse("reads --dataset_name or --train_files, not --train_dir", "drop --train_dir or --streaming")
    if not (data.dataset_name or args.streaming.train_files):
        refuse("needs a source", "pass --dataset_name (Hub id or manifest folder) or --train_files")
    if data.dataset_name and args.streaming.train_files:
        refuse("takes one source", "pass --dataset_name or --train_files, not both")
    if data.max_train_samples:
        refuse("takes no --max_train_samples (a stream is not subsampled)", "bound training with --max_steps")
    if data.class_weighting != "none":
        refuse("cannot count the training labels up front for --class_weighting", "drop --class_weighting")
    if args.cluster.balance_batches != "off":
        refuse("forms equal batches per rank", "drop --balance_batches")
    if args.engine.sequence_parallel_size > 1:
        refuse("gives every rank its own rows; sequence parallelism needs ranks that share images",
               "drop --sequence_parallel_size")  # fmt: skip
    for flag in ("eval_strategy", "save_strategy"):
        if getattr(training, flag) == "epoch":
            refuse(f"has no epochs for --{flag} epoch (passes follow each other within one Trainer epoch)",
                   f"use --{flag} steps")  # fmt: skip


# --------------------------------------------------------------------------- reading


def _url_to_fs(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)


def read_manifest(root: str) -> dict | None:
    """The manifest of a uint8 shard folder (local path or fsspec URL), or None when `root` has none."""
    try:
        fs, path = _url_to_fs(root)
        manifest_path = f"{path.rstrip('/')}/{MANIFEST}"
        if not fs.isfile(manifest_path):
            return None
        with fs.open(manifest_path, "rb") as f:
            manifest = json.load(f)
    except (OSError, ValueError, ImportError):
        return None
    missing = [key for key in ("size", "channels", "class_names") if key not in manifest]
    if missing:
        raise UserInputError(f"{root}/{MANIFEST} lacks {', '.join(missing)}. Fix: write the shards again.")
    if manifest["channels"] not in (1, 3):
        raise UserInputError(f"{root}/{MANIFEST}: channels {manifest['channels']}; 1 or 3 are read.")
    return manifest


def manifest_shards(manifest: dict, root: str, split: str) -> list[tuple[str, int]]:
    """[(URL, rows)] of a split's shards in the manifest's order: `splits.<split>` or `<split>`, each {file, rows};
    `file` is relative to `ROOT/<split>/` (a bare name) or to ROOT (a path with a slash)."""
    shards = (manifest.get("splits") or {}).get(split, manifest.get(split))
    if not shards:
        return []
    base = root.rstrip("/")
    return [(f"{base}/{s['file']}" if "/" in s["file"] else f"{base}/{split}/{s['file']}", int(s["rows"]))
            for s in shards]  # fmt: skip


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


# --------------------------------------------------------------------------- the training stream of one rank


@dataclass
class WorkerPosition:
    """Where one worker's stream is within the current pass."""

    examples: int = 0  # rows its stream has given (bad images included)
    batches: int = 0
    exhausted: bool = False
    datasets_state: dict | None = None  # datasets' state_dict() (see StreamingTrainData.uses_datasets_state)


@dataclass
class StreamPosition:
    """Where a rank's training stream is: after the last batch trained."""

    pass_index: int
    next_worker: int
    workers: list[WorkerPosition]

    @classmethod
    def start(cls, num_workers: int, pass_index: int = 0) -> "StreamPosition":
        return cls(pass_index, 0, [WorkerPosition() for _ in range(max(1, num_workers))])

    def to_dict(self) -> dict:
        return {
            "pass": self.pass_index,
            "next_worker": self.next_worker,
            "workers": [vars(w).copy() for w in self.workers],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StreamPosition":
        return cls(d["pass"], d["next_worker"], [WorkerPosition(**w) for w in d["workers"]])


class StreamingTrainData(torch.utils.data.IterableDataset):
    """One rank's training stream. Iterated (in a DataLoader worker, or in the main process without workers) it
    yields that worker's batches of the current pass, each with its worker position, then an end marker; the
    `loader` puts the workers' batches in their fixed order and chains the passes."""

    def __init__(self, stream: IterableDataset, *, rank: int, world_size: int, seed: int, shuffle_buffer_size: int,
                 num_rows: int | None, image_column: str, label_column: str, description: str):  # fmt: skip
        super().__init__()
        self.n_shards = stream.num_shards
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle_buffer_size = shuffle_buffer_size
        self.num_rows = num_rows  # rows in one pass over all ranks, when known (the manifest)
        self.image_column, self.label_column, self.description = image_column, label_column, description
        # Shuffle first with a fixed seed, then split: every rank sees the same shard order (datasets' advice).
        # datasets feeds its buffer from up to 10 open shards at a time (per worker), each holding about 2.5 row
        # groups of Parquet in memory; without a buffer, one shard is read at a time.
        input_shards = SHUFFLE_INPUT_SHARDS if shuffle_buffer_size else 1
        shuffled = stream.shuffle(
            seed=seed, buffer_size=max(1, shuffle_buffer_size), max_buffer_input_shards=input_shards
        )
        self.rank_stream = split_dataset_by_node(shuffled, rank=rank, world_size=world_size)
        self.to_example = None  # set by `attach`: row -> {"pixel_values", "labels", "bad_image"}
        self.collate = None
        self.batch_size, self.drop_last, self.num_workers = 1, False, 0
        self.start_position = StreamPosition.start(0)
        self._pass_index, self._starts = 0, self.start_position.workers

    # -------------------------------------------------------------- set up by the recipe

    def attach(self, to_example, collate, batch_size: int, drop_last: bool, num_workers: int) -> None:
        self.to_example, self.collate = to_example, collate
        self.batch_size, self.drop_last, self.num_workers = batch_size, drop_last, num_workers
        self.start_position = StreamPosition.start(num_workers)

    def position_record(self, position: StreamPosition) -> dict:
        return {
            "format": POSITION_FORMAT,
            "source": self.description,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "per_device_batch": self.batch_size,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "shuffle_buffer_size": self.shuffle_buffer_size,
            "n_shards": self.n_shards,
            **position.to_dict(),
        }

    def save_position(self, checkpoint: str, position: dict | None) -> None:
        """Write this rank's data position into `checkpoint` (every rank; before the checkpoint is marked)."""
        folder = os.path.join(checkpoint, POSITION_DIRNAME)
        os.makedirs(folder, exist_ok=True)
        current = StreamPosition.from_dict(position) if position is not None else self.start_position
        write_json_atomically(os.path.join(folder, f"rank{self.rank}.json"), self.position_record(current))

    def restore(self, checkpoint: str | None) -> str | None:
        """Continue from the data position saved in `checkpoint` (None: from the start). Returns a note."""
        if checkpoint is None:
            return None
        path = os.path.join(checkpoint, POSITION_DIRNAME, f"rank{self.rank}.json")
        if not os.path.isfile(path):
            raise UserInputError(
                f"--streaming: {checkpoint} holds no data position ({POSITION_DIRNAME}/rank{self.rank}.json), so the "
                "stream cannot continue where it stopped. Fix: resume from a checkpoint of a --streaming run, or "
                "start without --resume_from_checkpoint."
            )
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        now = self.position_record(self.start_position)
        changed = [f"{k} {saved.get(k)} -> {now[k]}" for k in RESUME_KEYS if saved.get(k) != now[k]]
        if changed:
            raise UserInputError(
                f"--streaming: the data position in {checkpoint} was saved with other settings ({'; '.join(changed)}):"
                " the rows of each step would differ. Fix: resume with the same number of processes, "
                "--dataloader_num_workers, --per_device_train_batch_size, --seed, --shuffle_buffer_size and shards."
            )
        self.start_position = StreamPosition.from_dict(saved)
        return f"data position: pass {saved['pass']}, {sum(w['batches'] for w in saved['workers'])} batches into it"

    @property
    def uses_datasets_state(self) -> bool:
        """Resume with datasets' load_state_dict (a seek) rather than a replay: no shuffle buffer to lose, and no
        DataLoader workers (datasets 5.2 loads a worker's state into the rank's whole stream first, before the
        worker's share is taken, which fails with an IndexError once shards are interleaved)."""
        return self.shuffle_buffer_size == 0 and self.num_workers == 0

    def loader(self, args) -> "StreamLoader":
        return StreamLoader(self, args)

    # -------------------------------------------------------------- one pass of one worker

    def begin_pass(self, position: StreamPosition) -> None:
        """Set the pass and each worker's start before the DataLoader hands copies of this object to the workers."""
        self._pass_index, self._starts = position.pass_index, position.workers

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        start = self._starts[worker]
        if not start.exhausted:
            yield from self._worker_batches(worker, start)
        yield {"stream_end": worker}

    def _worker_batches(self, worker: int, start: WorkerPosition):
        stream = copy.deepcopy(self.rank_stream)
        stream.set_epoch(self._pass_index)
        keep_state = self.uses_datasets_state
        skip = start.examples
        if keep_state and start.datasets_state is not None:
            with _quiet_buffer_reload():
                stream.load_state_dict(start.datasets_state)  # datasets reopens the shard and skips to the row
            skip = 0
        rows = iter(stream)
        if skip:  # replay: the same rows in the same order (same seed and pass), dropped before decoding
            dropped = sum(1 for _ in itertools.islice(rows, skip))
            if dropped != skip:
                raise DataPositionError(
                    f"rank {self.rank} worker {worker}: the saved position is {skip} rows into pass {self._pass_index}"
                    f", but the stream now holds {dropped}. The data changed since the checkpoint."
                )
        examples, batches, pending = start.examples, start.batches, []
        for row in rows:
            examples += 1
            pending.append({**self.to_example(row), "sample_index": row[SAMPLE_ID]})
            if len(pending) == self.batch_size:
                batches += 1
                yield self._batch(pending, worker, examples, batches, stream if keep_state else None)
                pending = []
        if pending and not self.drop_last:
            yield self._batch(pending, worker, examples, batches + 1, stream if keep_state else None)

    def _batch(self, examples: list[dict], worker: int, rows: int, batches: int, stream) -> dict:
        batch = self.collate(examples)
        state = stream.state_dict() if stream is not None else None
        batch["stream_worker"] = (worker, vars(WorkerPosition(rows, batches, False, state)))
        return batch


class DataPositionError(TrainingStopped):
    """The stream cannot reach the saved data position (the data changed); only that rank may know."""

    every_rank_knows = False


class _quiet_buffer_reload:
    """`--shuffle_buffer_size 0` keeps a one-row buffer (datasets shuffles shards through `shuffle()`), which never
    holds a row between two yields; datasets still warns that a reload loses the buffer's rows. Silence that."""

    class _Drop(logging.Filter):
        def filter(self, record):
            return "shuffle buffer" not in record.getMessage()

    def __enter__(self):
        self.logger, self.drop = logging.getLogger("datasets.iterable_dataset"), self._Drop()
        self.logger.addFilter(self.drop)

    def __exit__(self, *exc):
        self.logger.removeFilter(self.drop)


def _keep(item):
    return item


class StreamLoader:
    """The Trainer's training dataloader under --streaming: one rank's batches, pass after pass, without end.

    Workers make batches from their own shards; batches are taken from workers 0, 1, ..., W-1, 0, ... (an exhausted
    worker is passed over), whatever order they arrive in, so a position (pass, next worker, each worker's rows)
    says exactly which batch comes next. Each batch carries the position after it (`stream_position`), which the
    trainer keeps for the checkpoint."""

    def __init__(self, data: StreamingTrainData, args):
        self.data, self.args = data, args

    def __iter__(self):
        position = copy.deepcopy(self.data.start_position)
        while True:
            fresh = all(w.examples == 0 and not w.exhausted for w in position.workers)
            given = yield from self._one_pass(position)
            if fresh and given == 0:
                raise DataPositionError(
                    f"rank {self.data.rank}: pass {position.pass_index} of the stream gave no batch "
                    f"({self.data.n_shards} shards for {self.data.world_size} processes). Fix: use more rows or "
                    "shards than processes."
                )
            position = StreamPosition.start(self.data.num_workers, position.pass_index + 1)

    def _dataloader(self):
        workers = self.args.dataloader_num_workers
        extra = {}
        if workers > 0:
            extra = {
                "prefetch_factor": self.args.dataloader_prefetch_factor,
                "multiprocessing_context": self.args.dataloader_multiprocessing_context,
            }
        return torch.utils.data.DataLoader(self.data, batch_size=None, num_workers=workers, collate_fn=_keep,
                                           pin_memory=self.args.dataloader_pin_memory, **extra)  # fmt: skip

    def _one_pass(self, position: StreamPosition):
        """Yield the pass's batches in worker order, updating `position`; returns how many were yielded."""
        self.data.begin_pass(position)
        n = len(position.workers)
        waiting = [deque() for _ in range(n)]
        given = 0
        for item in self._dataloader():
            worker = item["stream_end"] if "stream_end" in item else item["stream_worker"][0]
            waiting[worker].append(item)
            while not all(w.exhausted for w in position.workers):
                turn = position.next_worker
                if position.workers[turn].exhausted:
                    position.next_worker = (turn + 1) % n
                    continue
                if not waiting[turn]:
                    break
                batch = waiting[turn].popleft()
                if "stream_end" in batch:
                    position.workers[turn].exhausted = True
                    continue
                position.workers[turn] = WorkerPosition(**batch.pop("stream_worker")[1])
                position.next_worker = (turn + 1) % n
                batch["stream_position"] = position.to_dict()
                given += 1
                yield batch
        return given


# --------------------------------------------------------------------------- the recipe's entry points


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

    @property
    def splits(self) -> dict:
        return {"train": self.train, "validation": self.validation_rows}


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
    manifest = read_manifest(root) if root and not stream_args.train_files else None
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
    logger.info(f"Streaming {source}: {rows}{stream.num_shards} shards over {world} process(es), shuffle buffer "
                f"{stream_args.shuffle_buffer_size}, {len(eval_rows):,} {eval_split} rows in memory")  # fmt: skip
    train = StreamingTrainData(stream, rank=rank, world_size=world, seed=seed,
                               shuffle_buffer_size=stream_args.shuffle_buffer_size, num_rows=num_rows,
                               image_column=image_column, label_column=label_column, description=source)  # fmt: skip
    return StreamingData(train, eval_rows, image_column, label_column, names, source, data_args.on_bad_image, raw)


def _encoded_stream(stream: IterableDataset, image_column: str, label_column: str) -> IterableDataset:
    """Images kept encoded (decoded per sample, where a bad one can be skipped) and a content id per row."""
    stream = stream.select_columns([image_column, label_column])
    if isinstance(stream.features[image_column], ImageFeature):
        stream = stream.cast_column(image_column, ImageFeature(decode=False))
    return stream.map(_with_content_id, fn_kwargs={"image_column": image_column})


class EvalRows(torch.utils.data.Dataset):
    """The evaluation rows (in memory, encoded) as a map-style split; each item carries its sample id."""

    def __init__(self, rows: list[dict], to_example):
        self.rows, self.to_example = rows, to_example

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = self.rows[index]
        return {**self.to_example(row), "sample_index": row[SAMPLE_ID]}


def images_share_one_size(data: StreamingData) -> bool:
    """True when the first rows of the evaluation split and of the training stream have one size."""
    rows = data.validation_rows[:PROBE_ROWS] + list(itertools.islice(data.train.rank_stream, PROBE_ROWS))
    return len(distinct_sizes(row[data.image_column] for row in rows)) == 1


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


def attach_streaming_transforms(data: StreamingData, args, size: int, mean, std, resume_from: str | None):
    """(splits, collate, device preprocessor or None) for --streaming: the input path, the examples the stream
    makes, batches of --per_device_train_batch_size, and the data position of the checkpoint resumed from."""
    data_args, training = args.data, args.training
    requested = data_args.input_path
    if requested == "auto":
        requested = "device" if data.raw_shape is not None or images_share_one_size(data) else "per_sample"
    if requested == "device":
        preprocessor = DevicePreprocessor.from_data_args(size, mean, std, data_args)
        collate = collate_uint8_batch

        def pixels_for(train):
            return pil_to_uint8_tensor  # a shard row's uint8 tensor passes through

    else:
        preprocessor, collate = None, stack_batch

        def pixels_for(train):
            return ImageTransform.from_data_args(size, mean, std, train, data_args)

    train_example = example_transform(data, pixels_for(True))
    data.train.attach(train_example, collate, training.per_device_train_batch_size, training.dataloader_drop_last,
                      training.dataloader_num_workers)  # fmt: skip
    note = data.train.restore(resume_from)
    if note:
        logger.info(f"Resume: {note}")
    validation = EvalRows(data.validation_rows, example_transform(data, pixels_for(False)))
    return {"train": data.train, "validation": validation}, collate, preprocessor


def split_size(split) -> int | None:
    """Rows of a split: len() of a map-style one; one pass over all ranks of a stream (None when unknown)."""
    return split.num_rows if isinstance(split, StreamingTrainData) else len(split)
