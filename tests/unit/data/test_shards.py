"""Tests `data.shards`: the one strict reader of manifest.json and its shard folders."""

import json

import pytest

from hf_vit_scaling.data.shards import find_manifest, read_manifest
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import make_uint8_shards


def test_one_manifest_reader_checks_format_and_shards(tmp_path):
    """The prepare step's folders and streamed shard folders are read by one strict reader (`data.shards`)."""
    root = make_uint8_shards(tmp_path / "a", shards=2, rows=3, size=2, channels=1)
    assert find_manifest(f"file://{root}")["size"] == 2  # any fsspec URL
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(UserInputError, match="not a format_version 1"):
        find_manifest(str(root))
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "train" / "train-00001-of-00002.parquet").unlink()
    with pytest.raises(UserInputError, match=r"1 shard\(s\) listed in manifest.json are missing"):
        find_manifest(str(root))
    with pytest.raises(UserInputError, match="has no manifest.json"):
        read_manifest(str(tmp_path / "none"))
