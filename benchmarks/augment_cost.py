"""Decode and training-augmentation CPU per sample, before and after the fast paths, side by side; and the
train loader against the naive work limit.

    python benchmarks/augment_cost.py [--samples 512] [--repeats 5] [--loader-samples 2048] [--json PATH]

Images: the demo's generator (shapes on a noisy gradient, JPEG q90), at 32 px (the demo), at 256 px, and
at 500 x 375 (drawn at 500, cropped). Each is trained at 32, 224 and 224 with the `light` preset
(RandomResizedCrop of 70-100% of the area, and a horizontal flip).

- before: torchvision's JPEG operator at full size, then the v2 preset per sample (what `transform_all` ran);
- after: `decode_jpeg_pixels` (simplejpeg, at the reduced DCT scale the preset allows), then `CropFlip`
  on the batch (numpy boxes, OpenCV resizes): what `ImageShards` runs now.

CPU is process time in one process with one torch thread, per sample, median over repeats. The naive work
limit is what 2 processes doing the "before" work could deliver (2 / (decode + augment)); the loader is
`ImageShards.train_dataloader()` with 2 workers, batches of 128, one epoch per repeat (median).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torchvision.io import ImageReadMode

from project.data.shards import Shard, write_index
from project.shards.tarwriter import FastTarWriter
from project.tasks.image.crops import CropFlip, hwc
from project.tasks.image.decode import decode_jpeg_pixels
from project.tasks.image.demo import CLASSES, draw_sample, encode_jpeg
from project.tasks.image.transforms import build_transform

SIZES = [("32 px -> 32", 32, 32, 32), ("256 px -> 224", 256, 256, 224), ("500x375 -> 224", 500, 375, 224)]


def images(width: int, height: int, count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    drawn = [draw_sample(i % len(CLASSES), width, rng)[:height] for i in range(count)]
    return [encode_jpeg(image) for image in drawn]


def cpu_per_sample(work, count: int, repeats: int) -> float:
    """Median process-CPU microseconds per sample of `work()`, which handles `count` samples."""
    work()  # warm up (imports, first allocations)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        work()
        times.append((time.process_time() - start) / count * 1e6)
    return statistics.median(times)


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

    count = len(encoded)
    return {
        "decode_before_us": cpu_per_sample(lambda: [operator(frame, rgb, False) for frame in frames], count, repeats),
        "decode_after_us": cpu_per_sample(
            lambda: [decode_jpeg_pixels(d, decode_size) for d in encoded], count, repeats
        ),
        "augment_before_us": cpu_per_sample(augment_before, count, repeats),
        "augment_after_us": cpu_per_sample(augment_after, count, repeats),
    }


def loader_rate(encoded: list[bytes], size: int, repeats: int, workers: int = 2) -> float:
    """Median samples/s of the project's train loader over these images (one epoch per repeat)."""
    from project.tasks.image.data import ImageShards

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
        task = ImageShards(root=None, train=folder, image_size=size, augment="light", batch_size=128,
                           num_workers=workers, classes=CLASSES)  # fmt: skip
        rates = []
        for epoch in range(repeats + 1):  # the first epoch starts the workers' server: not counted
            loader = task.train_dataloader()
            loader.dataset.set_epoch(epoch)
            start, count = time.perf_counter(), 0
            for batch in loader:
                count += len(batch.label)
            if epoch:
                rates.append(count / (time.perf_counter() - start))
        return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=512, help="images per size for the CPU costs")
    parser.add_argument("--loader-samples", type=int, default=2048, help="images per size for the loader")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    header = f"{'stored -> trained':<16} {'decode':>16} {'augment':>16} {'aug after/before':>17} {'loader/naive':>13}"
    print(header)
    for name, width, height, size in SIZES:
        encoded = images(width, height, max(args.samples, args.loader_samples))
        costs = measure_costs(encoded[: args.samples], size, args.repeats)
        naive = 2 / ((costs["decode_before_us"] + costs["augment_before_us"]) * 1e-6)
        rate = loader_rate(encoded[: args.loader_samples], size, max(1, args.repeats // 2))
        costs.update(naive_limit=naive, loader=rate, loader_vs_naive=rate / naive,
                     augment_ratio=costs["augment_after_us"] / costs["augment_before_us"])  # fmt: skip
        results[name] = costs
        decode = f"{costs['decode_before_us']:>7.0f} -> {costs['decode_after_us']:<6.0f}"
        augment = f"{costs['augment_before_us']:>7.0f} -> {costs['augment_after_us']:<6.0f}"
        print(f"{name:<16} {decode} {augment} {costs['augment_ratio']:>17.2f} {costs['loader_vs_naive']:>13.2f}")
    print("(microseconds of CPU per sample; loader/naive: the train loader's samples/s over 2 processes' "
          "unfused torchvision decode + v2 augmentation)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
