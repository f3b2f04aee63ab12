"""How fast `prepare` turns an image folder into shards, against itself and against `tar -cf`, and what
finding duplicates adds.

    python benchmarks/prepare_throughput.py [--images N] [--repeats R] [--json true]

Measured side by side in one run, on the same files (distinct JPEGs of about 18 kB in 10 class folders, no
re-encoding): prepare with --workers 1 and 2 without dedup, prepare --workers 2 with --dedup exact and with
--dedup near, and a plain `tar -cf` of the same tree, the I/O bound. Medians of R repeats, the runs of a
repeat interleaved; the ratios are what to compare across machines.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

from project.commands import run_command
from project.data.workers import warm_forkserver
from project.shards.prepare import prepare


def make_images(root: Path, count: int) -> None:
    """Distinct images (each its own smooth colour field plus noise), so that --dedup near has the work of
    a real collection: a noisy copy of one picture, as before, is one big group of near duplicates."""
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        field = Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
        base = np.asarray(field.resize((160, 160), Image.Resampling.BICUBIC)).astype(np.int16)
        noisy = np.clip(base + rng.integers(-70, 70, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(folder / f"{i:06d}.jpg", quality=85)


def timed(function) -> float:  # noqa: ANN001
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def options(*, images: int = 16000, repeats: int = 5, json: bool = False) -> SimpleNamespace:
    """Prepare's samples/s against `tar -cf` of the same JPEGs, with 1 and 2 workers and with --dedup.

    Args:
        images: JPEGs written into 10 class folders.
        repeats: repeats of each run (medians).
        json: print one JSON object.
    """
    return SimpleNamespace(images=images, repeats=repeats, json=json)


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/prepare_throughput.py", argv)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        make_images(scratch / "images", args.images)
        total_bytes = sum(p.stat().st_size for p in (scratch / "images").rglob("*.jpg"))
        runs = {
            "prepare --workers 1": (1, "off"),
            "prepare --workers 2": (2, "off"),
            "prepare --workers 2 --dedup exact": (2, "exact"),
            "prepare --workers 2 --dedup near": (2, "near"),
        }
        warm_forkserver(["project.shards.prepare"])  # as `python -m project.shards.prepare` has it, untimed
        times: dict[str, list[float]] = {name: [] for name in [*runs, "tar -cf"]}
        for repeat in range(args.repeats):
            for name, (workers, dedup) in runs.items():
                out = scratch / f"out-{repeat}"
                images = str(scratch / "images")
                times[name].append(timed(partial(prepare, images, out=out, workers=workers, quiet=True, dedup=dedup)))
                shutil.rmtree(out)
            archive = scratch / f"plain-{repeat}.tar"
            command = ["tar", "-cf", str(archive), "images"]
            times["tar -cf"].append(timed(partial(subprocess.run, command, cwd=scratch, check=True)))
            archive.unlink()
    medians = {name: statistics.median(values) for name, values in times.items()}
    rates = {name: args.images / seconds for name, seconds in medians.items()}
    result = {
        "images": args.images,
        "megabytes": round(total_bytes / 1e6, 1),
        "samples_per_s": {name: round(rate) for name, rate in rates.items()},
        "workers_2_over_1": round(rates["prepare --workers 2"] / rates["prepare --workers 1"], 2),
        "workers_2_over_tar": round(rates["prepare --workers 2"] / rates["tar -cf"], 2),
        "workers_1_over_tar": round(rates["prepare --workers 1"] / rates["tar -cf"], 2),
        "dedup_exact_adds": round(medians["prepare --workers 2 --dedup exact"] / medians["prepare --workers 2"] - 1, 2),
        "dedup_near_adds": round(medians["prepare --workers 2 --dedup near"] / medians["prepare --workers 2"] - 1, 2),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.images} JPEGs, {result['megabytes']} MB, median of {args.repeats}:")
    for name, rate in rates.items():
        print(f"  {name:34s} {rate:8.0f} samples/s  ({medians[name]:.2f} s)")
    print(f"  workers 2 / workers 1: {result['workers_2_over_1']}x;  workers 2 / tar: {result['workers_2_over_tar']}x")
    print(
        f"  wall time added by --dedup exact: {result['dedup_exact_adds']:+.0%}; by --dedup near: "
        f"{result['dedup_near_adds']:+.0%}"
    )


if __name__ == "__main__":
    main()
