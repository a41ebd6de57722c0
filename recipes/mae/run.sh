#!/usr/bin/env bash
# MAE on Fashion-MNIST, both steps: pretrain the encoder on the 60,000 training images (labels unused), then
# fine-tune it on the 5,000-image subset. 2 processes, ZeRO-2, on CPU or one GPU each. Needs data/fashion_mnist
# (recipes/fashion_mnist/README.md: `python recipes/fashion_mnist/prepare.py --output_dir data/fashion_mnist`).
# Flags after `run.sh` go to both recipes (e.g. `--seed 43`); output folders are the configs' own.
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/common.sh
if [ ! -d data/fashion_mnist ]; then
    echo "error: data/fashion_mnist is missing. Fix: python recipes/fashion_mnist/prepare.py --output_dir data/fashion_mnist" >&2
    exit 2
fi
launch 2 recipes/pretrain_mae.py recipes/mae/config_pretrain.yaml "$@"
launch 2 recipes/train_vit.py recipes/mae/config_finetune_5k.yaml "$@"
