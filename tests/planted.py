"""A planted set with a known answer, for the duplicate finder: originals, their copies, and distinct images
that merely look alike.

    planted_images(root, originals=60, similar=60, seed=0) -> {relative path: group}

Writes ROOT/<class>/<name>.jpg. Each original (a demo shape on its gradient, 160 px, JPEG q90) has:
- an exact copy (the same bytes);
- a re-encode at a JPEG quality drawn from 60..95;
- a resize to 50..90% of its side;
- a crop of up to 5% of its width and height (then saved at q90).

`similar` more images are drawn from the same classes with the same generator: the same shape type, another
background, position and size. They are duplicates of nothing. The group of a copy is its original's path;
every other image is its own group. benchmarks/dedup_quality.py and tests/test_dedup.py use it.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from project.tasks.image.demo import CLASSES, draw_sample

SIDE = 160
VARIANTS = ("copy", "reencode", "resize", "crop")


def _jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def variant(data: bytes, kind: str, rng: np.random.Generator) -> bytes:
    """One planted copy of the JPEG `data`."""
    if kind == "copy":
        return data
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if kind == "reencode":
        return _jpeg(image, int(rng.integers(60, 96)))
    if kind == "resize":
        scale = rng.uniform(0.5, 0.9)
        return _jpeg(image.resize((round(image.width * scale), round(image.height * scale))), 90)
    width, height = image.size
    cut_x, cut_y = (round(side * rng.uniform(0, 0.05)) for side in (width, height))
    left, top = int(rng.integers(0, cut_x + 1)), int(rng.integers(0, cut_y + 1))
    return _jpeg(image.crop((left, top, width - (cut_x - left), height - (cut_y - top))), 90)


def planted_images(root: str | Path, originals: int = 60, similar: int = 60, seed: int = 0) -> dict[str, str]:
    """Write the planted set under `root`; returns {relative path: group} (see the module's docstring)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    truth: dict[str, str] = {}

    def write(name: str, data: bytes, group: str) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        truth[name] = group

    for i in range(originals):
        label = i % len(CLASSES)
        original = f"{CLASSES[label]}/o{i:05d}.jpg"
        data = _jpeg(Image.fromarray(draw_sample(label, SIDE, rng)), 90)
        write(original, data, original)
        for kind in VARIANTS:
            write(f"{CLASSES[label]}/o{i:05d}_{kind}.jpg", variant(data, kind, rng), original)
    for j in range(similar):
        label = j % len(CLASSES)
        name = f"{CLASSES[label]}/s{j:05d}.jpg"
        write(name, _jpeg(Image.fromarray(draw_sample(label, SIDE, rng)), 90), name)
    return truth


def pair_scores(predicted: list, truth: list) -> tuple[float, float]:
    """(precision, recall) over pairs of samples: a pair is found when both are in one predicted group, and
    right when both are in one true group."""

    def pairs(counts: np.ndarray) -> int:
        return int((counts * (counts - 1) // 2).sum())

    _, predicted_ids = np.unique(np.asarray(predicted), return_inverse=True)
    _, true_ids = np.unique(np.asarray(truth), return_inverse=True)
    both = predicted_ids.astype(np.int64) * (true_ids.max() + 1) + true_ids
    found, right = pairs(np.bincount(predicted_ids)), pairs(np.bincount(true_ids))
    correct = pairs(np.bincount(both))
    return (correct / found if found else 1.0), (correct / right if right else 1.0)
