"""Images made in the tests (no files shipped, no downloads)."""

import numpy as np
from PIL import Image


def scan(seed: int, size: int = 160) -> Image.Image:
    """A smooth, MRI-like test image: a bright ring (skull) around random low-frequency blobs."""
    rng = np.random.default_rng(seed)
    blobs = Image.fromarray(rng.integers(0, 255, (6, 6), dtype=np.uint8)).resize(
        (size, size), Image.Resampling.BICUBIC
    )
    y, x = np.mgrid[:size, :size] / size - 0.5
    radius = np.hypot(x, y)
    pixels = np.asarray(blobs, dtype=np.float64) * (radius < 0.4) + 230 * ((radius >= 0.4) & (radius < 0.45))
    return Image.fromarray(pixels.astype(np.uint8)).convert("RGB")
