"""This project's train loader against its peers, side by side, on the same images and augmentation.

    python benchmarks/peers.py [--workers 2] [--batch_size 128] [--repeats 3] [--sizes 32:32,256:224]
                               [--loaders project,webdataset,litdata,mosaic,imagefolder,spdl,dali] [--json PATH]
    python benchmarks/peers.py --photos DIR [...]   # the real photographs benchmarks/photos.py wrote to DIR
    python benchmarks/peers.py --photos DIR --crop_scale 0.08   # ImageNet's usual crops instead of light's

For each size (stored px : trained px) it runs one full shuffled epoch of each loader, each in a fresh
process, with N workers and batch B: the project's (ImageShards, data.augment=light), webdataset's
WebDataset + WebLoader, litdata's StreamingDataset + StreamingDataLoader, mosaicml-streaming's
StreamingDataset, torchvision's ImageFolder, SPDL's pipeline of N threads (benchmarks/peer_spdl.py) and
NVIDIA DALI's CPU pipeline of N threads (benchmarks/peer_dali.py). The peers decode with torchvision's
decode_jpeg and apply the `light` preset per sample (SPDL: FFmpeg, the same crop and flip rule as filters;
DALI: its region-of-interest decoder, resize and flip); the project runs its own path to the same crop and
flip (see benchmarks/peer_loaders.py); --crop_scale S: every loader crops from S to 1 of the area instead
of light's 0.7. 32:32 reads the demo's 20,000 training images; 256:224 a set of 4,096 demo images drawn at
256 px; --photos DIR, instead of those, the photographs of DIR (500 x 375) trained at 224.
Each peer's format is written once under data/peers/ (under DIR for --photos).

Per loader: samples/s (iter() to the last batch), CPU microseconds per sample (the main process and its
workers, from /proc), peak RSS (their sum, sampled at each batch) and the ratio to the project. The naive
work limit is decode_jpeg plus the light augmentation of each sample, timed in one process with one
thread, times the N processes a loader has: "the unfused torchvision decode plus v2 augmentation, by the
same number of processes". Medians of R repeats, interleaved. A peer that is not installed (`pip install
-e ".[peers]"`) is reported as such in its row.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from peer_data import ImageSet, demo_set, ensure_format, photo_set, photos_in
from peer_loaders import LIGHT_SCALE, LOADERS, Augment, PeerMissing, crop_transform, run_epoch, stored_samples
from peer_tables import dali_stage_table, stage_table, table

from project.commands import run_command
from project.errors import UserError, run_main

PHOTOS_TRAINED = 224  # px, what --photos trains at


def naive_limit(
    data: ImageSet, size: int, processes: int, samples: int = 2000, crop_scale: float = LIGHT_SCALE
) -> dict:
    """decode_jpeg + the light augmentation of each sample (held in memory; crops from `crop_scale` of the
    area), in this process with one torch thread as a DataLoader worker has: microseconds a sample, and that
    work's rate on `processes` processes."""
    items = [(s["jpg"], s["cls"]) for s in itertools.islice(stored_samples(data.shards), samples)]
    augment, threads = Augment(size, crop_scale), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        for jpeg, label in items:
            augment(jpeg)
            int(label)
        seconds = (time.perf_counter() - start) / len(items)
    finally:
        torch.set_num_threads(threads)
    return {"us_per_sample": seconds * 1e6, "rate": max(1, processes) / seconds}


def run_one(
    loader: str,
    data: ImageSet,
    size: int,
    args: SimpleNamespace,
    *,
    shuffle_buffer: int = 1000,
    isolated: bool = True,
    **options: object,
) -> dict:
    """One epoch of `loader` (see `run_epoch`, which takes the `options`), in a fresh process unless `isolated`
    is false; a peer that is not installed gives {"missing": ...}, one that fails {"error": ...}."""
    spec = {
        **options,
        "loader": loader,
        "shards": str(data.shards),
        "cache": str(data.cache),
        "size": size,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "shuffle_buffer": shuffle_buffer,
        "crop_scale": getattr(args, "crop_scale", LIGHT_SCALE),
    }
    if not isolated:
        return epoch_of(spec)
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch:
        out = Path(scratch) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec), "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode or not out.exists():
            lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit code {done.returncode}"]
            return {"loader": loader, "error": lines[-1]}
        return json.loads(out.read_text())


