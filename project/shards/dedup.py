"""Exact and near duplicates: the hashes of each sample, and the groups of samples that match.

- exact: the same bytes of the image member or of the text (SHA-256, 128 bits kept; with the CPU's SHA
  instructions it runs at twice BLAKE2b's speed here).
- near, images: a 64-bit perceptual hash (pHash: the DCT of a 32x32 grey image, its 8x8 lowest frequencies
  against their median), the same bits as imagehash.phash. Our own few lines, not imagehash's: imagehash
  resizes the full image and calls scipy per image (1.4 ms a 160 px JPEG, against 0.25 ms here, where a JPEG
  is decoded at a reduced DCT scale). Two images are candidates within `near_distance` differing bits, and
  match if their colour thumbnails (8 x 8 RGB, box-filtered) also differ by at most THUMB_DIFFERENCE on
  average. pHash alone sees mostly the layout of light and dark: on the planted set (tests/planted.py) it put
  distinct demo images 4 to 8 bits apart, closer than cropped copies (up to 20), while the thumbnails of
  copies differ by at most 9.4 and those of distinct images by at least 24.
- near, text: MinHash (datasketch, 128 permutations) of the character 5-grams of the case-folded text with
  its whitespace collapsed: a change of case or spacing leaves it the same. Two texts match at an estimated
  Jaccard similarity of at least `near_jaccard`. project/shards/matching.py finds the pairs.

Memory: the index holds, per sample, 16 bytes of digest and 8 of size, plus 8 of pHash, 1 of its validity
and 192 of thumbnail (images, near) or 512 of MinHash (text, near): `bytes_per_sample` states it, and the
tests hold the index to it.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

MODES = ("exact", "near", "off")
HASH_SIDE = 32  # pHash: the grey image's side
LOW = 8  # pHash: the low frequencies kept, LOW x LOW = 64 bits
THUMB = 8  # colour thumbnail: THUMB x THUMB RGB
THUMB_DIFFERENCE = 12  # the most mean absolute difference (of 255) between the thumbnails of near copies
NUM_PERM = 128  # MinHash permutations
SHINGLE = 5  # characters per text shingle
MAX_SHINGLED_CHARS = 1 << 17  # a text's first 131,072 characters decide its near copies: bounded work a text
DEFAULT_NEAR_DISTANCE = 12
DEFAULT_NEAR_JACCARD = 0.8


@dataclass
class Hashes:
    """Per-sample hashes, in the order of the samples hashed. `size` ranks the copies of a group: the copy
    kept is the largest (pixels for images hashed `near`, else bytes). `phash_ok` is False where an image
    could not be decoded (it then matches only exact copies)."""

    digest: np.ndarray  # (n, 2) uint64
    size: np.ndarray  # (n,) int64
    phash: np.ndarray | None = None  # (n,) uint64
    phash_ok: np.ndarray | None = None  # (n,) bool
    thumb: np.ndarray | None = None  # (n, THUMB, THUMB, 3) uint8
    minhash: np.ndarray | None = None  # (n, NUM_PERM) uint32

    def __len__(self) -> int:
        return len(self.digest)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}

    @staticmethod
    def concat(parts: list[Hashes], release: bool = False) -> Hashes:
        """The parts' hashes, one after another. With `release`, each part's array is dropped once it is joined, so
        that only one field at a time is in memory twice (the parts are emptied)."""

        def joined(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in parts]
            if not arrays or arrays[0] is None:
                return None
            if not release:
                return np.concatenate(arrays)
            for p in parts:
                setattr(p, name, None)
            whole = np.empty((sum(len(a) for a in arrays), *arrays[0].shape[1:]), dtype=arrays[0].dtype)
            start = 0
            for index, array in enumerate(arrays):
                whole[start : start + len(array)] = array
                start += len(array)
                arrays[index] = None  # freed as soon as it is copied
            return whole

        return Hashes(**{name: joined(name) for name in FIELDS})


FIELDS = ("digest", "size", "phash", "phash_ok", "thumb", "minhash")


def bytes_per_sample(mode: str, text: bool) -> int:
    """The index's bytes per sample: what `Hashes.nbytes` / samples comes to."""
    if mode == "off":
        return 0
    near = (NUM_PERM * 4 if text else 8 + 1 + THUMB * THUMB * 3) if mode == "near" else 0
    return 16 + 8 + near


