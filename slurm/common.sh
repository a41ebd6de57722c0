# Sourced by slurm/*.sbatch from the repository root (sbatch runs a copy of a script from its spool folder, so the
# scripts find this file through their working directory: submit from the repository root).
# fail, require_count, require_whole, require_writable: one `error:` line naming the variable and the fix, exit 2.
source recipes/checks.sh

PYTHON=${PYTHON:-python}
# Node 0's name is the rendezvous address (node names resolve on clusters). sed reads to the end: no SIGPIPE under
# pipefail, as `head -n 1` would give the writer.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
