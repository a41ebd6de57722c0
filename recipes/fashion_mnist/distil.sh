#!/usr/bin/env bash
# DeiT distillation on Fashion-MNIST's 5,000-image subset, one command (after `make install`, the data step of
# README.md and the MAE pretraining of recipes/mae/README.md): a CNN teacher trained on the subset, then the ViT
# student, started from the MAE encoder, distilled from it; both by recipes/train_vit.py.
#
#   bash recipes/fashion_mnist/distil.sh                 # or: make fashion-distil
#   SEED=43 bash recipes/fashion_mnist/distil.sh         # a second seed: its own subset, so its own teacher
#   STUDENT_CONFIG=recipes/fashion_mnist/config_distil_5k.yaml bash recipes/fashion_mnist/distil.sh  # from scratch
#
# The subset is drawn by --seed (`--max_train_samples` shuffles with it), so each seed gets a teacher trained on that
# seed's 5,000 images: the recipe refuses a teacher trained on other rows of the same dataset.
# Environment: PYTHON (default .venv/bin/python, else python3), SEED (42), NUM_PROCESSES (1: one process with every
# core was the fastest here; the global batch stays 64 for any count that divides it), TEACHER_CONFIG, STUDENT_CONFIG
# (this folder's config_teacher_5k.yaml, config_mae_distil_5k.yaml), OUTPUT_ROOT (outputs), RESULTS (unset: a results
# file to write at the end, both models' metrics, times, configs and provenance: benchmarks/recipe_results.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/common.sh
HERE=recipes/fashion_mnist
SEED=${SEED:-42}
NUM_PROCESSES=${NUM_PROCESSES:-1}
TEACHER_CONFIG=${TEACHER_CONFIG:-$HERE/config_teacher_5k.yaml}
STUDENT_CONFIG=${STUDENT_CONFIG:-$HERE/config_mae_distil_5k.yaml}
OUTPUT_ROOT=${OUTPUT_ROOT:-outputs}
GLOBAL_BATCH=64
require_count NUM_PROCESSES "$NUM_PROCESSES"
require_whole SEED "$SEED"
require_config TEACHER_CONFIG "$TEACHER_CONFIG"
require_config STUDENT_CONFIG "$STUDENT_CONFIG"
require_writable OUTPUT_ROOT "$OUTPUT_ROOT"
[ -z "${RESULTS:-}" ] || require_writable "the folder of RESULTS" "$(dirname "$RESULTS")"
if [ $((GLOBAL_BATCH % NUM_PROCESSES)) -ne 0 ]; then
    fail "NUM_PROCESSES=$NUM_PROCESSES does not divide the global batch of $GLOBAL_BATCH. Fix: use 1, 2, 4, ..."
fi
DATA_DIR=$(sed -n 's/^dataset_name: *//p' "$STUDENT_CONFIG")
if [ -n "$DATA_DIR" ] && [ ! -d "$DATA_DIR" ]; then
    echo "error: $DATA_DIR (dataset_name in $STUDENT_CONFIG) does not exist. Fix: run the data step of" \
         "$HERE/README.md (apt-get install -y dataset-fashion-mnist; python $HERE/prepare.py --output_dir $DATA_DIR)." >&2
    exit 2
fi
START=$(sed -n 's/^model_name_or_path: *//p' "$STUDENT_CONFIG")
if [ -n "$START" ] && [ ! -d "$START" ]; then
    echo "error: $START (model_name_or_path in $STUDENT_CONFIG) does not exist. Fix: pretrain it first" \
         "(python recipes/pretrain_mae.py recipes/mae/config_pretrain.yaml, recipes/mae/README.md), or pass" \
         "STUDENT_CONFIG=$HERE/config_distil_5k.yaml (from scratch)." >&2
    exit 2
fi
TEACHER_DIR=$OUTPUT_ROOT/fm-5k-teacher-s$SEED
STUDENT_DIR=$OUTPUT_ROOT/fm-5k-distil-s$SEED
train() {  # CONFIG OUTPUT_DIR [flags...]
    local config=$1 output_dir=$2
    shift 2
    launch "$NUM_PROCESSES" recipes/train_vit.py "$config" --seed "$SEED" \
        --per_device_train_batch_size $((GLOBAL_BATCH / NUM_PROCESSES)) --output_dir "$output_dir" "$@"
}
start=$SECONDS
echo "== teacher ($TEACHER_DIR)"
train "$TEACHER_CONFIG" "$TEACHER_DIR"
taught=$SECONDS
echo "== student ($STUDENT_DIR, distilled from $TEACHER_DIR)"
train "$STUDENT_CONFIG" "$STUDENT_DIR" --teacher_model "$TEACHER_DIR"
done_at=$SECONDS
echo "Time: teacher $((taught - start)) s, student $((done_at - taught)) s, total $((done_at - start)) s"
if [ -n "${RESULTS:-}" ]; then
    "$PYTHON" benchmarks/recipe_results.py --run_command "${RUN_COMMAND:-SEED=$SEED bash $HERE/distil.sh}" \
        --metrics "teacher=$TEACHER_DIR/all_results.json" "student=$STUDENT_DIR/all_results.json" \
        --config "teacher=$TEACHER_CONFIG" "student=$STUDENT_CONFIG" --output "$RESULTS" \
        --seconds "teacher=$((taught - start))" "student=$((done_at - taught))" "total=$((done_at - start))" > /dev/null
fi
