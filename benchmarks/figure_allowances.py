"""Figures typed in a page that no results file holds and no label covers, each with why it may stay: page -> figure
(exactly as on the page) -> reason. benchmarks/figures.py reads it; `python benchmarks/tables.py --check` reports an
entry whose figure has left its page. An entry passes every occurrence of its figure on its page.

Prefer a binding (`<!-- field: ... -->`) or a label in the figure's own sentence: an entry is for what is not a
measurement (a target, a setting, a budget, a description of the hardware, arithmetic on figures shown beside it).
"""

ON_VARIABLE_SIZE = "arithmetic on the generated variable_size_accuracy table just above"
HAND_COMPUTED = "a hand computation the named test in tests/unit/planning/test_memory.py asserts, not a measurement"

ALLOWED: dict[str, dict[str, str]] = {
    "hf_vit_scaling/parallel/fast_paths/README.md": {
        "2%": "the threshold under which a DeepSpeed fast path is removed (the leave-one-out rule): a target",
    },
    "benchmarks/README.md": {
        "2%": "the threshold under which a DeepSpeed fast path is removed (the leave-one-out rule): a target",
        "24 GiB": "the machines' installed memory: a description of the hardware, not a measurement",
        "50%": "a target for the GPU run (MFU), not a measurement",
        "4,700 images/s": "a target: 50% of 989 TFLOP/s over 105.4 GFLOP per image, not a measurement",
        "5%": "a target for the data wait, not a measurement",
        "10%": "a target for the host side's cost, not a measurement",
        "9 minutes": "the GPU check's time budget, which the script enforces: a setting, not a measurement",
        "2×": "the slowdown `--simulate_slow_ranks 1:2.0` sets: a setting, not a measurement",
        "0.64 points": f"{ON_VARIABLE_SIZE}: the difference of its two means",
        "0.66 points": f"{ON_VARIABLE_SIZE}: per_sample's spread between seeds",
        "0.77 points": f"{ON_VARIABLE_SIZE}: host_crop's spread between seeds",
        "0.59 points": f"{ON_VARIABLE_SIZE}: host_crop under per_sample, seed 42",
        "0.70 points": f"{ON_VARIABLE_SIZE}: host_crop under per_sample, seed 43",
        "0.38 points": "arithmetic: the binomial standard error √(0.82 × 0.18 / 10,000), not a measurement",
        "1.6×": "a target for the host side (input_path_auto's data wait, imagenet_shaped's (b)), not a measurement",
        "1.15×": "a target for input_path_auto's end to end on Br35H, not a measurement",
        "20×": "a target for imagenet_shaped's (c), not a measurement",
        "22-29 s": "arithmetic: the range of hetero_balance.json's runs.naive.*.sync_wait_s for the fast rank",
        "0.13-3.35 s": "arithmetic: the range of hetero_balance.json's runs.balanced.*.sync_wait_s",
    },
    "docs/planner.md": {
        "40GB": "a flag's value (--gpu_memory): a setting, not a measurement",
        "40 GiB": "what the flag value 40GB means: a setting, not a measurement",
        "40.0 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "10%": "the planner's default memory margin: a setting, not a measurement",
        "0.93 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "0.16 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "1.3 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "0.57 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "0.18 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "1.4 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "36.0 GiB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "2.359 GB": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "0.1072 s": "the planner's arithmetic, printed by the plan.py command shown above it (not a measurement)",
        "65–90%": "the planner's stated assumption for its link presets, not a measurement",
        "0.6 MiB": "arithmetic: 313,834 weight elements x 2 bytes",
        "8.0 MiB": "arithmetic: 16,448 elements per image x 256 images x 2 bytes",
        "2,000 MB": "arithmetic: DeepSpeed's default bucket of 5e8 elements x 4 bytes",
        "2 GB": "arithmetic: DeepSpeed's default bucket of 5e8 elements x 4 bytes",
        "6.6%": (
            "computed from benchmarks/results/planner_memory.json (the largest cpu_only over measured.peak, row "
            "fsdp2-ti16-gc-bf16): the file holds the two terms, not their ratio"
        ),
        "5%": "the tolerance test_planner_deepspeed.py asserts, not a measurement",
        "11%": "arithmetic: 2Ψ/N against DeepSpeed's 18Ψ/N",
        "92.1 MB": HAND_COMPUTED,
        "65.6 MB": HAND_COMPUTED,
        "158.0 MB": HAND_COMPUTED,
        "140.1 MB": HAND_COMPUTED,
        "72 GiB": "the planner's arithmetic in the worked example above: 80 GB less the 10% margin",
        "40%": "the planner's default share of the datasheet peak (--mfu): a setting, not a measurement",
        "4h": "a formula (I = 4h, h the hidden size), not a time",
        "1%": "the tolerance the activation unit test asserts, not a measurement",
        "1 GB": "arithmetic: DeepSpeed's default bucket of 5e8 elements x 2 bytes",
        "−2.1 to +1.4%": "arithmetic: the range of planner_memory.json's fp32 rows' peak_error",
        "−1.8 to +2.6%": "arithmetic: the range of planner_memory.json's bf16 (and held-out) rows' peak_error",
        "8.7 GiB": "the planner's estimate (arithmetic), printed by plan.py for the study's setup",
        "8.4 GiB": "the planner's estimate (arithmetic), printed by plan.py for the study's setup",
        "2x": "the name of the table's 2x-batch column, not a measurement",
        "25%": "the issue's limit for the planner's speed error: a target, not a measurement",
        "1.6x": "arithmetic on the datasheets' HBM bandwidths on this page (3,350 against 2,039 GB/s)",
        "3.2x": "arithmetic on the datasheets' dense peaks on this page (989.4 against 312 TFLOP/s)",
        "80GB": "part of a GPU's name (A100 80GB, H100 80GB), not a measurement",
        "3 GB": "a description of planner_memory.json's largest configurations, not a figure read from it",
    },
    "docs/gpu.md": {
        "15 minutes": "the device time lent to this project: a budget, not a measurement",
        "9 minutes": "the GPU check's time budget, which the script enforces: a setting, not a measurement",
        "515 s": "the GPU check's total budget in seconds: a setting, not a measurement",
        "50%": "the MFU target for the GPU run, not a measurement",
        "3.2 GB": "arithmetic: 16,173 images x 196,608 bytes",
        "196 KB": "arithmetic: 256 x 256 x 3 bytes",
        "5%": "the data-wait target the check reports against, not a measurement",
    },
    "docs/streaming.md": {
        "150 KB": "arithmetic: 224 x 224 x 3 bytes",
        "38 MB": "arithmetic: 256 rows of 150 KB",
        "1 GB": "arithmetic: about 2.5 row groups of 38 MB for each of 10 open shards",
        "10%": "the tolerance test_streaming_launched.py asserts, not a measurement",
        "4×": "the test's setting (16 against 64 shards), not a measurement",
    },
    "docs/mae.md": {
        "56%": "arithmetic: 9.78 over 17.56 GMACs, both from models/flops.py's formula on the same line",
    },
    "docs/reliability.md": {
        "30 s": "the defaults of Slurm's KillWait and torchrun's grace after SIGTERM: settings, not measurements",
        "3 s": "torch's elastic agent's wait before it saves on its own: a setting, not a measurement",
        "300 s": "slurm/train.sbatch's --signal=USR1@300: a setting, not a measurement",
    },
    "docs/throughput.md": {
        "0.3 s": "the CPU matmul probe's length, which hf_vit_scaling/models/flops.py sets: a setting",
    },
    "docs/sequence_parallelism.md": {
        "21x": "arithmetic: the token counts in the table (4,097 against 197), not a measurement",
    },
    "docs/heterogeneous_clusters.md": {
        "2×": "the slowdown --simulate_slow_ranks 1:2.0 sets: a setting, not a measurement",
    },
    "docs/recipe.md": {
        "0.87×": "arithmetic: the lowest speedup of the generated compile_speed table just below",
        "1.05×": "arithmetic: the highest speedup of the generated compile_speed table just below",
        "20%": "arithmetic: synthetic_floor.json's single-round ratios reach 1.22 (zero0, round 0)",
    },
    "docs/prepare.md": {
        "8%": "the smallest random resized crop (as torchvision/timm): a setting, not a measurement",
        "2×": "arithmetic: 196,608 bytes against a ~110 KB JPEG, on the same line",
        "110 KB": "a typical ImageNet JPEG at quality 90: a description of the data for the arithmetic beside it",
        "10,000 images/s": "a rate assumed for the arithmetic on its line (2 GB/s per core), not a measurement",
        "25 MB": "arithmetic: 128 rows x 196,608 bytes",
        "196 MB": "arithmetic: 1,000 rows x 196,608 bytes",
    },
    "docs/fast_input.md": {
        "0.64 points": "arithmetic: the difference of the bound means of variable_size_accuracy.json's two paths",
        "0.38 points": "arithmetic: the binomial standard error √(0.82 × 0.18 / 10,000), not a measurement",
    },
    "docs/studies/README.md": {
        "24 GiB": "the machine's installed memory: a description of the hardware, not a measurement",
        "30%": "a setting: the weak study's share of the training set per process (--max_train_samples)",
        "0.96×": "arithmetic on the table above: fsdp2's 24.1 against zero3's 25.2 images/s",
        "1.38 GB": "arithmetic: 86 M parameters x 16 bytes",
        "0.69 GB": "arithmetic: 86 M parameters x 16 bytes over 2 ranks",
        "5%": "a setting: the warmup fraction (--warmup_steps 0.05)",
        "8×": "a setting: 8 accumulation steps",
        "0.37 points": "arithmetic: one image of 270",
        "−2.2 points": "arithmetic on the table's own means (each row's mean against the reference's)",
        "−0.7 points": "arithmetic on the table's own means (each row's mean against the reference's)",
        "−2.4 points": "arithmetic on the table's own means (each row's mean against the reference's)",
        "0.983": "arithmetic: the mean of the two bound seeds on its row",
        "0.961": "arithmetic: the mean of the two bound seeds on its row",
        "0.976": "arithmetic: the mean of the two bound seeds on its row",
        "0.959": "arithmetic: the mean of the two bound seeds on its row",
    },
    "recipes/cifar_finetune/README.md": {
        "5-100%": "a setting: the crop's area range (0.05, 1), as vit_jax",
        "98%": "the reference implementation's (vit_jax) training split: a setting, not a measurement",
    },
    "recipes/cifar100_study/README.md": {
        "16 GB": "the study's GPUs (T4): a description of the hardware, not a measurement",
        "0.9995": "a setting: the EMA decay",
        "22%": "the study's figure, cited with its arXiv id two lines above (named again to compare)",
    },
    "recipes/imagenet_deit/README.md": {
        "100 GB": "the dataset's download size, a description of the data, not a measurement",
    },
    "recipes/mae/README.md": {
        "2.65 points": "arithmetic: 0.8774 (results_5k.json) minus 0.8509 (fashion_mnist/results_5k_s42.json), both "
        "named on the line",
        "0.867": "the recipe's target: a setting, not a measurement",
        "5%": "a setting: the warmup fraction",
        "20%": "a setting: the crop's smallest area (the paper's)",
        "95%": "a setting: the confidence level of the bootstrap intervals",
    },
    "recipes/fashion_mnist/README.md": {
        "5%": "a setting: the warmup fraction",
        "35%": "a setting: the crop's smallest area in config_deit_5k.yaml",
        "8%": "a setting: DeiT's smallest crop area on ImageNet",
        "0.999": "a setting: the EMA decay",
        "0.847": "arithmetic: the mean of the generated fashion_5k_s42 and fashion_5k_s43 tables' top-1 just above",
        "0.846": "arithmetic: the mean of the generated fashion_5k_s42 and fashion_5k_s43 tables' EMA top-1",
        "0.77 points": "arithmetic: the difference of the generated fashion_5k_s42 and fashion_5k_s43 tables' top-1",
        "0.4 points": "arithmetic: about half the two seeds' spread (0.77 points), a reading of the figures above",
        "0.844": "the recipe's target: a setting, not a measurement",
        "0.880": "the distillation target: a setting, not a measurement",
        "0.99996": "a setting: DeiT's EMA decay",
    },
    "recipes/medical_brain_mri/README.md": {
        "20%": "a setting: the size of a random hold-out",
        "95%": "a setting: the confidence level of the bootstrap intervals",
    },
}
