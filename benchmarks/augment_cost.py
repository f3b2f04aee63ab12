"""Decode and training-augmentation CPU per sample, before and after the fast paths, side by side; and the
train loader against the naive work limit.

    python benchmarks/augment_cost.py [--samples 512] [--repeats 5] [--loader_samples 4096] [--photos DIR]
                                      [--json PATH]

Images: the demo's generator (shapes on a noisy gradient, JPEG q90), at 32 px (the demo), at 256 px, and
at 500 x 375 (drawn at 500, cropped). With --photos DIR, the 256 px and 500 x 375 images are cut from the
pictures in DIR instead (any format PIL reads; each picture scaled by 1-1.6 past covering the size, a
random window of the size, flipped half the time, JPEG q90), so that decoding sees a photograph's
statistics. Each is trained at 32, 224 and 224 with the `light` preset (RandomResizedCrop of 70-100% of
the area, and a horizontal flip).

- before: torchvision's JPEG operator at full size, then the v2 preset per sample (what `transform_all` ran);
- after: `decode_jpeg_pixels` (simplejpeg, at the reduced DCT scale the preset allows), then `CropFlip`
  (a box drawn per image, OpenCV resizes), here on the batch after decoding it; `ImageShards` crops each
  image as it decodes it, 0.15 ms a photograph less (benchmarks/README.md).

CPU is process time in one process with one torch thread, per sample, median over repeats in which the
four works take turns (on a virtual machine a core's speed depends on what else runs beside it: the same
decode read 580 and 835 us here, alone and beside a 2-process benchmark; measure on a quiet machine).
The naive work limit is what 2 processes doing the "before" work could deliver (2 / (decode + augment)); the loader is
`ImageShards.train_dataloader()` with 2 workers, batches of 128, one epoch per repeat (median), at its
steady rate: the samples after the first batch over the time from the first batch to the last (an epoch of
a few thousand samples would otherwise be mostly the workers' start, which a real epoch pays once).
"""

from __future__ import annotations

import io
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torchvision.io import ImageReadMode

from project.commands import run_command
from project.data.shard_index import Shard, write_index
from project.data.tarwriter import FastTarWriter
from project.errors import run_main
from project.tasks.image.crops import CropFlip, hwc
from project.tasks.image.decode import decode_jpeg_pixels
from project.tasks.image.demo import CLASSES, draw_sample, encode_jpeg
from project.tasks.image.transforms import build_transform

SIZES = [("32 px -> 32", 32, 32, 32), ("256 px -> 224", 256, 256, 224), ("500x375 -> 224", 500, 375, 224)]


