"""Data hygiene before a split: exact and near-duplicate images, joined into groups that `splits` keeps on one
side of a split.

An image on both sides of a split makes a held-out score measure memory instead of generalisation. Br35H (3,000 brain
MRIs) is the worked case: one byte-identical pair, but 2,776 images fall in 583 groups of near duplicates (the same
scan resized, re-encoded or with its contrast changed): 807 distinct groups in all. A random 20% hold-out puts a copy
of most test images in training.

- Exact duplicates: sha256 of the decoded pixels (RGB, as the model sees them through `data.to_rgb`, plus the size),
  not of the file bytes. Two files with the same pixels but other metadata, compression level or container are the
  same training example; a byte hash calls them different, and the pixels are decoded anyway for the second hash.
- Near duplicates: 128 perceptual bits per image, a pHash (64 bits: signs of the 8 x 8 lowest DCT-II coefficients of
  a 32 x 32 grayscale thumbnail against their median; Zauner 2010, as `imagehash.phash`) followed by a dHash (64 bits:
  signs of horizontal gradients of a 9 x 8 thumbnail; Krawetz 2013). Two images are near duplicates when the Hamming
  distance over the 128 bits is <= `threshold`. Resizing, JPEG re-encoding and monotonic contrast changes move few
  bits: both hashes compare pixels or coefficients with each other, not with fixed levels.
  Default 16 (of the 128 bits), measured on Br35H: 12 gives 885 groups, 14 gives 846, 16 gives 807 with the
  largest 26 images, one of them joining 4 tumour scans to 18 others through one pair of different scans at distance
  16; 18 merges 77 images into one group and 20 merges 245. Joining too much only costs split balance; missing a
  copy leaks it, so the default leans to joining.
- Groups: union-find over exact pairs, near pairs and an optional patient/study id, so every image of a duplicate
  group or a patient stays in one split (`split_with_groups`).

Hashing decodes every image once. Pairwise distances are computed block by block (O(N^2) popcounts, no N x N matrix
kept). Their times on Br35H: recipes/medical_brain_mri/README.md, "Data hygiene: duplicates before the split".
"""

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from hf_vit_scaling.data.decoding import decode_image, to_rgb
from hf_vit_scaling.errors import UserInputError

DEFAULT_NEAR_DUPLICATE_THRESHOLD = 16
HASH_BITS = 128


def _dct_matrix(n: int) -> np.ndarray:
    """Unnormalised DCT-II basis: row k is cos(pi (2m + 1) k / 2n) for m = 0..n-1 (scaling does not change signs)."""
    k, m = np.arange(n)[:, None], np.arange(n)[None, :]
    return np.cos(np.pi * (2 * m + 1) * k / (2 * n))


_DCT32 = _dct_matrix(32)


def _grayscale(image: Image.Image) -> Image.Image:
    """The image as the model's RGB (transparency dropped as `to_rgb` drops it), then ITU-R 601 luma."""
    return to_rgb(image).convert("L")


def content_hash(image: Image.Image) -> str:
    """sha256 hex digest of the decoded RGB pixels and the size: equal for equal pixels whatever the file format."""
    rgb = to_rgb(image)
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return digest.hexdigest()


def perceptual_hash(image: Image.Image) -> np.ndarray:
    """128 bits packed in 16 uint8: pHash (bits 0-63) then dHash (bits 64-127), see the module docstring."""
    gray = _grayscale(image)
    thumb = np.asarray(gray.resize((32, 32), Image.Resampling.LANCZOS), dtype=np.float64)
    low = (_DCT32 @ thumb @ _DCT32.T)[:8, :8]
    phash = (low > np.median(low)).ravel()
    small = np.asarray(gray.resize((9, 8), Image.Resampling.LANCZOS), dtype=np.int16)
    dhash = (small[:, 1:] > small[:, :-1]).ravel()
    return np.packbits(np.concatenate([phash, dhash]))


