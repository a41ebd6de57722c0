# Sourced by the recipe folders' shell scripts, from the repository root: the Python to use, the environment every
# recipe run needs, and `launch N SCRIPT [ARGS...]`, accelerate's launcher with N processes.
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
# The checkout's package, whether or not it is pip-installed; no Hub access is needed at any step.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export DS_ACCELERATOR=${DS_ACCELERATOR:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)}

launch() {  # N SCRIPT [ARGS...]; 2 or more processes: --multi_gpu, accelerate's torchrun-style launcher (gloo on a CPU)
    local processes=$1
    shift
    # accelerate sets OMP_NUM_THREADS=1 for a single process too: give it every core unless the caller chose.
    local threads=()
    [ "$processes" -eq 1 ] && threads=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}")
    # Port 0: accelerate picks a free port, so two recipes (or two test workers) on one machine never share 29500.
    "${threads[@]}" "$PYTHON" -m accelerate.commands.launch $([ "$processes" -gt 1 ] && echo --multi_gpu) \
        --num_processes "$processes" --num_machines 1 --main_process_port "${MAIN_PROCESS_PORT:-0}" \
        --mixed_precision no --dynamo_backend no "$@"
}

# fail, require_count, require_whole, require_writable: recipes/checks.sh (the Slurm scripts use them too).
source recipes/checks.sh

require_config() {  # NAME FILE: a YAML file of `flag: value` lines, as recipes/train_vit.py reads it
    [ -f "$2" ] || fail "$1=$2 is not a file. Fix: pass one of the config files of $(dirname "$0")."
    local problem
    problem=$("$PYTHON" - "$2" <<'PY'
import sys

import yaml

try:
    with open(sys.argv[1], encoding="utf-8") as f:
        settings = yaml.safe_load(f)
except yaml.YAMLError as err:
    sys.exit(print(" ".join(str(err).split())) or 1)
if not isinstance(settings, dict):
    sys.exit(print("it holds no flag: value lines") or 1)
PY
    ) || fail "$1=$2 cannot be read as YAML ($problem). Fix: correct the file (one flag: value per line)."
}
