"""The data position a checkpoint holds per rank (`data_position/rank{R}.json`): the pass, the next worker, and
per worker the rows given and batches made; the settings it is valid for (`RESUME_KEYS`)."""

from dataclasses import dataclass

from hf_vit_scaling.errors import TrainingStopped

POSITION_DIRNAME = "data_position"


POSITION_FORMAT = 1


# Settings a saved data position only holds for: the same ones on resume, or the rows of each step would differ.
RESUME_KEYS = ("world_size", "num_workers", "per_device_batch", "drop_last", "seed", "shuffle_buffer_size", "n_shards")


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


class DataPositionError(TrainingStopped):
    """The stream cannot reach the saved data position (the data changed); only that rank may know."""

    every_rank_knows = False
