"""recipes/fashion_mnist/prepare.py on small IDX files written here: splits, features, pixels, and the recipe's
loader picking 'test' as the evaluation split. The script's `main(argv)` is called in this process (a subprocess
would spend its time importing)."""

import gzip
import importlib.util
from pathlib import Path

import numpy as np
from datasets import ClassLabel, load_from_disk
from datasets import Image as ImageFeature

from hf_vit_scaling.data.loading import load_image_classification_data

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "recipes" / "fashion_mnist" / "prepare.py"


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def fake_source(folder: Path, sizes=(("train", 12), ("t10k", 5))) -> dict:
    rng = np.random.default_rng(0)
    written = {}
    for prefix, n in sizes:
        images, labels = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images, 2051)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels, 2049)
        written[prefix] = (images, labels)
    return written


def load_prepare_script():
    spec = importlib.util.spec_from_file_location("fashion_mnist_prepare", PREPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PREPARE_MAIN = load_prepare_script().main


def prepare(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr) of `python recipes/fashion_mnist/prepare.py ARGS`."""
    capsys.readouterr()
    code = PREPARE_MAIN([str(a) for a in args])
    return code, capsys.readouterr().err


def test_prepare_writes_train_and_test_splits_the_recipe_reads(tmp_path, capsys):
    written = fake_source(tmp_path)
    out = tmp_path / "fmnist"
    code, err = prepare(capsys, "--source", tmp_path, "--output_dir", out, "--no_size_check")
    assert code == 0, err
    splits = load_from_disk(str(out))
    assert set(splits) == {"train", "test"} and (len(splits["train"]), len(splits["test"])) == (12, 5)
    features = splits["train"].features
    assert isinstance(features["image"], ImageFeature) and isinstance(features["label"], ClassLabel)
    assert features["label"].names[0] == "T - shirt / top" and len(features["label"].names) == 10
    for name, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = written[prefix]
        first = splits[name][0]["image"]
        assert first.mode == "L" and first.size == (28, 28)
        assert np.array_equal(np.asarray(first), images[0])
        assert splits[name]["label"] == labels.tolist()

    class DataArgs:  # the recipe's DataArguments fields that the loader reads
        dataset_name, dataset_config_name, train_dir, validation_dir = str(out), None, None, None
        image_column_name = label_column_name = max_train_samples = max_eval_samples = None
        train_val_split, on_bad_image = 0.15, "skip"

    data = load_image_classification_data(DataArgs())
    assert (len(data.splits["train"]), len(data.splits["validation"])) == (12, 5)  # 'test' is the eval split
    assert data.label_names[9] == "Ankle boot"


def test_prepare_names_the_problem_in_one_error_line(tmp_path, capsys):
    code, err = prepare(capsys, "--source", tmp_path / "missing", "--output_dir", tmp_path / "out")
    assert code == 2 and "apt-get install -y dataset-fashion-mnist" in err
    assert [line.startswith("error:") for line in err.splitlines()] == [True]

    fake_source(tmp_path)
    code, err = prepare(capsys, "--source", tmp_path, "--output_dir", tmp_path / "out")  # 12 images, not 60,000
    assert code == 2 and "Fashion-MNIST has 60000" in err

    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x03" + bytes(8)))
    code, err = prepare(capsys, "--source", tmp_path, "--output_dir", tmp_path / "out", "--no_size_check")
    assert code == 2 and "not an IDX label file" in err

    (tmp_path / "exists").mkdir()
    code, err = prepare(capsys, "--source", tmp_path, "--output_dir", tmp_path / "exists")
    assert code == 2 and "--overwrite" in err
