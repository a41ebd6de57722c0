"""This rank's training stream as the Trainer's data: batches made in the stream (in DataLoader workers),
taken from the workers in a fixed order, with the data position saved in and restored from each checkpoint."""

import copy
import itertools
import json
import logging
import os
from collections import deque

import torch
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node

from hf_vit_scaling.data.sample_randomness import drawing_for_row, sample_seed
from hf_vit_scaling.data.streaming.position import (
    POSITION_DIRNAME,
    POSITION_FORMAT,
    RESUME_KEYS,
    DataPositionError,
    StreamPosition,
    WorkerPosition,
)
from hf_vit_scaling.data.streaming.reader import (
    SAMPLE_ID,
)
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.utils import write_json_atomically

SHUFFLE_INPUT_SHARDS = 10  # datasets' default for IterableDataset.shuffle(max_buffer_input_shards)


class StreamingTrainData(torch.utils.data.IterableDataset):
    """One rank's training stream. Iterated (in a DataLoader worker, or in the main process without workers) it
    yields that worker's batches of the current pass, each with its worker position, then an end marker; the
    `loader` puts the workers' batches in their fixed order and chains the passes."""

    def __init__(
        self,
        stream: IterableDataset,
        *,
        rank: int,
        world_size: int,
        seed: int,
        shuffle_buffer_size: int,
        num_rows: int | None,
        image_column: str,
        label_column: str,
        description: str,
    ):
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
        DataLoader workers (datasets loads a worker's state into the rank's whole stream first, before the worker's
        share is taken, which fails with an IndexError once shards are interleaved; the version read:
        docs/streaming.md, "Limits")."""
        return self.shuffle_buffer_size == 0 and self.num_workers == 0

    def loader(
        self, pin_memory: bool = False, prefetch_factor: int | None = None, multiprocessing_context=None
    ) -> "StreamLoader":
        """The training dataloader, with the Trainer's loader settings (its workers: `attach`'s)."""
        return StreamLoader(self, pin_memory, prefetch_factor, multiprocessing_context)

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
            with drawing_for_row(self.seed, self._pass_index, row[SAMPLE_ID]):  # the row's own host draws
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


LOADER_ROW = 2**64 - 1  # a row number no data set reaches: the pass's loader seed is no row's seed


def _keep(item):
    return item


class StreamLoader:
    """The Trainer's training dataloader under --streaming: one rank's batches, pass after pass, without end.

    Workers make batches from their own shards; batches are taken from workers 0, 1, ..., W-1, 0, ... (an exhausted
    worker is passed over), whatever order they arrive in, so a position (pass, next worker, each worker's rows)
    says exactly which batch comes next. Each batch carries the position after it (`stream_position`), which the
    trainer keeps for the checkpoint."""

    def __init__(
        self,
        data: StreamingTrainData,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context=None,
    ):
        self.data, self.pin_memory = data, pin_memory
        self.prefetch_factor, self.multiprocessing_context = prefetch_factor, multiprocessing_context

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

    def _dataloader(self, pass_index: int):
        """One pass's DataLoader. Its own generator, seeded from (seed, pass): the workers' base seed is drawn from
        it, not from torch's default stream, whose position the checkpoint saves (a new pass started just after a
        checkpoint would otherwise shift every later device-side draw of an uninterrupted run against a resumed one).
        The host transforms draw per row (`drawing_for_row`), so the workers' seeds decide nothing they make."""
        workers = self.data.num_workers
        generator = torch.Generator().manual_seed(sample_seed(self.data.seed, pass_index, LOADER_ROW))
        extra = {}
        if workers > 0:
            extra = {
                "prefetch_factor": self.prefetch_factor,
                "multiprocessing_context": self.multiprocessing_context,
            }
        return torch.utils.data.DataLoader(
            self.data,
            batch_size=None,
            num_workers=workers,
            collate_fn=_keep,
            pin_memory=self.pin_memory,
            generator=generator,
            **extra,
        )

    def _one_pass(self, position: StreamPosition):
        """Yield the pass's batches in worker order, updating `position`; returns how many were yielded."""
        self.data.begin_pass(position)
        n = len(position.workers)
        waiting = [deque() for _ in range(n)]
        given = 0
        for item in self._dataloader(position.pass_index):
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
