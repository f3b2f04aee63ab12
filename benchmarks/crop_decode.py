"""Decoding only a training crop's pixels: the candidate libraries side by side, one thread, on real photographs.

    python benchmarks/crop_decode.py [--photos data/peers/photos] [--samples 300] [--repeats 3] [--json PATH]

The photographs are the training shards benchmarks/photos.py wrote to DIR (500 x 375 JPEGs, q90). Each library
decodes every sample, in this process with one thread, four ways: whole; at 1/2 DCT scale (libjpeg-turbo's
scaled IDCT, where the library offers it); and to the crop boxes of a RandomResizedCrop with aspect 3/4 to 4/3
and 8-100% (ImageNet's usual) or 70-100% (`light`) of the area, drawn by the project's rule
(`CropFlip.box`) from a seeded generator, the same boxes for every library. A library that cannot decode a
region decodes the whole image and slices it (marked "whole + slice"). Microseconds per sample, medians of
the repeats (each repeat runs every library in turn), and, per library, the largest difference of its crops'
pixels from PIL's whole decode sliced to the same box (0: the same pixels).

Candidates: Pillow (draft mode), simplejpeg, OpenCV (IMREAD_REDUCED_*), torchvision's decode_jpeg,
imagecodecs, pyvips (with pyvips-binary: shrink-on-load, a sequential read stopped below the box),
nvImageCodec's CPU backend (nvidia-nvimgcodec-cu13: libjpeg-turbo's region decode) and NVIDIA DALI's CPU
image_slice decoder (batches of 32 through a one-thread pipeline). One that is not installed is reported
as such. What was measured, and why the project's training decode uses which: benchmarks/README.md.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from crop_decoders import CANDIDATES, Box, pillow

from project.commands import run_command
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.errors import run_main
from project.tasks.image.crops import DRAWS, CropFlip

SCALES = {"crop 8-100%": (0.08, 1.0), "crop 70-100%": (0.7, 1.0)}


def photographs(folder: Path, count: int) -> list[bytes]:
    """The first `count` JPEGs of the training shards under `folder`."""
    jpegs: list[bytes] = []
    for shard in resolve_shards(str(folder / "train")).shards:
        jpegs += [sample["jpg"] for sample in read_samples(shard.url)]
        if len(jpegs) >= count:
            break
    return jpegs[:count]


def boxes(jpegs: list[bytes], scale: tuple[float, float], seed: int = 0) -> list[Box]:
    """One crop box per image, drawn by the project's rule from a seeded generator."""
    from PIL import Image

    crop, generator = CropFlip(224, scale, (3 / 4, 4 / 3), 0.5), torch.Generator().manual_seed(seed)
    drawn = []
    for jpeg in jpegs:
        width, height = Image.open(io.BytesIO(jpeg)).size
        drawn.append(crop.box(height, width, torch.rand(DRAWS, dtype=torch.float64, generator=generator).tolist()))
    return drawn


def timed(work: Callable[[], object], samples: int) -> float:
    """CPU microseconds (this process, all its threads) per sample of one pass of `work`: CPU time, not wall
    time, so that what else runs on the machine counts less."""
    start = time.process_time()
    work()
    return (time.process_time() - start) / samples * 1e6


def works(candidate: dict, jpegs: list[bytes], drawn: dict[str, list[Box]]) -> dict[str, Callable[[], object]]:
    """The passes to time: whole, scaled where offered, and each crop's boxes where it decodes regions (else
    a crop costs its whole decode)."""
    if "batched" in candidate:
        run = candidate["batched"]
        crops = {name: (lambda chosen=chosen: run(jpegs, chosen)) for name, chosen in drawn.items()}
        return {"whole": lambda: run(jpegs, None)} | crops
    passes = {"whole": lambda: [candidate["whole"](jpeg) for jpeg in jpegs]}
    if "scaled" in candidate:
        passes["scaled 1/2"] = lambda: [candidate["scaled"](jpeg) for jpeg in jpegs]
    region = candidate["region"]
    for name, chosen in drawn.items():
        if not getattr(region, "whole_and_slice", False):
            passes[name] = lambda chosen=chosen: [region(jpeg, box) for jpeg, box in zip(jpegs, chosen, strict=True)]
    return passes


def difference(candidate: dict, jpegs: list[bytes], chosen: list[Box], reference: list[np.ndarray]) -> int:
    """The largest difference of the candidate's crops from PIL's whole decode sliced to the same boxes."""
    if "batched" in candidate:
        crops = candidate["batched"](jpegs, chosen)
    else:
        crops = [candidate["region"](jpeg, box) for jpeg, box in zip(jpegs, chosen, strict=True)]
    worst = 0
    for crop, whole, (top, left, height, width) in zip(crops, reference, chosen, strict=True):
        expected = whole[top : top + height, left : left + width]
        if crop.shape != expected.shape:
            return -1  # another box than asked
        worst = max(worst, int(np.abs(crop.astype(np.int16) - expected).max()))
    return worst


