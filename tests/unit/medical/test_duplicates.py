"""Tests `medical.duplicates`: exact and near-duplicate images found by hash, grouped."""

import io

from PIL import Image

from hf_vit_scaling.medical.duplicates import (
    content_hash,
    find_duplicates,
    hash_images,
    near_duplicate_pairs,
    union_groups,
)
from tests.helpers.builders import scan


def encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def test_exact_resized_and_reencoded_copies_are_caught_and_a_different_image_is_not():
    original = scan(0)
    images = [
        encoded(original, "PNG"),
        encoded(original, "BMP"),  # exact: same pixels, other bytes
        encoded(original.resize((97, 97), Image.Resampling.BILINEAR), "PNG"),  # resized
        encoded(original, "JPEG", quality=60),  # re-encoded, lossy
        encoded(original.resize((300, 300)).convert("L"), "JPEG", quality=80),  # both, and grayscale
        encoded(scan(1), "PNG"),  # a different image
        encoded(scan(2), "JPEG", quality=90),  # another
    ]
    report = find_duplicates(images)
    assert report.groups[:5] == [0] * 5
    assert report.groups[5] != 0 and report.groups[6] not in (0, report.groups[5])
    assert report.exact_pairs == [(0, 1)]
    summary = report.summary(labels=["a"] * 7)
    assert summary["exact_duplicate_images"] == 1
    assert summary["images_with_a_duplicate"] == 5
    assert summary["groups_of_two_or_more"] == 1 and summary["redundant_images"] == 4
    assert summary["distinct_groups"] == 3 and summary["groups_with_mixed_labels"] == 0


def test_content_hash_is_of_pixels_not_bytes():
    image = scan(3)
    png, bmp = (Image.open(io.BytesIO(encoded(image, fmt))) for fmt in ("PNG", "BMP"))
    assert content_hash(png) == content_hash(bmp) == content_hash(image)
    changed = image.copy()
    changed.putpixel((0, 0), (1, 2, 3))
    assert content_hash(changed) != content_hash(image)


def test_threshold_zero_keeps_only_identical_hashes_and_distances_are_exact():
    _, hashes = hash_images([scan(0), scan(0), scan(4)])
    assert [(i, j) for i, j, _ in near_duplicate_pairs(hashes, threshold=0)] == [(0, 1)]
    flipped = hashes.copy()
    flipped[2] = hashes[0]
    flipped[2, 0] ^= 0b1011  # three bits differ
    assert near_duplicate_pairs(flipped, threshold=3) == [(0, 1, 0), (0, 2, 3), (1, 2, 3)]
    assert near_duplicate_pairs(flipped, threshold=2) == [(0, 1, 0)]


def test_union_groups_joins_pairs_and_patient_ids():
    assert union_groups(5, [(0, 3)]) == [0, 1, 2, 0, 3]
    assert union_groups(5, [(0, 3)], base_groups=["p1", "p2", "p1", None, None]) == [0, 1, 0, 0, 2]
