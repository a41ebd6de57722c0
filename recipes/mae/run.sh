#!/usr/bin/env bash
# MAE on Fashion-MNIST, both steps: pretrain the encoder on the 60,000 training images (labels unused), then
# fine-tune it on the 5,000-image subset. 2 processes, ZeRO-2, on CPU or one GPU each. Needs data/fashion_mnist
# (recipes/fashion_mnist/README.md: `python recipes/fashion_mnist/prepare.py --output_dir data/fashion_mnist`).
# Flags after `run.sh` go to both recipes (e.g. `--seed 43`); output folders are the configs' own. RESULTS=<file>:
# both steps' metrics, times, configs and provenance written there at the end (benchmarks/recipe_results.py).
# PRETRAIN_CONFIG, FINETUNE_CONFIG: the two steps' config files (this folder's config_pretrain.yaml and
# config_finetune_5k.yaml); the data is the pretraining config's dataset_name.
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/common.sh
PRETRAIN=${PRETRAIN_CONFIG:-recipes/mae/config_pretrain.yaml}
FINETUNE=${FINETUNE_CONFIG:-recipes/mae/config_finetune_5k.yaml}
require_config PRETRAIN_CONFIG "$PRETRAIN"
require_config FINETUNE_CONFIG "$FINETUNE"
setting() { sed -n "s/^$1: *//p" "$2"; }  # a key of a config file
DATA_DIR=$(setting dataset_name "$PRETRAIN")
if [ ! -d "$DATA_DIR" ]; then
    echo "error: $DATA_DIR (dataset_name in $PRETRAIN) is missing. Fix: python recipes/fashion_mnist/prepare.py" \
         "--output_dir $DATA_DIR" >&2
    exit 2
fi
[ -z "${RESULTS:-}" ] || require_writable "the folder of RESULTS" "$(dirname "$RESULTS")"
start=$SECONDS
launch 2 recipes/pretrain_mae.py "$PRETRAIN" "$@"
pretrained=$SECONDS
launch 2 recipes/train_vit.py "$FINETUNE" "$@"
if [ -n "${RESULTS:-}" ]; then
    "$PYTHON" benchmarks/recipe_results.py --run_command "${RUN_COMMAND:-bash recipes/mae/run.sh $*}" \
        --metrics "pretraining=$(setting output_dir "$PRETRAIN")/all_results.json" \
        "fine-tuning=$(setting output_dir "$FINETUNE")/all_results.json" \
        --config "pretraining=$PRETRAIN" "fine-tuning=$FINETUNE" --output "$RESULTS" \
        --seconds "pretraining=$((pretrained - start))" "fine-tuning=$((SECONDS - pretrained))" \
        "total=$((SECONDS - start))" > /dev/null
fi
