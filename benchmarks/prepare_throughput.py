"""How fast `prepare` turns an image folder into shards, against itself and against `tar -cf`.

    python benchmarks/prepare_throughput.py [--images N] [--repeats R] [--json]

Measured side by side in one run, on the same files (JPEGs of about 20 kB in 10 class folders, no
re-encoding): prepare with --workers 1, prepare with --workers 2, and a plain `tar -cf` of the same
tree, the I/O bound. Medians of R repeats; the ratios are what to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from project.shards.prepare import prepare


def make_images(root: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (160, 160, 3), dtype=np.uint8)
    for i in range(count):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        noisy = np.clip(base.astype(np.int16) + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(folder / f"{i:06d}.jpg", quality=85)


def timed(function) -> float:  # noqa: ANN001
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=16000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        make_images(scratch / "images", args.images)
        total_bytes = sum(p.stat().st_size for p in (scratch / "images").rglob("*.jpg"))
        times: dict[str, list[float]] = {"prepare --workers 1": [], "prepare --workers 2": [], "tar -cf": []}
        for repeat in range(args.repeats):
            for workers in (1, 2):
                out = scratch / f"out{workers}-{repeat}"
                times[f"prepare --workers {workers}"].append(
                    timed(lambda: prepare(str(scratch / "images"), out, workers=workers, quiet=True))  # noqa: B023
                )
                shutil.rmtree(out)
            archive = scratch / f"plain-{repeat}.tar"
            times["tar -cf"].append(timed(lambda: subprocess.run(["tar", "-cf", str(archive), "images"],  # noqa: B023
                                                                 cwd=scratch, check=True)))  # fmt: skip
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
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.images} JPEGs, {result['megabytes']} MB, median of {args.repeats}:")
    for name, rate in rates.items():
        print(f"  {name:22s} {rate:8.0f} samples/s  ({medians[name]:.2f} s)")
    print(f"  workers 2 / workers 1: {result['workers_2_over_1']}x;  workers 2 / tar: {result['workers_2_over_tar']}x")


if __name__ == "__main__":
    main()
