"""hf_vit_scaling.utils: the helpers every folder shares."""

import json
import subprocess
import sys

from hf_vit_scaling.utils import peak_rss_bytes

CHILD = """
import json, resource
from hf_vit_scaling.utils import peak_rss_bytes
print(json.dumps({"own": peak_rss_bytes(), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""
HELD = 768 * 2**20


def test_peak_rss_is_the_process_own_not_the_parent_s():
    """A child started from a process that holds 768 MB reports its own ~20 MB peak; ru_maxrss, which Linux keeps
    across exec, reports the parent's 768 MB or more (the contrast: what a rank or probe reported before)."""
    held = bytearray(HELD)
    held[::4096] = b"\1" * len(range(0, HELD, 4096))  # touch every page: resident, not just reserved
    assert peak_rss_bytes() >= HELD
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    report = json.loads(child.stdout)
    assert report["ru_maxrss"] >= HELD, report  # the inherited high-water mark this helper avoids
    assert report["own"] < HELD // 4, report
    del held
