#!/usr/bin/env python
"""Prepare an image-classification dataset once as fixed-size uint8 shards, then train from them with no decoding.

    python recipes/prepare_shards.py --train_dir photos/train --validation_dir photos/val \
        --output_dir data/photos-256 --size 256 --num_proc 8
    python recipes/train_vit.py --dataset_name data/photos-256 --model_preset vit-b-16 ...

Sources are the recipe's: an image folder (--train_dir, one sub-folder per class), a Hub id or a save_to_disk folder
(--dataset_name). Each image's shorter side is resized to --size and the centre square kept; stored as raw uint8
(Parquet shards + manifest.json; format and trade-offs in docs/prepare.md). Resumable: rerun the same command after
a crash or a kill and it keeps every finished shard (checked by sha256) and redoes the rest. Images that cannot be
decoded are skipped and named in manifest.json. Prints a JSON summary as its last line.
"""

import argparse
import json
import sys

from hf_vit_scaling.arguments.field_checks import require_writable_folder
from hf_vit_scaling.arguments.parser import ScriptParser
from hf_vit_scaling.data.prepare import SourceSpec, prepare_shards
from hf_vit_scaling.errors import UserInputError, exit_code_for
from hf_vit_scaling.log import setup_logging
from hf_vit_scaling.training.faults import prepare_fault


def parse(argv=None) -> argparse.Namespace:
    parser = ScriptParser("recipes/prepare_shards.py", __doc__)
    source = parser.add_argument_group("source (as recipes/train_vit.py takes it)")
    source.add_argument("--dataset_name", help="Hub id or save_to_disk folder.")
    source.add_argument("--dataset_config_name", help="Configuration name of --dataset_name.")
    source.add_argument("--train_dir", help="Image folder for training: one sub-folder per class.")
    source.add_argument("--validation_dir", help="Image folder for evaluation (prepared as split 'validation').")
    source.add_argument("--image_column_name", help="Column holding the images (default: detected).")
    source.add_argument("--label_column_name", help="Column holding integer/class labels (default: detected).")
    source.add_argument("--cache_dir", help="Where Hub downloads are cached.")
    out = parser.add_argument_group("output")
    out.add_argument("--output_dir", required=True, help="Folder for the shards and manifest.json.")
    out.add_argument(
        "--size", type=int, default=256, help="S: shorter side resized to S, centre S x S kept (256 for 224 px)."
    )
    out.add_argument(
        "--channels",
        default="auto",
        choices=["auto", "3", "1"],
        help="3 (RGB) or 1 (grayscale); auto: 1 when the first 100 training images are all grayscale.",
    )
    out.add_argument("--shard_rows", type=int, default=1000, help="Source rows per shard (196 MB at 256 px RGB).")
    out.add_argument(
        "--compression",
        default="none",
        choices=["none", "snappy", "zstd"],
        help="Parquet compression of the shards (none: fastest to read; zstd saved 1%% on the benchmark's grainy "
        "photo-like images, more on smooth ones).",
    )
    out.add_argument(
        "--shuffle_seed",
        type=int,
        default=0,
        help="Rows are stored in a fixed random order from this seed (classes mixed in every shard).",
    )
    out.add_argument("--keep_order", action="store_true", help="Store rows in the source's order instead.")
    parser.add_argument("--num_proc", type=int, default=1, help="Worker processes (one shard per task).")
    args = parser.parse_args(argv)
    if args.dataset_name and args.train_dir:
        raise UserInputError("--dataset_name and --train_dir are exclusive. Fix: pass one data source.")
    if args.validation_dir and not args.train_dir:
        raise UserInputError("--validation_dir needs --train_dir. Fix: add --train_dir or drop --validation_dir.")
    for flag in ("size", "shard_rows", "num_proc"):
        if getattr(args, flag) < 1:
            raise UserInputError(f"--{flag} must be >= 1, got {getattr(args, flag)}. Fix: pass 1 or more.")
    require_writable_folder("output_dir", args.output_dir)
    return args


def main(argv=None) -> int:
    setup_logging()
    try:
        args = parse(argv)
        spec = SourceSpec(
            args.dataset_name,
            args.dataset_config_name,
            args.train_dir,
            args.validation_dir,
            args.image_column_name,
            args.label_column_name,
            args.cache_dir,
        )
        seed = None if args.keep_order else args.shuffle_seed
        summary = prepare_shards(
            spec,
            args.output_dir,
            args.size,
            args.channels,
            args.shard_rows,
            args.num_proc,
            args.compression,
            seed,
            after_shard=prepare_fault,
        )
    except UserInputError as err:
        return exit_code_for(err)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
