"""The prepare step (`data.prepare`, recipes/prepare_shards.py): good images stored as their centre square at S x S
(values checked against a full-size decode), CMYK and 16-bit PNG converted correctly, the corrupt file named in the
manifest; same flags give the same shards in 1 or 2 processes; a rerun keeps finished shards; other flags are
refused; training reads the shards as raw uint8 on the device path. A real kill mid-run:
tests/launched/test_prepare_launched.py."""

import json
import os
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.crop_decode import centre_square
from hf_vit_scaling.data.device_transforms import attach_uint8_transforms, collate_uint8_batch
from hf_vit_scaling.data.host_transforms import attach_transforms
from hf_vit_scaling.data.input_path import choose_input_path
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.data.prepare import SourceSpec, prepare_shards
from hf_vit_scaling.data.shards import MANIFEST, file_sha256, read_manifest
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import GRAY16_AS_8BIT, make_prepare_source, smooth_image

S = 16


def _rows(out) -> list[tuple[np.ndarray, int, str]]:
    """(pixels H x W x C, label, shard file) of every stored row, from the Parquet files the manifest lists."""
    manifest = read_manifest(str(out))
    rows = []
    for shard in manifest["splits"]["train"]:
        table = pq.read_table(os.path.join(out, shard["file"]))
        assert table.schema.field("image").type == "binary" and table.schema.field("label").type == "int64"
        for image, label in zip(table.column("image").to_pylist(), table.column("label").to_pylist()):
            pixels = np.frombuffer(image, np.uint8).reshape(S, S, manifest["channels"])
            rows.append((pixels, label, shard["file"]))
    return rows


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepare")
    written = make_prepare_source(root / "src")
    summary = prepare_shards(SourceSpec(train_dir=str(root / "src")), str(root / "out"), size=S, shard_rows=2)
    return root, written, summary


def test_good_images_are_stored_as_their_centre_square(prepared):
    root, written, summary = prepared
    manifest = read_manifest(str(root / "out"))
    assert (manifest["size"], manifest["channels"], manifest["format_version"]) == (S, 3, 1)
    assert manifest["class_names"] == ["a", "b"] and summary["rows"] == {"train": 6}
    rows = _rows(root / "out")
    assert len(rows) == 6 and sorted(label for _, label, _ in rows) == [0, 0, 0, 0, 1, 1]
    for name, image in written["good"].items():  # each good JPEG: shorter side to S, centre S x S
        reference = np.asarray(image.resize((S, S), Image.Resampling.BILINEAR, box=centre_square(*image.size)))
        diffs = [np.abs(pixels.astype(int) - reference).mean() for pixels, label, _ in rows if label == 0]
        assert min(diffs) < 1.5, (name, diffs)  # found among the stored rows (their order is shuffled)


def test_cmyk_and_16bit_png_are_converted_and_the_corrupt_file_is_named(prepared):
    root, written, _ = prepared
    rows = [pixels for pixels, label, _ in _rows(root / "out") if label == 1]
    magenta = [p for p in rows if abs(int(p[..., 0].mean()) - 255) <= 3 and p[..., 1].max() <= 3]
    assert len(magenta) == 1 and abs(magenta[0][..., 2].astype(int) - 255).max() <= 3
    gray = [p for p in rows if p is not magenta[0]][0]  # 16 x 16 already: stored as is, scaled not clipped
    assert all(np.array_equal(gray[..., c], GRAY16_AS_8BIT) for c in range(3))
    manifest = read_manifest(str(root / "out"))
    assert len(manifest["skipped"]) == 1
    skipped = manifest["skipped"][0]
    assert skipped["source_index_or_path"] == str(written["corrupt"]) and skipped["split"] == "train"
    assert skipped["reason"].startswith("OSError")


def test_shards_are_named_checksummed_and_counted(prepared):
    root, _, _ = prepared
    manifest = read_manifest(str(root / "out"))
    shards = manifest["splits"]["train"]
    assert [s["file"] for s in shards] == [f"train/train-{i:05d}-of-00004.parquet" for i in range(4)]
    for shard in shards:
        path = os.path.join(root / "out", shard["file"])
        assert file_sha256(path) == shard["sha256"] and pq.read_metadata(path).num_rows == shard["rows"]
    rows = _rows(root / "out")
    for shard in shards:
        labels = [label for _, label, file in rows if file == shard["file"]]
        assert shard["count_per_class"] == [labels.count(0), labels.count(1)]
    assert not [f for f in os.listdir(root / "out" / "train") if not re.fullmatch(r"train-\d{5}-of-\d{5}\.parquet", f)]