def measure(jpegs: list[bytes], repeats: int) -> dict[str, dict]:
    """Each library's passes, interleaved: every repeat runs every pass once, in an order rotated by one."""
    drawn = {name: boxes(jpegs, scale) for name, scale in SCALES.items()}
    reference = [pillow()["whole"](jpeg) for jpeg in jpegs]
    rows, passes = {}, []
    for name, make in CANDIDATES.items():
        try:
            candidate = make()
        except (ImportError, OSError, RuntimeError) as error:  # not installed, or its library will not load
            rows[name] = {"note": f"not available: {type(error).__name__}: {str(error)[:80]}"}
            continue
        region = "batched" in candidate or not getattr(candidate["region"], "whole_and_slice", False)
        first = next(iter(drawn.values()))
        rows[name] = {"region_decode": region, "max_difference": difference(candidate, jpegs, first, reference)}
        rows[name]["runs"] = {work: [] for work in works(candidate, jpegs, drawn)}
        for work, run in works(candidate, jpegs, drawn).items():
            run()  # warm: first calls load tables and grow buffers
            passes.append((name, work, run))
    for repeat in range(repeats):
        turn = repeat % len(passes)
        for name, work, run in passes[turn:] + passes[:turn]:
            rows[name]["runs"][work].append(timed(run, len(jpegs)))
    for row in rows.values():
        if "runs" in row:
            row["us"] = {work: statistics.median(runs) for work, runs in row["runs"].items()}
            row["us"] |= {crop: row["us"]["whole"] for crop in SCALES if crop not in row["us"]}  # whole + slice
    return rows


def table(rows: dict[str, dict]) -> str:
    columns = ["whole", "scaled 1/2", *SCALES]
    lines = [
        "| library | region decode | "
        + " | ".join(f"{c} (µs)" for c in columns)
        + " | crop ÷ whole, 8-100% | max diff |",
        "|---|---|" + "---|" * len(columns) + "---|---|",
    ]
    for name, row in rows.items():
        if "note" in row:
            lines.append(f"| {name} | {row['note']} |" + " |" * (len(columns) + 2))
            continue
        us = row["us"]
        cells = [f"{us[c]:,.0f}" if c in us else "–" for c in columns]
        ratio = us["crop 8-100%"] / us["whole"]
        kind = "yes" if row["region_decode"] else "whole + slice"
        lines.append(f"| {name} | {kind} | " + " | ".join(cells) + f" | {ratio:.2f} | {row['max_difference']} |")
    return "\n".join(lines)


def training(jpegs: list[bytes], repeats: int) -> dict[str, dict]:
    """The image task's training decode (crop, resize and flip included) per sample, whole decode against the crop
    decoded alone, beside the naive work: torchvision's decode_jpeg and the same crops as a v2 pipeline."""
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    from project.tasks.image.task import ImageTask

    samples = [{"__key__": str(i), "__url__": "-", "jpg": jpeg, "cls": b"0"} for i, jpeg in enumerate(jpegs)]
    rows = {}
    for name, scale in SCALES.items():
        transform = v2.Compose([v2.RandomResizedCrop(224, scale=scale, antialias=True), v2.RandomHorizontalFlip()])
        alone, whole = (ImageTask(image_size=224, train_transform=transform) for _ in range(2))
        whole.region_crop.plan = lambda jpeg: None  # every image decoded whole, then cropped: the path before
        passes = {
            "naive": lambda t=transform: [
                t(decode_jpeg(torch.frombuffer(bytearray(j), dtype=torch.uint8))) for j in jpegs
            ],
            "whole": lambda task=whole: [task.decode(one, "train") for one in samples],
            "alone": lambda task=alone: [task.decode(one, "train") for one in samples],
        }
        runs = {work: [] for work in passes}
        for _ in range(repeats + 1):  # the first, a warm-up, is not counted
            for work, run in passes.items():
                runs[work].append(timed(run, len(jpegs)))
        rows[name] = {work: statistics.median(times[1:]) for work, times in runs.items()}
    return rows


def training_table(rows: dict[str, dict]) -> str:
    lines = [
        "| crops | naive: decode_jpeg + v2 (µs) | project, whole decode (µs) | project, crop alone (µs) "
        "| whole ÷ alone | naive ÷ alone |",
        "|---|---|---|---|---|---|",
    ]
    for name, us in rows.items():
        cells = f"{us['naive']:,.0f} | {us['whole']:,.0f} | {us['alone']:,.0f}"
        lines.append(f"| {name} | {cells} | {us['whole'] / us['alone']:.2f} | {us['naive'] / us['alone']:.2f} |")
    return "\n".join(lines)


def options(
    *, photos: Path = Path("data/peers/photos"), samples: int = 200, repeats: int = 7, json: str | None = None
) -> dict:
    """Decoding only a training crop's pixels: the candidate libraries side by side, one thread.

    Args:
        photos: the folder benchmarks/photos.py wrote (its train/ shards are read).
        samples: photographs decoded per pass.
        repeats: passes per library and work (medians).
        json: write every run and median to this file.
    """
    return {"photos": photos, "samples": samples, "repeats": repeats, "json": json}


def main(argv: list[str] | None = None) -> dict:
    args = run_command(options, "benchmarks/crop_decode.py", argv)
    torch.set_num_threads(1)
    jpegs = photographs(Path(args["photos"]), args["samples"])
    load = os.getloadavg()
    rows = measure(jpegs, args["repeats"])
    train = training(jpegs, args["repeats"])
    report = {"samples": len(jpegs), "load_before": load, "load_after": os.getloadavg(), "rows": rows, "train": train}
    print(table(rows) + "\n\n" + training_table(train))
    print(f"{len(jpegs)} photographs; load average (1, 5, 15 min) {load} before, {report['load_after']} after")
    if args["json"]:
        Path(args["json"]).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    run_main(main)
