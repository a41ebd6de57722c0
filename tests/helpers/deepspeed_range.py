"""The DeepSpeed versions setup.cfg allows (`deepspeed>=LOWEST,<=HIGHEST`) and the one this process imports: the
fast paths are reviewed against the highest (every one on), and CI also runs their bit-for-bit tests and two recipe
runs on the lowest (`make test-deepspeed-lowest`)."""

import re
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def deepspeed_range() -> tuple[str, str]:
    """(lowest, highest) of setup.cfg's `deepspeed>=A,<=B`."""
    found = re.search(r"^\s*deepspeed>=([\d.]+),<=([\d.]+)\s*$", SETUP_CFG.read_text(encoding="utf-8"), re.M)
    assert found, "setup.cfg must name deepspeed>=LOWEST,<=HIGHEST (the tested ends)"
    return found.group(1), found.group(2)


def lowest_deepspeed() -> str:
    return deepspeed_range()[0]


def highest_deepspeed() -> str:
    return deepspeed_range()[1]


def installed_deepspeed() -> str:
    import deepspeed

    return deepspeed.__version__