class Hasher:
    """Hashes samples one at a time into growing lists; `result()` gives the arrays."""

    def __init__(self, mode: str, text: bool):
        self.mode, self.text = mode, text
        self.digests: list[bytes] = []
        self.sizes: list[int] = []
        self.phashes: list[int] = []
        self.oks: list[bool] = []
        self.thumbs: list[np.ndarray] = []
        self.minhashes: list[np.ndarray] = []

    def add(self, data: bytes) -> None:
        self.digests.append(hashlib.sha256(data).digest()[:16])
        size = len(data)
        if self.mode == "near" and self.text:
            self.minhashes.append(text_minhash(data))
        elif self.mode == "near":
            value, thumb, pixels = image_features(data)
            self.phashes.append(value or 0)
            self.oks.append(value is not None)
            self.thumbs.append(thumb)
            size = pixels
        self.sizes.append(size)

    def result(self) -> Hashes:
        digest = np.frombuffer(b"".join(self.digests), dtype=np.uint64).reshape(-1, 2).copy()
        hashes = Hashes(digest, np.asarray(self.sizes, dtype=np.int64))
        if self.mode == "near" and self.text:
            hashes.minhash = np.stack(self.minhashes) if self.minhashes else np.zeros((0, NUM_PERM), np.uint32)
        elif self.mode == "near":
            hashes.phash = np.asarray(self.phashes, dtype=np.uint64)
            hashes.phash_ok = np.asarray(self.oks, dtype=bool)
            hashes.thumb = np.stack(self.thumbs) if self.thumbs else np.zeros((0, THUMB, THUMB, 3), np.uint8)
        return hashes


@functools.cache
def _dct_rows() -> np.ndarray:
    """The first LOW rows of the (unnormalized) DCT-II matrix of size HASH_SIDE, as scipy's dct computes."""
    k = np.arange(LOW)[:, None]
    n = np.arange(HASH_SIDE)[None, :]
    return 2 * np.cos(np.pi * k * (2 * n + 1) / (2 * HASH_SIDE))


def phash_bits(grey: np.ndarray) -> np.ndarray:
    """The 64 pHash bits of a HASH_SIDE x HASH_SIDE grey image, row-major as imagehash orders them."""
    rows = _dct_rows()
    low = (rows @ grey.astype(np.float64) @ rows.T).ravel()
    middle = LOW * LOW // 2
    return low > np.partition(low, [middle - 1, middle])[middle - 1 : middle + 1].mean()  # np.median, faster


def image_features(data: bytes) -> tuple[int | None, np.ndarray, int]:
    """(64-bit pHash, colour thumbnail, pixels) of an encoded image; (None, zeros, 0) where it cannot be
    decoded. A JPEG is decoded at the smallest DCT scale that keeps HASH_SIDE pixels a side (draft mode): a
    fraction of a full decode, which moves the hash by a bit or two at most."""
    from PIL import Image

    from project.tasks.image.decode import open_image

    try:
        with open_image(data) as image:  # the pixel bound, from the header: a bomb has no hash
            pixels = image.width * image.height
            if image.format == "JPEG":
                image.draft(None, (HASH_SIDE, HASH_SIDE))
            grey = image.convert("L").resize((HASH_SIDE, HASH_SIDE), Image.Resampling.LANCZOS)
            thumb = image.convert("RGB").resize((THUMB, THUMB), Image.Resampling.BOX)
    except Exception:  # noqa: BLE001 - an unreadable image has no perceptual hash; training skips it
        return None, np.zeros((THUMB, THUMB, 3), np.uint8), 0
    bits = phash_bits(np.asarray(grey))
    return int.from_bytes(np.packbits(bits).tobytes(), "big"), np.asarray(thumb, dtype=np.uint8), pixels


@functools.cache
def _empty_minhash():  # noqa: ANN202 - a datasketch.MinHash; its permutations are drawn once per process
    from datasketch import MinHash

    return MinHash(num_perm=NUM_PERM, seed=1)


def shingles(text: str) -> set[bytes]:
    """Character 5-grams of the case-folded text with its whitespace collapsed (the whole text if shorter)."""
    flat = " ".join(text[:MAX_SHINGLED_CHARS].casefold().split())
    if len(flat) <= SHINGLE:
        return {flat.encode()}
    return {flat[i : i + SHINGLE].encode() for i in range(len(flat) - SHINGLE + 1)}


def text_minhash(data: bytes) -> np.ndarray:
    """The MinHash signature (NUM_PERM uint32) of a UTF-8 text's shingles."""
    minhash = _empty_minhash().copy()
    minhash.update_batch(sorted(shingles(data.decode("utf-8", errors="replace"))))
    return minhash.hashvalues.astype(np.uint32)


def require_near_text() -> None:
    """One line saying what to install where near-duplicate text needs datasketch and it is missing."""
    from project.errors import UserError

    try:
        import datasketch  # noqa: F401
    except ImportError:
        raise UserError('--dedup near on text needs datasketch: pip install -e ".[dedup]"') from None
