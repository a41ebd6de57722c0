"""Streaming data in this process: the manifest and its raw uint8 rows, the per-rank split, the fixed worker order,
the data position written to a checkpoint and read back (datasets' state and replay, with and without DataLoader
workers), and a Parquet stream of encoded images through load_dataset."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.arguments.streaming import StreamingArguments
from hf_vit_scaling.data.decoding import decode_raw, stack_batch
from hf_vit_scaling.data.shards import find_manifest, manifest_shards
from hf_vit_scaling.data.streaming.load import load_streaming_data
from hf_vit_scaling.data.streaming.loader import StreamingTrainData
from hf_vit_scaling.data.streaming.position import POSITION_DIRNAME
from hf_vit_scaling.data.streaming.reader import uint8_shard_stream
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import make_uint8_shards

SHARDS, ROWS, SIZE, BATCH = 8, 20, 4, 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = make_uint8_shards(tmp_path_factory.mktemp("shards"), shards=SHARDS, rows=ROWS, size=SIZE)
    return manifest_shards(find_manifest(str(root)), str(root), "train")


def to_example(row):
    pixels, reason = decode_raw(row["image"], (SIZE, SIZE, 3))
    note = {"sample": f"row {row['sample_id']}", "reason": reason} if reason else None
    return {"pixel_values": pixels, "labels": row["label"], "bad_image": note}


def rank_stream(shards, rank=0, world=2, buffer=16, workers=0, batch=BATCH):
    data = StreamingTrainData(uint8_shard_stream(shards), rank=rank, world_size=world, seed=0,
                              shuffle_buffer_size=buffer, num_rows=None, image_column="image", label_column="label",
                              description="test")  # fmt: skip
    data.attach(to_example, stack_batch, batch, False, workers)
    return data


def take(data, n):
    it = iter(data.loader(prefetch_factor=2 if data.num_workers else None))
    return [next(it) for _ in range(n)]


def test_manifest_layouts_and_raw_rows(tmp_path):
    root = make_uint8_shards(tmp_path / "a", shards=2, rows=3, size=2, channels=1)
    manifest = find_manifest(str(root))
    assert [rows for _, rows in manifest_shards(manifest, str(root), "train")] == [3, 3]
    relative_to_root = {**manifest, "splits": {"train": [{"file": "train/train-00000-of-00002.parquet", "rows": 3}]}}
    assert manifest_shards(relative_to_root, str(root), "train") == [(f"{root}/train/train-00000-of-00002.parquet", 3)]
    rows = list(uint8_shard_stream(manifest_shards(manifest, str(root), "train")))
    assert [r["sample_id"] for r in rows] == list(range(6)) and [r["label"] for r in rows] == [0, 1, 2, 0, 1, 2]
    gray, _ = decode_raw(bytes([1, 2, 3, 4]), (2, 2, 1))
    assert gray.shape == (3, 2, 2) and gray.dtype == torch.uint8 and torch.equal(gray[0], gray[2])
    rgb, _ = decode_raw(np.arange(12, dtype=np.uint8).tobytes(), (2, 2, 3))
    assert rgb[:, 0, 1].tolist() == [3, 4, 5]  # row-major H x W x C
    pixels, reason = decode_raw(b"\0" * 5, (2, 2, 3))
    assert pixels is None and "expected 2x2x3" in reason
    assert find_manifest(str(tmp_path / "none")) is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text(json.dumps({"size": 2}))
    with pytest.raises(UserInputError, match="lacks channels, class_names"):
        find_manifest(str(tmp_path / "bad"))


@pytest.mark.parametrize("workers", [0, 2])
def test_two_ranks_cover_every_row_once_per_pass(shards, workers):
    seen = {}
    for rank in (0, 1):
        for batch in take(rank_stream(shards, rank=rank, workers=workers), 30):  # 14 batches per pass and rank
            seen.setdefault(batch["stream_position"]["pass"], []).extend(batch["sample_index"].tolist())
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(SHARDS * ROWS))
    assert seen[0] != seen[1]


@pytest.mark.parametrize("buffer, workers", [(0, 0), (0, 2), (16, 0), (16, 2)])
def test_resume_from_a_saved_position_gives_the_same_batches(shards, tmp_path, buffer, workers):
    reference = take(rank_stream(shards, buffer=buffer, workers=workers), 24)
    first = rank_stream(shards, buffer=buffer, workers=workers)
    assert first.uses_datasets_state == (buffer == 0 and workers == 0)
    trained = take(first, 17)  # into pass 1 (14 batches per pass)
    first.save_position(str(tmp_path), trained[-1]["stream_position"])
    saved = json.loads((tmp_path / POSITION_DIRNAME / "rank0.json").read_text())
    assert saved["pass"] == 1 and (saved["workers"][0]["datasets_state"] is not None) == first.uses_datasets_state

    resumed = rank_stream(shards, buffer=buffer, workers=workers)
    assert resumed.restore(str(tmp_path)) == "data position: pass 1, 3 batches into it"
    rest = take(resumed, 7)
    assert [b["sample_index"].tolist() for b in rest] == [b["sample_index"].tolist() for b in reference[17:]]
    assert torch.equal(rest[0]["pixel_values"], reference[17]["pixel_values"])


def test_without_buffer_shards_are_read_whole_in_a_new_order_each_pass(shards):
    batches = take(rank_stream(shards, world=1, buffer=0, batch=ROWS), 2 * SHARDS)
    ids = [i for b in batches for i in b["sample_index"].tolist()]
    passes = [ids[: SHARDS * ROWS], ids[SHARDS * ROWS :]]
    orders = [[p[k * ROWS] // ROWS for k in range(SHARDS)] for p in passes]
    for p, order in zip(passes, orders):  # shard after shard, each in its stored row order
        assert p == [shard * ROWS + r for shard in order for r in range(ROWS)]
    assert sorted(orders[0]) == list(range(SHARDS)) and orders[0] != orders[1]


def test_workers_are_read_in_a_fixed_order(shards):
    batches = take(rank_stream(shards, workers=2), 14)
    order = [b["stream_position"]["next_worker"] for b in batches]
    assert order == [1, 0] * 7  # worker 0, 1, 0, ... whichever is faster


def test_restore_refuses_other_settings_and_missing_positions(shards, tmp_path):
    rank_stream(shards, workers=0).save_position(str(tmp_path), None)
    with pytest.raises(UserInputError, match=r"num_workers 0 -> 2\).*same number of processes"):
        rank_stream(shards, workers=2).restore(str(tmp_path))
    with pytest.raises(UserInputError, match="world_size 2 -> 4"):
        rank_stream(shards, world=4).restore(str(tmp_path))
    with pytest.raises(UserInputError, match="holds no data position"):
        rank_stream(shards).restore(str(tmp_path / "elsewhere"))
    assert rank_stream(shards).restore(None) is None


def test_unreadable_row_is_left_out_of_its_batch(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = make_uint8_shards(tmp_path / "d", shards=1, rows=4, size=SIZE)
    path = root / "train" / "train-00000-of-00001.parquet"
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    images[2] = b"short"
    pq.write_table(table.set_column(0, "image", pa.array(images, pa.binary())), path)
    data = rank_stream(manifest_shards(find_manifest(str(root)), str(root), "train"), world=1, buffer=0, batch=4)
    batch = take(data, 1)[0]
    assert batch["sample_index"].tolist() == [0, 1, 3] and batch["pixel_values"].shape[0] == 3
    assert batch["bad_samples"][0]["sample"] == "row 2"


def test_parquet_files_of_encoded_images_stream_through_load_dataset(tmp_path):
    """--train_files: datasets' Parquet builder, images decoded per sample, content ids, class names from the
    ClassLabel feature."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature
    from PIL import Image

    features = Features({"img": ImageFeature(), "label": ClassLabel(names=["cat", "dog"])})
    for split, n in (("train", 12), ("validation", 4)):
        for part in range(2):
            images = [Image.fromarray(np.full((5, 5, 3), 10 * (part * n + i), np.uint8)) for i in range(n)]
            Dataset.from_dict({"img": images, "label": [i % 2 for i in range(n)]}, features=features).to_parquet(
                str(tmp_path / f"{split}-{part}.parquet")
            )
    data_args = SimpleNamespace(dataset_name=None, dataset_config_name=None, image_column_name=None,
                                label_column_name=None, max_eval_samples=5, on_bad_image="skip")  # fmt: skip
    stream_args = StreamingArguments(streaming=True, shuffle_buffer_size=0, train_files=f"{tmp_path}/train-*.parquet",
                                     validation_files=f"{tmp_path}/validation-*.parquet")  # fmt: skip
    data = load_streaming_data(data_args, stream_args, seed=0)
    assert data.label_names == ["cat", "dog"] and data.image_column == "img" and data.raw_shape is None
    assert len(data.validation_rows) == 5 and data.train.n_shards == 2
    data_args = DataArguments(input_path="auto", random_resized_crop=False, crop_scale_min=1.0, horizontal_flip=False)
    from hf_vit_scaling.data.streaming.load import StreamBatches, attach_streaming_transforms

    splits, _, preprocessor, _ = attach_streaming_transforms(data, data_args, StreamBatches(8), 8, [0.5] * 3,
                                                             [0.5] * 3, None)  # fmt: skip
    assert preprocessor is not None  # one image size: the device path
    batches = take(splits["train"], 3)  # a pass: 24 rows = 8 + 8 + 8
    ids = [i for b in batches for i in b["sample_index"].tolist()]
    assert len(set(ids)) == 24 and batches[0]["pixel_values"].dtype == torch.uint8
    assert splits["validation"][0]["pixel_values"].shape == (3, 5, 5)
