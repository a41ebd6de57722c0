"""Data the tests write to disk: image folders (mixed modes and sizes, corrupt and truncated files), JPEGs,
prepare-step sources, save_to_disk datasets, uint8 Parquet shards, MRI-like scans, and tiny ViT configs and
checkpoints."""

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

# (mode, (width, height)): every mode and shape the loader must turn into model-sized RGB.
MIXED = [("RGB", (20, 12)), ("L", (9, 9)), ("P", (31, 17)), ("RGBA", (16, 40)), ("RGB", (64, 64)), ("L", (5, 7))]


# Starts like a JPEG, is none: PIL cannot identify it.
NOT_AN_IMAGE = b"\xff\xd8\xff\xe0 not a jpeg at all"


TRUNCATED_BYTES = 60  # a PNG cut after its header: it opens, and fails when decoded


def make_image_folder(
    root, images=MIXED, classes=("cat", "dog"), *, digits=0, corrupt=(), truncated=(), empty=False
) -> Path:
    """An image folder (one sub-folder per class) at `root`; returns `root`.

    images: (mode, (width, height)) of the random-pixel PNGs 0.png, 1.png, ... written to every class folder.
    digits: instead, the first `digits` images of scikit-learn's digits 0 and 1 (real, learnable), as {i}.png in
        class folders "0" and "1".
    Bad files go to the first class folder: `corrupt` names files holding NOT_AN_IMAGE, `truncated` names files
    holding the first TRUNCATED_BYTES bytes of that folder's 0.png. empty: the first class folder holds one text
    file and nothing else.
    """
    root = Path(root)
    if empty:
        (root / classes[0]).mkdir(parents=True, exist_ok=True)
        (root / classes[0] / "notes.txt").write_text("no images here")
        return root
    if digits:
        from sklearn.datasets import load_digits

        data = load_digits(n_class=2)
        classes = ("0", "1")
        for i, (pixels, label) in enumerate(zip(data.images[:digits], data.target[:digits])):
            folder = root / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.clip(pixels * 16, 0, 255).astype(np.uint8)).save(folder / f"{i}.png")
    else:
        rng = np.random.default_rng(0)
        for cls in classes:
            (root / cls).mkdir(parents=True, exist_ok=True)
            for i, (mode, size) in enumerate(images):
                array = rng.integers(0, 255, size=(size[1], size[0], 4 if mode == "RGBA" else 3), dtype=np.uint8)
                img = Image.fromarray(array, mode="RGBA" if mode == "RGBA" else "RGB")
                if mode in ("L", "P"):
                    img = img.convert(mode)
                img.save(root / cls / f"{i}.png")
    first = root / classes[0]
    for name in corrupt:
        (first / name).write_bytes(NOT_AN_IMAGE)
    for name in truncated:
        (first / name).write_bytes((first / "0.png").read_bytes()[:TRUNCATED_BYTES])
    return root


def smooth_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB image of smooth colour gradients (no detail finer than ~1/4 of its size): JPEG-compressed and decoded
    at reduced size it stays close to a resize of the full image, so tests can compare within a few levels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:height, :width] / np.array([height, width]).reshape(2, 1, 1)
    channels = [127 + 100 * np.sin(2 * (rng.uniform(-2, 2) * x + rng.uniform(-2, 2) * y) + rng.uniform(0, 6))
                for _ in range(3)]  # fmt: skip
    return Image.fromarray(np.stack(channels, -1).astype(np.uint8))


def one_image_folder(root, copies: int = 24) -> Path:
    """An image folder of classes a and b holding `copies` copies each of one image: two ranks' pixels then differ
    only through their random draws, whichever rows they read."""
    root = Path(root)
    image = smooth_image(32, 32, seed=3)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(copies):
            image.save(root / label / f"{i}.png")
    return root


def jpeg_bytes(image: Image.Image, quality: int = 95) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


# A 16-bit grayscale ramp, 16 x 16: pixel i holds i * 257 + 100 (capped at 65535). Scaled to 8 bit it is i (0..255);
# clipped (PIL's convert) it would be min(v, 255): 100 and then 255 everywhere.
GRAY16 = np.minimum(np.arange(256) * 257 + 100, 65535).astype(np.uint16).reshape(16, 16)


GRAY16_AS_8BIT = np.arange(256, dtype=np.uint8).reshape(16, 16)


MAGENTA_CMYK = (0, 255, 0, 0)  # -> RGB (255, 0, 255)


