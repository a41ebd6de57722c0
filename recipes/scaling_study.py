#!/usr/bin/env python
"""Run the study's experiments as one command: a grid of launched training runs, then tables and plots.

Each cell is its own launched job (`torchrun` by default) of recipes/train_vit.py; its throughput.json is collected
into `results.csv`, `report.md` and PNG plots in --output_dir. Rerunning skips finished cells; a failing cell
(crash, out of memory, timeout) is recorded with its reason and the study goes on. Arguments after `--` go to every
training run unchanged.

Tried on a 2-core CPU (one thread per process, each pinned to its own core):

    python recipes/scaling_study.py --study strong --processes 1,2 --global_batch_size 64 \
        --output_dir outputs/strong -- --model_preset vit-tiny-cpu --image_size 32 --max_steps 60

The study's 1 -> 32 GPU strong scaling on a SLURM cluster: see `slurm/scaling_study.sbatch`; every node runs this
script with the same grid and `--nnodes/--node_rank/--master_addr`.
"""

import os
import sys

from hf_vit_scaling.arguments.field_checks import require_writable_folder
from hf_vit_scaling.arguments.parser import DataclassParser
from hf_vit_scaling.errors import UserInputError, exit_code_for
from hf_vit_scaling.planning.study_runner import StudyArguments, build_grid, count_train_images, run_cell, write_report


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    try:
        (a,) = DataclassParser(StudyArguments, script="recipes/scaling_study.py").parse_flags(own)
        require_writable_folder("output_dir", a.output_dir)
    except UserInputError as err:
        return exit_code_for(err)
    grid = build_grid(a)
    os.makedirs(a.output_dir, exist_ok=True)
    n_train = count_train_images(extra) if a.study == "weak" else 0
    rows = [run_cell(a, cell, i, len(grid), extra, n_train) for i, cell in enumerate(grid)]
    if a.node_rank == 0:
        write_report(a, rows, extra)
        ok = sum(r["status"] == "ok" for r in rows)
        print(f"{ok}/{len(rows)} runs ok; report: {os.path.join(a.output_dir, 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
