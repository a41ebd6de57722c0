"""recipes/medical_brain_mri/prepare.py on a small local dataset with a patient column (no wheel, no network)."""

import csv
import importlib.util
import json
from collections import defaultdict
from pathlib import Path

from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets import Image as ImageFeature

from tests.helpers.builders import scan

PREPARE = Path(__file__).resolve().parents[2] / "recipes" / "medical_brain_mri" / "prepare.py"


def load_prepare():
    spec = importlib.util.spec_from_file_location("medical_prepare", PREPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved_dataset(path) -> str:
    """40 patients with 2 different scans each (label by patient), plus one resized copy of patient 0's first scan
    filed under another patient id: duplicates and patients must both stay together."""
    images, labels, patients = [], [], []
    for p in range(40):
        for k in range(2):
            images.append(scan(100 + 2 * p + k, 48))
            labels.append(p % 2)
            patients.append(f"p{p}")
    images.append(images[0].resize((40, 40)))
    labels.append(0)
    patients.append("p-copy")
    features = Features(
        {"image": ImageFeature(), "label": ClassLabel(names=["healthy", "sick"]), "patient": Value("string")}
    )
    data = Dataset.from_dict({"image": images, "label": labels, "patient": patients}, features=features)
    DatasetDict(train=data.select(range(60)), test=data.select(range(60, 81))).save_to_disk(str(path))
    return str(path)


def test_prepare_groups_patients_and_duplicates_and_resumes(tmp_path, capsys):
    prepare = load_prepare()
    source, out = saved_dataset(tmp_path / "saved"), tmp_path / "prepared"
    argv = ["--dataset_name", source, "--group_column_name", "patient", "--output_dir", str(out), "--resize", "16"]
    assert prepare.main(argv) == 0
    rows = list(csv.DictReader(open(out / "split.csv", encoding="utf-8")))
    assert len(rows) == 81
    split_of_group = defaultdict(set)
    for row in rows:
        split_of_group[row["group"]].add(row["split"])
    assert all(len(splits) == 1 for splits in split_of_group.values())
    assert len(split_of_group) == 40  # the copy joined patient 0's group
    assert "Class balance per split" in capsys.readouterr().out
    hygiene = json.loads((out / "hygiene.json").read_text())
    assert hygiene["images_with_a_duplicate"] == 2 and hygiene["exact_duplicate_images"] == 0
    written = sorted(p.relative_to(out).parts[:2] for p in out.glob("*/*/*.png") if p.parts[-3] != "images")
    assert {parts[0] for parts in written} == {"train", "validation", "test"} and len(written) == 81
    # A rerun reuses split.csv; another --resize on the same folders is refused with one error line.
    assert prepare.main(argv) == 0
    assert f"Split: reusing {out / 'split.csv'}" in capsys.readouterr().out
    assert prepare.main([*argv[:-1], "24"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--resize 16" in err[0]