def hash_images(images: Iterable) -> tuple[list[str], np.ndarray]:
    """(content hashes, perceptual hashes as an (N, 16) uint8 array) for images given as
    `data.decoding.decode_image` accepts."""
    contents, perceptual = [], []
    for source in images:
        image = decode_image(source)
        contents.append(content_hash(image))
        perceptual.append(perceptual_hash(image))
    return contents, np.array(perceptual, dtype=np.uint8).reshape(-1, HASH_BITS // 8)


_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _hamming_block(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Hamming distances between every row and every column hash ((R, 16) x (C, 16) uint8 -> (R, C))."""
    x = np.bitwise_xor(rows[:, None, :], cols[None, :, :])
    if hasattr(np, "bitwise_count"):  # else an older numpy: a byte lookup table
        return np.bitwise_count(x).sum(axis=-1, dtype=np.int32)
    return _POPCOUNT8[x].sum(axis=-1, dtype=np.int32)


def near_duplicate_pairs(
    hashes: np.ndarray, threshold: int = DEFAULT_NEAR_DUPLICATE_THRESHOLD, block: int = 256
) -> list[tuple[int, int, int]]:
    """Every (i, j, distance) with i < j and Hamming distance <= threshold, in row-major order."""
    if not 0 <= threshold < HASH_BITS:
        raise UserInputError(f"near-duplicate threshold {threshold} must be in 0..{HASH_BITS - 1} bits.")
    pairs = []
    for start in range(0, len(hashes), block):
        stop = min(start + block, len(hashes))
        distances = _hamming_block(hashes[start:stop], hashes[start:])
        for r, c in zip(*np.nonzero(distances <= threshold)):
            i, j = start + int(r), start + int(c)
            if j > i:
                pairs.append((i, j, int(distances[r, c])))
    return pairs


def union_groups(n: int, pairs: Iterable[tuple[int, int]], base_groups: Sequence | None = None) -> list[int]:
    """Connected components (union-find) of n items joined by `pairs` and by equal `base_groups` ids (e.g. the
    patient id; None entries join nothing). Component ids are 0, 1, ... in order of each component's first item."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for i, j in pairs:
        union(i, j)
    if base_groups is not None:
        first_of: dict = {}
        for i, gid in enumerate(base_groups):
            if gid is not None:
                union(first_of.setdefault(gid, i), i)
    renumber: dict[int, int] = {}
    return [renumber.setdefault(find(i), len(renumber)) for i in range(n)]


@dataclass
class DuplicateReport:
    """What `find_duplicates` found: the group of every image and the counts a card or a log reports."""

    groups: list[int]
    threshold: int
    exact_pairs: list[tuple[int, int]] = field(default_factory=list)
    near_pairs: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def duplicate_groups(self) -> list[list[int]]:
        """Groups of two or more images (by duplicates or by the id given), each as a list of indices."""
        members = defaultdict(list)
        for i, g in enumerate(self.groups):
            members[g].append(i)
        return [m for m in members.values() if len(m) > 1]

    @property
    def exact_duplicate_images(self) -> int:
        """Images whose pixels equal an earlier image's (removing them would leave one of each)."""
        return len({j for _, j in self.exact_pairs})

    def summary(self, labels: Sequence | None = None) -> dict:
        """Counts for logs and the model card; with labels, also the groups that hold more than one label."""
        paired = (
            {i for pair in self.exact_pairs for i in pair}
            | {i for i, j, _ in self.near_pairs}
            | {j for _, j, _ in self.near_pairs}
        )
        groups = self.duplicate_groups
        info = {
            "images": len(self.groups),
            "exact_duplicate_images": self.exact_duplicate_images,
            "images_with_a_duplicate": len(paired),
            "groups_of_two_or_more": len(groups),
            "redundant_images": sum(len(g) - 1 for g in groups),
            "distinct_groups": len(set(self.groups)),
            "near_duplicate_threshold_bits": self.threshold,
        }
        if labels is not None:
            info["groups_with_mixed_labels"] = sum(len({labels[i] for i in g}) > 1 for g in groups)
        return info


def find_duplicates(
    images: Iterable, threshold: int = DEFAULT_NEAR_DUPLICATE_THRESHOLD, base_groups: Sequence | None = None
) -> DuplicateReport:
    """Hash `images` and group exact and near duplicates (and equal `base_groups` ids) with union-find."""
    contents, perceptual = hash_images(images)
    first_seen: dict[str, int] = {}
    exact = []
    for i, digest in enumerate(contents):
        j = first_seen.setdefault(digest, i)
        if j != i:
            exact.append((j, i))
    near = near_duplicate_pairs(perceptual, threshold)
    groups = union_groups(len(contents), [*exact, *((i, j) for i, j, _ in near)], base_groups)
    return DuplicateReport(groups=groups, threshold=threshold, exact_pairs=exact, near_pairs=near)


# ---------------------------------------------------------------- grouped stratified split


# ---------------------------------------------------------------- the split file (CSV, shareable)