def images(width: int, height: int, count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    drawn = [draw_sample(i % len(CLASSES), width, rng)[:height] for i in range(count)]
    return [encode_jpeg(image) for image in drawn]


def photo_images(folder: Path, width: int, height: int, count: int) -> list[bytes]:
    """`count` JPEGs (q90) of width x height cut from the pictures in `folder`, as the module says."""
    from PIL import Image, UnidentifiedImageError

    pictures = []
    for path in sorted(folder.iterdir()):
        try:
            pictures.append(Image.open(path).convert("RGB"))
        except (UnidentifiedImageError, OSError):
            continue
    if not pictures:
        raise SystemExit(f"--photos {folder}: no picture PIL can read")
    rng, encoded = np.random.default_rng(0), []
    for number in range(count):
        picture = pictures[number % len(pictures)]
        scale = max(width / picture.width, height / picture.height) * rng.uniform(1.0, 1.6)
        scaled = picture.resize((int(picture.width * scale) + 1, int(picture.height * scale) + 1), Image.BILINEAR)
        left, top = rng.integers(0, scaled.width - width + 1), rng.integers(0, scaled.height - height + 1)
        window = scaled.crop((left, top, left + width, top + height))
        if rng.random() < 0.5:
            window = window.transpose(Image.FLIP_LEFT_RIGHT)
        buffer = io.BytesIO()
        window.save(buffer, "JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


def cpu_per_sample(works: dict, count: int, repeats: int) -> dict[str, float]:
    """Median process-CPU microseconds per sample of each `works[name]()`, which handles `count` samples;
    the works take turns within each repeat, so that a change in the machine's state touches all alike."""
    for work in works.values():
        work()  # warm up (imports, first allocations)
    times: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(repeats):
        for name, work in works.items():
            start = time.process_time()
            work()
            times[name].append((time.process_time() - start) / count * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def measure_costs(encoded: list[bytes], size: int, repeats: int, batch: int = 128) -> dict:
    transform = build_transform("light", size, train=True)
    crop_flip, _ = CropFlip.split(transform)
    decode_size = math.ceil(size / math.sqrt(crop_flip.scale[0]))
    frames = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in encoded]
    operator, rgb = torch.ops.image.decode_jpeg, ImageReadMode.RGB.value  # torchvision's own operator
    before = [operator(frame, rgb, False) for frame in frames]
    after = [decode_jpeg_pixels(data, decode_size) for data in encoded]
    batches = [range(start, min(start + batch, len(encoded))) for start in range(0, len(encoded), batch)]

    def augment_before() -> None:
        for rows in batches:
            torch.stack([transform(before[row]) for row in rows])

    def augment_after() -> None:
        for rows in batches:
            crop_flip([hwc(after[row]) for row in rows])

    works = {
        "decode_before_us": lambda: [operator(frame, rgb, False) for frame in frames],
        "decode_after_us": lambda: [decode_jpeg_pixels(d, decode_size) for d in encoded],
        "augment_before_us": augment_before,
        "augment_after_us": augment_after,
    }
    return cpu_per_sample(works, len(encoded), repeats)


def loader_rate(encoded: list[bytes], size: int, repeats: int, workers: int = 2) -> float:
    """Median samples/s of the project's train loader over these images (one epoch per repeat)."""
    from project.data.workers import warm_forkserver
    from project.tasks import WORKER_MODULES
    from project.tasks.image.data import ImageShards

    # the workers' server imports the pipeline once, as in project.train; otherwise each worker imports
    # Lightning and torchvision as it starts, and one worker's first batch arrives while the other imports
    warm_forkserver(WORKER_MODULES)
    with tempfile.TemporaryDirectory() as folder:
        shards, per_shard = [], 256
        for number, first in enumerate(range(0, len(encoded), per_shard)):
            path = Path(folder) / f"train-{number:06d}.tar"
            chunk = encoded[first : first + per_shard]
            with open(path, "wb") as stream, FastTarWriter(stream) as writer:
                for offset, data in enumerate(chunk):
                    writer.write({"__key__": f"{first + offset:08d}", "jpg": data, "cls": b"%d" % (offset % 10)})
            shards.append(Shard(str(path), len(chunk), path.stat().st_size))
        write_index(Path(folder) / "shardindex.json", shards, extra={"classes": CLASSES})
        task = ImageShards(
            root=None,
            train=folder,
            image_size=size,
            augment="light",
            batch_size=128,
            num_workers=workers,
            classes=CLASSES,
            pin_memory=False,
        )
        rates = []
        for epoch in range(repeats + 1):  # the first epoch is not counted (first reads of the shards)
            loader = task.train_dataloader()
            loader.dataset.set_epoch(epoch)
            start, count = None, 0
            for batch in loader:
                if start is None:  # the steady rate: from the first batch on
                    start = time.perf_counter()
                else:
                    count += len(batch.label)
            if epoch:
                rates.append(count / (time.perf_counter() - start))
        return statistics.median(rates)


def options(
    *,
    samples: int = 512,
    loader_samples: int = 4096,
    photos: Path | None = None,
    repeats: int = 5,
    json: Path | None = None,
) -> SimpleNamespace:
    """Decode and training-augmentation CPU per sample, before and after the fast paths, and the loader's rate.

    The train loader's samples/s is compared with the naive work limit.

    Args:
        samples: images per size for the CPU costs.
        loader_samples: images per size for the loader.
        photos: a folder of pictures to cut the large images from.
        repeats: repeats of each measurement (medians).
        json: write the results to this file.
    """
    return SimpleNamespace(samples=samples, loader_samples=loader_samples, photos=photos, repeats=repeats, json=json)


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/augment_cost.py", argv)
    torch.set_num_threads(1)
    results = {}
    header = f"{'stored -> trained':<16} {'decode':>16} {'augment':>16} {'aug after/before':>17} {'loader/naive':>13}"
    print(header)
    for name, width, height, size in SIZES:
        count = max(args.samples, args.loader_samples)
        encoded = images(width, height, count) if args.photos is None or size == width else None
        encoded = encoded or photo_images(Path(args.photos), width, height, count)
        costs = measure_costs(encoded[: args.samples], size, args.repeats)
        naive = 2 / ((costs["decode_before_us"] + costs["augment_before_us"]) * 1e-6)
        rate = loader_rate(encoded[: args.loader_samples], size, max(1, args.repeats // 2))
        costs.update(
            naive_limit=naive,
            loader=rate,
            loader_vs_naive=rate / naive,
            augment_ratio=costs["augment_after_us"] / costs["augment_before_us"],
        )
        results[name] = costs
        decode = f"{costs['decode_before_us']:>7.0f} -> {costs['decode_after_us']:<6.0f}"
        augment = f"{costs['augment_before_us']:>7.0f} -> {costs['augment_after_us']:<6.0f}"
        print(f"{name:<16} {decode} {augment} {costs['augment_ratio']:>17.2f} {costs['loader_vs_naive']:>13.2f}")
    print(
        "(microseconds of CPU per sample; loader/naive: the train loader's samples/s over 2 processes' "
        "unfused torchvision decode + v2 augmentation)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    run_main(main)