def test_same_flags_same_shards_in_two_processes_and_a_rerun_keeps_them(prepared, tmp_path):
    root, _, _ = prepared
    spec = SourceSpec(train_dir=str(root / "src"))
    summary = prepare_shards(spec, str(tmp_path / "out2"), size=S, shard_rows=2, num_proc=2)
    assert summary["shards_written"] == 4
    first, second = read_manifest(str(root / "out")), read_manifest(str(tmp_path / "out2"))
    assert [s["sha256"] for s in first["splits"]["train"]] == [s["sha256"] for s in second["splits"]["train"]]
    stat = {f: os.stat(tmp_path / "out2" / f) for f in (s["file"] for s in second["splits"]["train"])}
    os.remove(tmp_path / "out2" / second["splits"]["train"][2]["file"])  # one shard lost
    summary = prepare_shards(spec, str(tmp_path / "out2"), size=S, shard_rows=2, num_proc=2)
    assert (summary["shards_written"], summary["shards_reused"]) == (1, 3)
    for file, before in stat.items():
        after = os.stat(tmp_path / "out2" / file)
        if file != second["splits"]["train"][2]["file"]:
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert read_manifest(str(tmp_path / "out2")) == second


def test_a_changed_shard_is_redone_and_other_flags_are_refused(prepared, tmp_path):
    root, _, _ = prepared
    spec = SourceSpec(train_dir=str(root / "src"))
    prepare_shards(spec, str(tmp_path / "out"), size=S, shard_rows=2)
    shard = tmp_path / "out" / "train" / "train-00001-of-00004.parquet"
    shard.write_bytes(shard.read_bytes()[:-10])  # damaged: its sha256 no longer matches its record
    assert prepare_shards(spec, str(tmp_path / "out"), size=S, shard_rows=2)["shards_written"] == 1
    with pytest.raises(UserInputError, match="size differ"):
        prepare_shards(spec, str(tmp_path / "out"), size=S + 8, shard_rows=2)


def test_training_reads_prepared_shards_as_raw_uint8_on_the_device_path(prepared):
    root, _, _ = prepared
    data = load_image_classification_data(DataArguments(dataset_name=str(root / "out"), train_val_split=0.34))
    assert data.raw_shape == (S, S, 3) and data.label_names == ["a", "b"]
    assert choose_input_path(data, "auto").name == "device"
    with pytest.raises(UserInputError, match="--input_path auto or device"):
        choose_input_path(data, "host_crop")
    stored = {pixels.tobytes() for pixels, _, _ in _rows(root / "out")}
    splits = attach_uint8_transforms(data)
    batch = collate_uint8_batch([splits["train"][i] for i in range(len(splits["train"]))])
    assert batch["pixel_values"].dtype == torch.uint8 and batch["pixel_values"].shape[1:] == (3, S, S)
    assert all(p.permute(1, 2, 0).numpy().tobytes() in stored for p in batch["pixel_values"])  # the bytes, unchanged


def test_grayscale_sources_are_stored_with_one_channel_and_zstd_shards_read_back(tmp_path):
    for i in range(4):
        folder = tmp_path / "src" / "xy"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        smooth_image(20 + i, 24, seed=i).convert("L").save(folder / f"{i}.png")
    prepare_shards(SourceSpec(train_dir=str(tmp_path / "src")), str(tmp_path / "out"), size=8, compression="zstd")
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["channels"] == 1
    args = DataArguments(dataset_name=str(tmp_path / "out"), train_val_split=0.5)
    data = load_image_classification_data(args)
    item = attach_transforms(data, 8, [0.5] * 3, [0.5] * 3, args)["validation"][0]  # the per-sample path works too
    assert item["pixel_values"].shape == (3, 8, 8) and torch.equal(item["pixel_values"][0], item["pixel_values"][2])
