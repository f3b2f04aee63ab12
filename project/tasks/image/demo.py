"""A procedurally drawn 10-class image task, written as WebDataset shards with shard indexes.

    python -m project.tasks.image.demo --out data/demo [--train N] [--val N] [--test N] [--image_size S]
        [--samples_per_shard N] [--seed S] [--workers N]

Each sample is one of ten shapes, of random colour, size, position and rotation, on a noisy colour
gradient, JPEG-encoded. Similar shapes (circle, hexagon, ring; star, cross) and small, low-contrast
instances keep it from being trivially separable. Each sample is drawn from its own seed, so the output
is identical for a seed whatever the number of workers, and samples are written as they are drawn:
a million samples never sit in memory.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.commands import run_command
from project.data.outputs import local_output
from project.data.parallel import imap_unordered
from project.data.shard_index import INDEX_NAME, SHUFFLED_KEY, Shard, write_index
from project.errors import UserError, run_main

CLASSES = ["circle", "ring", "triangle", "square", "hexagon", "star", "cross", "crescent", "bar", "arrow"]
SPLITS = ("train", "val", "test")
OVERSAMPLE = 3  # shapes are drawn 3x larger, then downsampled: smooth (antialiased) edges


def _regular(n: int, inner: float | None = None) -> list[tuple[float, float]]:
    """A regular n-gon (or a star, alternating with radius `inner`) in unit coordinates."""
    steps = n * 2 if inner else n
    radii = [1.0 if i % 2 == 0 or not inner else inner for i in range(steps)]
    return [(r * math.cos(2 * math.pi * i / steps), r * math.sin(2 * math.pi * i / steps)) for i, r in enumerate(radii)]


POLYGONS = {
    "triangle": _regular(3),
    "square": _regular(4),
    "hexagon": _regular(6),
    "star": _regular(5, inner=0.45),
    "cross": [
        (0.3, 1),
        (0.3, 0.3),
        (1, 0.3),
        (1, -0.3),
        (0.3, -0.3),
        (0.3, -1),
        (-0.3, -1),
        (-0.3, -0.3),
        (-1, -0.3),
        (-1, 0.3),
        (-0.3, 0.3),
        (-0.3, 1),
    ],
    "bar": [(-1, -0.28), (1, -0.28), (1, 0.28), (-1, 0.28)],
    "arrow": [(-1, -0.18), (0.2, -0.18), (0.2, -0.55), (1, 0), (0.2, 0.55), (0.2, 0.18), (-1, 0.18)],
}


def _shape_mask(name: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """A float mask in [0, 1] of one randomly placed, scaled and rotated shape."""
    big = size * OVERSAMPLE
    radius = rng.uniform(0.2, 0.42) * big
    cx, cy = (rng.uniform(radius * 0.8, big - radius * 0.8) for _ in range(2))
    angle = rng.uniform(0, 2 * math.pi)
    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)

    def circle(x: float, y: float, r: float, fill: int) -> None:
        draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)

    if name == "circle":
        circle(cx, cy, radius, 255)
    elif name == "ring":
        circle(cx, cy, radius, 255)
        circle(cx, cy, radius * rng.uniform(0.45, 0.65), 0)
    elif name == "crescent":
        circle(cx, cy, radius, 255)
        offset = radius * rng.uniform(0.45, 0.65)
        circle(cx + offset * math.cos(angle), cy + offset * math.sin(angle), radius * 0.85, 0)
    else:
        cos, sin = math.cos(angle), math.sin(angle)
        points = [(cx + radius * (x * cos - y * sin), cy + radius * (x * sin + y * cos)) for x, y in POLYGONS[name]]
        draw.polygon(points, fill=255)
    return np.asarray(mask.resize((size, size), Image.Resampling.BOX), dtype=np.float32)[:, :, None] / 255


def draw_sample(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """One HxWx3 uint8 image of class `label`."""
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    direction = rng.uniform(0, 2 * math.pi)
    t = (np.cos(direction) * ramp[None, :] + np.sin(direction) * ramp[:, None])[:, :, None]
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    start, end = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    background = start * (1 - t) + end * t
    colour = rng.uniform(0, 255, 3)
    while np.abs(colour - background.mean((0, 1))).max() < 60:  # keep the shape visible
        colour = rng.uniform(0, 255, 3)
    mask = _shape_mask(CLASSES[label], size, rng)
    image = background * (1 - mask) + colour * mask
    image += rng.normal(0, rng.uniform(4, 18), image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@dataclass(frozen=True)
class ShardJob:
    split: str
    number: int
    first: int  # index of the shard's first sample in the split
    count: int
    path: str
    image_size: int
    seed: int


def _samples(job: ShardJob) -> Iterator[dict]:
    split_code = SPLITS.index(job.split)
    for index in range(job.first, job.first + job.count):
        rng = np.random.default_rng([job.seed, split_code, index])
        label = index % len(CLASSES)  # exactly balanced classes in every split
        image = draw_sample(label, job.image_size, rng)
        yield {"__key__": f"{job.split}-{index:08d}", "jpg": encode_jpeg(image), "cls": str(label).encode()}


def write_shard(job: ShardJob) -> Shard:
    """Write one shard (to a temporary name, renamed when complete) and return its index entry."""
    from webdataset import TarWriter  # imported here: webdataset pulls in torch, workers pay it once

    temporary = f"{job.path}.{os.getpid()}.tmp"  # concurrent writers (one per node) never collide
    with (
        open(temporary, "wb") as stream,
        TarWriter(stream, encoder=False, mtime=0) as writer,
    ):  # mtime: same bytes per seed
        for sample in _samples(job):
            writer.write(sample)
    os.replace(temporary, job.path)
    return Shard(job.path, job.count, os.path.getsize(job.path))


def make_demo(
    out: str | Path,
    *,
    train: int = 20000,
    val: int = 2000,
    test: int = 2000,
    image_size: int = 32,
    samples_per_shard: int = 1000,
    seed: int = 0,
    workers: int | None = None,
    quiet: bool = False,
) -> Path:
    """Write the demo task into OUT/{train,val,test}, each with shards and a shard index.

    Args:
        out: the folder to write train/, val/ and test/ into.
        train: training samples.
        val: validation samples.
        test: test samples.
        image_size: the images' side in pixels.
        samples_per_shard: samples per shard.
        seed: the same seed writes the same bytes.
        workers: processes (default: up to 4).
        quiet: no progress bar.
    """
    sizes = {"train": train, "val": val, "test": test}
    if min(sizes.values()) < 1 or image_size < 8 or samples_per_shard < 1:
        raise UserError("demo needs at least 1 sample per split, --image_size >= 8 and --samples_per_shard >= 1")
    out = Path(out)
    jobs: dict[str, list[ShardJob]] = {}
    for split, total in sizes.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        jobs[split] = [
            ShardJob(
                split,
                n,
                first,
                min(samples_per_shard, total - first),
                str(out / split / f"{split}-{n:06d}.tar"),
                image_size,
                seed,
            )
            for n, first in enumerate(range(0, total, samples_per_shard))
        ]
    workers = workers or min(4, os.cpu_count() or 1)
    every_job = [job for split in SPLITS for job in jobs[split]]
    written: dict[str, Shard] = {}
    columns = (
        TextColumn("demo data"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=quiet) as progress:
        task = progress.add_task("demo", total=sum(sizes.values()))
        # spawn: called from the trainer's process, whose torch threads a fork would copy half-initialized
        for shard in imap_unordered(write_shard, every_job, workers, start_method="spawn"):
            written[shard.url] = shard
            progress.advance(task, shard.nsamples)
    demo_settings = {"demo": {"seed": seed, "image_size": image_size}, SHUFFLED_KEY: True}  # classes in turn
    for split in SPLITS:
        shards = [written[job.path] for job in jobs[split]]
        write_index(out / split / INDEX_NAME, shards, name=split, extra={"classes": CLASSES, **demo_settings})
    return out


def demo_is_complete(root: str | Path) -> bool:
    """True when every split has a shard index (written last, so an interrupted run is incomplete)."""
    return all((Path(root) / split / INDEX_NAME).exists() for split in SPLITS)


def command(*, out: str, **kwargs: Any) -> None:
    """Write the image demo: shapes to classify, in train/val/test shards with their indexes.

    Args:
        out: the folder to write train/, val/ and test/ into.
    """
    local_output("--out", out, "the demo writes a local folder")
    folder = make_demo(out, **kwargs)
    print(f"wrote the demo task ({len(CLASSES)} classes) to {folder}/{{train,val,test}}")


def main(argv: list[str] | None = None) -> None:
    run_command(command, "project.tasks.image.demo", argv)


def console() -> None:
    """The `shards-demo` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