def make_prepare_source(root, good_sizes=((60, 40), (40, 70), (50, 50), (90, 64))) -> dict:
    """An image folder for the prepare step: class "a" holds smooth JPEGs of `good_sizes` and a corrupt JPEG (a real
    one cut in its pixel data: it opens, and fails to decode); class "b" holds a CMYK JPEG (magenta) and a 16-bit
    grayscale PNG (GRAY16). Returns {"good": {name: PIL RGB image}, "corrupt": path, "cmyk": path, "gray16": path}."""
    root = Path(root)
    (root / "a").mkdir(parents=True, exist_ok=True)
    (root / "b").mkdir(parents=True, exist_ok=True)
    good = {}
    for i, size in enumerate(good_sizes):
        image = smooth_image(*size, seed=i)
        (root / "a" / f"good{i}.jpg").write_bytes(jpeg_bytes(image))
        good[f"a/good{i}.jpg"] = Image.open(root / "a" / f"good{i}.jpg").convert("RGB")
    whole = jpeg_bytes(smooth_image(64, 64, seed=99))
    (root / "a" / "corrupt.jpg").write_bytes(whole[: len(whole) // 2])
    Image.new("CMYK", (30, 20), MAGENTA_CMYK).save(root / "b" / "cmyk.jpg", quality=95)
    Image.fromarray(GRAY16).save(root / "b" / "gray16.png")
    return {"good": good, "corrupt": root / "a" / "corrupt.jpg", "cmyk": root / "b" / "cmyk.jpg",
            "gray16": root / "b" / "gray16.png"}  # fmt: skip


def make_saved_dataset(
    path, labels, label_feature=None, *, image_column="image", label_column="label", test_rows=0
) -> Path:
    """A DatasetDict written with `save_to_disk` at `path`; returns `path`. "train" holds one 6x6 grayscale image
    per label; "test" (only when test_rows > 0) repeats the first `test_rows` rows. label_feature: a datasets
    feature for the label column (default Value("int64"))."""
    from datasets import Dataset, DatasetDict, Features, Value
    from datasets import Image as ImageFeature

    images = [Image.fromarray(np.full((6, 6), 40 * i % 256, dtype=np.uint8), mode="L") for i in range(len(labels))]
    features = Features({image_column: ImageFeature(), label_column: label_feature or Value("int64")})
    train = Dataset.from_dict({image_column: images, label_column: labels}, features=features)
    splits = {"train": train, **({"test": train.select(range(test_rows))} if test_rows else {})}
    DatasetDict(splits).save_to_disk(str(path))
    return Path(path)


def make_uint8_shards(root, shards=16, rows=64, *, size=16, channels=3, classes=("a", "b", "c"), eval_rows=32,
                      seed=0) -> Path:  # fmt: skip
    """uint8 Parquet shards as the prepare step writes them, at `root` (returned):
    <root>/<split>/<split>-NNNNN-of-MMMMM.parquet (columns image: raw row-major size x size x channels bytes,
    label: int64) for "train" (`shards` x `rows`) and "validation" (one shard of `eval_rows`), and
    <root>/manifest.json (size, channels, class_names, splits with {file, rows} per shard). Training row i (in shard
    order) has label i % len(classes) and random pixels."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, rng = Path(root), np.random.default_rng(seed)
    from hf_vit_scaling.data.shards import FORMAT, FORMAT_VERSION

    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "size": size, "channels": channels,
                "class_names": list(classes), "splits": {}}  # fmt: skip
    for split, n_shards, n_rows in (("train", shards, rows), ("validation", 1, eval_rows)):
        (root / split).mkdir(parents=True, exist_ok=True)
        manifest["splits"][split] = []
        for s in range(n_shards):
            name = f"{split}-{s:05d}-of-{n_shards:05d}.parquet"
            pixels = rng.integers(0, 256, size=(n_rows, size * size * channels), dtype=np.uint8)
            labels = [(s * n_rows + i) % len(classes) for i in range(n_rows)]
            table = pa.table({"image": pa.array([p.tobytes() for p in pixels], pa.binary()),
                              "label": pa.array(labels, pa.int64())})  # fmt: skip
            pq.write_table(table, root / split / name, row_group_size=max(1, n_rows // 2))
            manifest["splits"][split].append({"file": name, "rows": n_rows})
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


def scan(seed: int, size: int = 160) -> Image.Image:
    """A smooth, MRI-like test image: a bright ring (skull) around random low-frequency blobs."""
    rng = np.random.default_rng(seed)
    blobs = Image.fromarray(rng.integers(0, 255, (6, 6), dtype=np.uint8)).resize(
        (size, size), Image.Resampling.BICUBIC
    )
    y, x = np.mgrid[:size, :size] / size - 0.5
    radius = np.hypot(x, y)
    pixels = np.asarray(blobs, dtype=np.float64) * (radius < 0.4) + 230 * ((radius >= 0.4) & (radius < 0.45))
    return Image.fromarray(pixels.astype(np.uint8)).convert("RGB")


def tiny_vit_config(image_size=8, hidden_size=16, num_hidden_layers=1, num_labels=3):
    """A ViTConfig small enough for in-process tests: patch 4, 2 heads, MLP twice the width."""
    from transformers import ViTConfig

    return ViTConfig(image_size=image_size, patch_size=4, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                     num_attention_heads=2, intermediate_size=2 * hidden_size, num_labels=num_labels)  # fmt: skip


def save_tiny_pretrained_vit(path, num_labels=3):
    """A seeded 2-layer ViT (16 px, patch 4, width 32) saved with `save_pretrained` at `path`; returns the model."""
    import torch
    from transformers import ViTForImageClassification

    torch.manual_seed(0)
    config = tiny_vit_config(image_size=16, hidden_size=32, num_hidden_layers=2, num_labels=num_labels)
    model = ViTForImageClassification(config)
    model.save_pretrained(path)
    return model


WEIGHT_ALTERATIONS = ("missing", "unexpected", "wrong shape")


def alter_saved_weights(folder, alteration: str) -> str:
    """Alter the model.safetensors of a saved model in `folder` one way of WEIGHT_ALTERATIONS: drop its first 2-d
    tensor ("missing"), add a copy of it under a name the model lacks ("unexpected"), or give it one more row
    ("wrong shape"). Returns the checkpoint key concerned (the added one for "unexpected")."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = Path(folder) / "model.safetensors"
    tensors = load_file(weights)
    key = next(name for name in sorted(tensors) if tensors[name].dim() == 2)
    if alteration == "missing":
        del tensors[key]
    elif alteration == "unexpected":
        key = "unexpected_extra." + key
        tensors[key] = tensors[key.removeprefix("unexpected_extra.")].clone()
    elif alteration == "wrong shape":
        tensors[key] = torch.zeros(tensors[key].shape[0] + 1, *tensors[key].shape[1:])
    else:
        raise ValueError(f"unknown alteration {alteration!r}")
    save_file(tensors, weights, metadata={"format": "pt"})
    return key