def epoch_of(spec: dict) -> dict:
    spec = dict(spec, shards=Path(spec["shards"]), cache=Path(spec["cache"]))
    try:
        return run_epoch(**spec)
    except PeerMissing as missing:
        return {"loader": spec["loader"], "missing": str(missing), "note": missing.note}


def measure(data: ImageSet, size: int, args: SimpleNamespace, isolated: bool = True) -> dict:
    """Every loader's epochs on `data` at `size`, R repeats interleaved, with medians and ratios; the first
    repeat's key order per loader is kept in "orders" (for benchmarks/shuffle_quality.py)."""
    keys = [sample["__key__"] for sample in stored_samples(data.shards)]
    for loader in args.loaders:
        ensure_format(data, loader)
    runs: dict[str, list[dict]] = {loader: [] for loader in args.loaders}
    notes: dict[str, str] = {}
    naive, orders = [], {}
    for _ in range(args.repeats):
        naive.append(naive_limit(data, size, args.workers, crop_scale=getattr(args, "crop_scale", LIGHT_SCALE)))
        for loader in args.loaders:
            if loader in notes:
                continue
            result = run_one(loader, data, size, args, isolated=isolated)
            if "missing" in result or "error" in result:
                notes[loader] = (
                    result.get("note", "not installed") if "missing" in result else f"failed: {result['error']}"
                )
                continue
            order = result.pop("keys")
            orders.setdefault(loader, order)
            result["duplicates"] = len(order) - len(set(order))
            result["unknown"] = len(set(order) - set(keys))
            runs[loader].append(result)
    limit = {name: statistics.median(run[name] for run in naive) for name in ("us_per_sample", "rate")}
    rows = {}
    for loader, results in runs.items():
        if loader in notes:
            rows[loader] = {"note": notes[loader]}
            continue
        medians = ("rate", "cpu_us", "peak_rss_mb", "peak_pss_mb")
        rows[loader] = {name: statistics.median(r[name] for r in results) for name in medians}
        rows[loader].update(
            samples=results[0]["samples"],
            duplicates=max(r["duplicates"] for r in results),
            unknown=max(r["unknown"] for r in results),
            runs=results,
        )
        rows[loader]["vs_naive"] = rows[loader]["rate"] / limit["rate"]
    project = rows.get("project", {}).get("rate")
    for row in rows.values():
        if project and "rate" in row:
            row["vs_project"] = row["rate"] / project
    return {
        "set": data.name,
        "stored": stored_size(data),
        "trained": size,
        "samples": len(keys),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "crop_scale": getattr(args, "crop_scale", LIGHT_SCALE),
        "naive": {**limit, "runs": naive},
        "loaders": rows,
        "orders": orders,
    }


def stored_size(data: ImageSet) -> int:
    from torchvision.io import decode_jpeg

    first = next(iter(stored_samples(data.shards)))["jpg"]
    return int(decode_jpeg(torch.frombuffer(bytearray(first), dtype=torch.uint8)).shape[-1])


def project_stages(data: ImageSet, size: int, args: SimpleNamespace) -> dict[str, float]:
    """CPU µs per sample of each stage of the project's loader on `data`, each alone (project/bench/stages.py),
    with the settings its epochs above ran with."""
    from project.bench.stages import stage_costs

    scale = getattr(args, "crop_scale", LIGHT_SCALE)
    augment = "light" if scale == LIGHT_SCALE else crop_transform(size, scale)
    settings = {"batch_size": args.batch_size, "image_size": size, "augment": augment, "shuffle_buffer": 1000}
    return stage_costs(data.shards, {**settings, "seed": 0})


