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
    "${threads[@]}" "$PYTHON" -m accelerate.commands.launch $([ "$processes" -gt 1 ] && echo --multi_gpu) \
        --num_processes "$processes" --num_machines 1 --mixed_precision no --dynamo_backend no "$@"
}
