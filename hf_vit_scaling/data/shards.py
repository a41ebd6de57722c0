"""Prepared uint8 shards: the on-disk format `recipes/prepare_shards.py` writes (`prepare`) and training reads.

    <out>/manifest.json                                written last: present means every shard is complete
    <out>/<split>/<split>-NNNNN-of-MMMMM.parquet       the shards (NNNNN from 00000, MMMMM = shards in the split)
    <out>/.progress/<split>-NNNNN-of-MMMMM.json        one per finished shard: what a rerun checks (see `prepare`)

Each shard is a Parquet file with two columns: `image` (binary: raw uint8 bytes, row-major H x W x C, C = 3 for RGB
or 1 for grayscale; H = W = S for every row) and `label` (int64, an index into `class_names`).

manifest.json, format_version 1 (readers check the version; fields are only ever added within a version):

    {"format": "hf-vit-scaling-uint8-shards", "format_version": 1,
     "size": S, "channels": C, "layout": "HWC", "dtype": "uint8",
     "resize": "shorter side to S (PIL bilinear, antialiased), centre S x S kept",
     "class_names": ["cat", ...], "source": "<Hub id or folder>",
     "splits": {"train": [{"file": "train/train-00000-of-00004.parquet", "rows": 1000, "sha256": "...",
                           "count_per_class": [n_0, n_1, ...]}, ...], "validation": [...]},
     "skipped": [{"split": "train", "source_index_or_path": "cat/3.jpg" or 17, "reason": "OSError: ..."}],
     "settings": {...the prepare flags...}, "created_with": {"pillow": ..., "pyarrow": ..., "datasets": ...}}

`file` is relative to <out>. `count_per_class[k]` counts rows with label k.

Training reads the shards map-style: `--dataset_name <out>` (recognised by its manifest.json) loads them through
datasets' Parquet builder, which copies them once into its Arrow cache (memory-mapped afterwards: random access, as
every map-style source here); the rows are raw pixels, so nothing is decoded (`decoding.decode_raw`).
"""

import hashlib
import json
import os

from hf_vit_scaling.errors import UserInputError

FORMAT = "hf-vit-scaling-uint8-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRESS_DIR = ".progress"


def shard_file(split: str, index: int, count: int) -> str:
    """A shard's path relative to the output folder: `<split>/<split>-NNNNN-of-MMMMM.parquet`."""
    return f"{split}/{split}-{index:05d}-of-{count:05d}.parquet"


def progress_file(split: str, index: int, count: int) -> str:
    """A finished shard's record, relative to the output folder."""
    return f"{PROGRESS_DIR}/{split}-{index:05d}-of-{count:05d}.json"


def file_sha256(path: str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def is_prepared(path: str | None) -> bool:
    """A folder written by the prepare step (it has a manifest.json)."""
    return bool(path) and os.path.isfile(os.path.join(path, MANIFEST))


def _url_to_fs(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)


def manifest_shards(manifest: dict, root: str, split: str) -> list[tuple[str, int]]:
    """[(URL, rows)] of a split's shards in the manifest's order, each listed as {file, rows}; `file` is relative to
    ROOT (a path with a slash, as the prepare step writes it) or to `ROOT/<split>/` (a bare name)."""
    base = root.rstrip("/")
    return [
        (f"{base}/{s['file']}" if "/" in s["file"] else f"{base}/{split}/{s['file']}", int(s["rows"]))
        for s in manifest["splits"].get(split) or []
    ]


def _missing_shards(fs, manifest: dict, root: str) -> list[str]:
    """Listed shard files that are not there: one directory listing per folder (cheap on remote file systems too)."""
    urls = [url for split in manifest["splits"] for url, _ in manifest_shards(manifest, root, split)]
    wanted = [_url_to_fs(url)[1] for url in urls]
    present = {}
    for path in wanted:
        folder = path.rsplit("/", 1)[0]
        if folder not in present:
            present[folder] = set(fs.ls(folder, detail=False)) if fs.isdir(folder) else set()
    return [path for path in wanted if path not in present[path.rsplit("/", 1)[0]]]


def find_manifest(root: str) -> dict | None:
    """The checked manifest of a uint8 shard folder (a local path or any fsspec URL), or None when `root` has no
    manifest.json. Checked strictly: the keys readers use, the format and its version, channels, and that every
    listed shard is there."""
    fs, path = _url_to_fs(root)
    manifest_path = f"{path.rstrip('/')}/{MANIFEST}"
    if not fs.isfile(manifest_path):
        return None
    try:
        with fs.open(manifest_path, "rb") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise UserInputError(f"{root}/{MANIFEST} cannot be read ({err}). Fix: prepare the data again.") from err
    missing = [key for key in ("size", "channels", "class_names", "splits") if key not in manifest]
    if missing:
        raise UserInputError(f"{root}/{MANIFEST} lacks {', '.join(missing)}. Fix: write the shards again.")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise UserInputError(
            f"{root}/{MANIFEST} is not a format_version {FORMAT_VERSION} {FORMAT} manifest "
            f"(format {manifest.get('format')!r}, version {manifest.get('format_version')!r}). "
            "Fix: prepare the data again with this version's recipes/prepare_shards.py."
        )
    if manifest["channels"] not in (1, 3):
        raise UserInputError(f"{root}/{MANIFEST}: channels {manifest['channels']}; 1 or 3 are read.")
    absent = _missing_shards(fs, manifest, root)
    if absent:
        raise UserInputError(
            f"{root}: {len(absent)} shard(s) listed in {MANIFEST} are missing (first: {absent[0]}). "
            "Fix: rerun recipes/prepare_shards.py with the same flags (it redoes only what is missing)."
        )
    return manifest


def read_manifest(root: str) -> dict:
    """`find_manifest` for a folder that must be prepared shards."""
    manifest = find_manifest(root)
    if manifest is None:
        raise UserInputError(f"{root} has no {MANIFEST}. Fix: point at a folder written by recipes/prepare_shards.py.")
    return manifest


def raw_shape(manifest: dict) -> tuple[int, int, int]:
    """(H, W, C) of every stored image."""
    return manifest["size"], manifest["size"], manifest["channels"]


def load_prepared(path: str, cache_dir: str | None = None):
    """(DatasetDict with columns image (raw bytes) and label (ClassLabel of the manifest's class names), manifest)."""
    from datasets import ClassLabel, Features, Value, load_dataset

    manifest = read_manifest(path)
    files = {split: [url for url, _ in manifest_shards(manifest, path, split)] for split in manifest["splits"]}
    files = {split: urls for split, urls in files.items() if urls}
    features = Features({"image": Value("binary"), "label": ClassLabel(names=manifest["class_names"])})
    return load_dataset("parquet", data_files=files, features=features, cache_dir=cache_dir), manifest