def dali_stages(data: ImageSet, size: int, args: SimpleNamespace) -> dict[str, float]:
    """CPU µs per sample of DALI's pipeline cut after each stage (benchmarks/peer_dali.py), with its epochs'
    settings."""
    import peer_dali

    crops = {"crop_scale": args.crop_scale, "shuffle_buffer": 1000}
    return peer_dali.stage_costs(data.shards, data.cache, size, args.workers, args.batch_size, **crops)


def machine() -> dict:
    return {"cores": os.cpu_count(), "load_1_5_15": [round(value, 2) for value in os.getloadavg()]}


def options(
    *,
    workers: int = 2,
    batch_size: int = 128,
    repeats: int = 3,
    sizes: str = "32:32,256:224",
    photo_samples: int = 4096,
    photos: Path | None = None,
    crop_scale: float = LIGHT_SCALE,
    loaders: str = ",".join(LOADERS),
    json: str | None = None,
    one: str | None = None,
    out: str | None = None,
) -> SimpleNamespace:
    """This project's train loader against its peers, side by side, on the same images and augmentation.

    Args:
        workers: DataLoader workers of every loader.
        batch_size: samples per batch.
        repeats: epochs per loader (medians).
        sizes: stored:trained px pairs, comma-separated; 32 is the demo.
        photo_samples: images of the 256 px set.
        photos: real photographs (benchmarks/photos.py wrote them to DIR), instead of --sizes.
        crop_scale: every loader's smallest crop, a share of the image's area (0.7: light's; 0.08: ImageNet's).
        loaders: a comma-separated subset of project, project-threads, webdataset, litdata, mosaic, imagefolder,
            spdl, dali.
        json: write every run, median and ratio to this file.
        one: a single epoch's spec (JSON, as `run_one` writes it), run in this process; its result goes to --out.
        out: the file --one writes its result to.
    """
    names = [name.strip() for name in loaders.split(",") if name.strip()]
    if unknown := set(names) - set(LOADERS):
        raise UserError(f"unknown loaders {sorted(unknown)}: choose from {', '.join(LOADERS)}")
    if one is not None and out is None:
        raise UserError("--one needs --out FILE")
    if not 0 < crop_scale <= 1:
        raise UserError(f"--crop_scale must be in (0, 1], not {crop_scale}")
    pairs = [tuple(int(px) for px in pair.split(":")) for pair in sizes.split(",")]
    return SimpleNamespace(
        workers=workers,
        batch_size=batch_size,
        repeats=repeats,
        sizes=pairs,
        photo_samples=photo_samples,
        photos=photos,
        crop_scale=crop_scale,
        loaders=names,
        json=json,
        one=one,
        out=out,
    )


def image_set(stored: int, args: SimpleNamespace) -> ImageSet:
    return demo_set() if stored == 32 else photo_set(samples=args.photo_samples, size=stored)


def main(argv: list[str] | None = None) -> list[dict]:
    args = run_command(options, "benchmarks/peers.py", argv)
    if args.one:
        result = epoch_of(json.loads(args.one))
        Path(args.out).write_text(json.dumps(result))
        return [result]
    before, results = machine(), []
    sets = (
        [(photos_in(args.photos), PHOTOS_TRAINED)]
        if args.photos
        else [(image_set(stored, args), trained) for stored, trained in args.sizes]
    )
    for data, trained in sets:
        result = measure(data, trained, args)
        result.pop("orders")
        results.append(result)
        print(table(result) + "\n", flush=True)
        if "cpu_us" in result["loaders"].get("project", {}):
            result["stages"] = project_stages(data, trained, args)
            print(stage_table(result) + "\n", flush=True)
        if "cpu_us" in result["loaders"].get("dali", {}):
            result["dali_stages"] = dali_stages(data, trained, args)
            print(dali_stage_table(result) + "\n", flush=True)
    report = {"machine": {**before, "load_after": machine()["load_1_5_15"]}, "sizes": results}
    print(
        f"{report['machine']['cores']} cores; load average (1, 5, 15 min) {before['load_1_5_15']} before, "
        f"{report['machine']['load_after']} after"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return results


if __name__ == "__main__":
    run_main(main)
