#!/usr/bin/env python
"""Class-weighted loss on an imbalanced Br35H: 1 tumour scan for 4 healthy ones, with and without the weights.

1. A 1:4 copy of a prepared Br35H (whole duplicate groups of tumour scans dropped, every split; links, no copies):

    python recipes/medical_brain_mri/imbalance_demo.py subsample --data_dir outputs/br35h \
        --output_dir outputs/br35h-1to4

2. Train twice with the recipe, once per --class_weighting (none | balanced; hf_vit_scaling/losses/class_weighting.py):

    accelerate launch --multi_gpu --num_processes 2 recipes/train_vit.py \
        --class_weighting balanced --ds_config ds_configs/zero2.json --model_preset vit-tiny-cpu --image_size 128 \
        --patch_size 16 --train_dir outputs/br35h-1to4/train --validation_dir outputs/br35h-1to4/validation \
        --output_dir outputs/imbalance-balanced ...

3. evaluate_model.py --data_dir outputs/br35h-1to4 on each: sensitivity at the default decision (argmax) and at the
   validation-chosen threshold.

Step 2 is today's way; the table in this folder's README was recorded at commit f039ea4 with this script's former
`train` subcommand (the same flags and loss), as the README says, and was not rerun with train_vit.py.
"""

import json
import os
import sys
from collections import defaultdict

import numpy as np

from hf_vit_scaling.arguments.parser import ScriptParser
from hf_vit_scaling.errors import UserInputError


def subsample(args) -> int:
    from hf_vit_scaling.medical.splits import (
        class_balance,
        format_class_balance,
        read_split_file,
        split_folder_path,
        write_split_file,
    )
    from hf_vit_scaling.utils import write_json_atomically

    with open(os.path.join(args.data_dir, "hygiene.json"), encoding="utf-8") as f:
        hygiene = json.load(f)
    records = read_split_file(os.path.join(args.data_dir, "split.csv"))
    rng = np.random.default_rng(args.seed)
    kept = []
    for split in ("train", "validation", "test"):
        rows = [r for r in records if r.split == split]
        majority = sum(r.label != args.minority_label for r in rows)
        groups = defaultdict(list)
        for r in rows:
            if r.label == args.minority_label:
                groups[r.group].append(r)
        budget, taken = majority / args.ratio, []
        for g in rng.permutation(sorted(groups)).tolist():  # whole groups, until the minority reaches 1/ratio
            if len(taken) + len(groups[g]) <= budget:
                taken += groups[g]
        kept += [r for r in rows if r.label != args.minority_label] + taken
    os.makedirs(args.output_dir, exist_ok=True)
    for r in kept:
        source = split_folder_path(args.data_dir, r, hygiene.get("resize"))
        target = split_folder_path(args.output_dir, r, hygiene.get("resize"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.path.relpath(os.path.realpath(source), os.path.dirname(os.path.abspath(target))), target)
    write_split_file(os.path.join(args.output_dir, "split.csv"), kept)
    balance = class_balance([r.label for r in kept], [r.split for r in kept])
    hygiene.update(
        class_balance=balance,
        images=len(kept),
        source=f"{hygiene['source']}, subsampled to 1:{args.ratio:g} {args.minority_label}:rest",
    )
    write_json_atomically(os.path.join(args.output_dir, "hygiene.json"), hygiene)
    if not os.path.exists(os.path.join(args.output_dir, "images")):
        os.symlink(os.path.realpath(os.path.join(args.data_dir, "images")), os.path.join(args.output_dir, "images"))
    print(f"1:{args.ratio:g} copy in {args.output_dir}:\n{format_class_balance(balance)}")
    return 0


def main() -> int:
    parser = ScriptParser("recipes/medical_brain_mri/imbalance_demo.py", __doc__)
    parser.add_argument("command", choices=["subsample"])
    parser.add_argument("--data_dir", default="outputs/br35h", help="prepare.py's --output_dir.")
    parser.add_argument("--output_dir", default="outputs/br35h-1to4")
    parser.add_argument("--minority_label", default="yes")
    parser.add_argument("--ratio", type=float, default=4.0, help="Majority images per minority image.")
    parser.add_argument("--seed", type=int, default=0)
    try:
        args = parser.parse_args()
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return subsample(args)


if __name__ == "__main__":
    sys.exit(main())
