"""tests/unit/: one file per package module, fast, in this process. tests/launched/: the recipe, the study and
workers started as real processes (the multi-process ones marked `distributed`). Both import their builders and
runners from tests/helpers/ as `tests.helpers.*` (tests/ is a package, so pytest puts the repository root first on
sys.path, and this checkout's hf_vit_scaling is the one imported)."""

import os

# Tests never reach the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

pytest_plugins = ["tests.ci_no_skip", "tests.tiers", "tests.launch_count"]
