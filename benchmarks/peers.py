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

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from peer_calls import PHOTOS_TRAINED, run_call
from peer_data import ImageSet
from peer_names import LIGHT_SCALE, LOADERS
from peer_tables import dali_stage_table, stage_table, table

from project.commands import run_command
from project.errors import UserError, run_main


def call(spec: dict, isolated: bool = True) -> dict:
    """`peer_calls.run_call(spec)` in a fresh process (`--one SPEC`), or in this one where `isolated` is false;
    a process that fails gives {"error": its last line}."""
    if not isolated:
        return run_call(spec)
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch:
        out = Path(scratch) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec), "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode or not out.exists():
            lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit code {done.returncode}"]
            return {"error": lines[-1]}
        return json.loads(out.read_text())


def checked(result: dict, what: str) -> dict:
    if "error" in result:
        raise UserError(f"{what} failed: {result['error']}")
    return result


def fields(data: ImageSet) -> dict:
    return {"name": data.name, "shards": str(data.shards), "cache": str(data.cache)}


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
    """One epoch of `loader` (see peer_loaders.run_epoch, which takes the `options`), in a fresh process unless
    `isolated` is false; a peer that is not installed gives {"missing": ...}, one that fails {"error": ...}."""
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
    result = call(spec, isolated)
    return {"loader": loader, **result} if "error" in result else result


def naive_run(data: ImageSet, size: int, args: SimpleNamespace, isolated: bool = True) -> dict:
    """The naive work limit (`peer_calls.naive_limit`), in a fresh process as each loader's epoch is."""
    scale = getattr(args, "crop_scale", LIGHT_SCALE)
    spec = {"call": "naive", **fields(data), "size": size, "workers": args.workers, "crop_scale": scale}
    return checked(call(spec, isolated), "the naive work limit")


def measure(data: ImageSet, size: int, args: SimpleNamespace, isolated: bool = True) -> dict:
    """Every loader's epochs on `data` at `size`, R repeats interleaved, with medians and ratios; the first
    repeat's key order per loader is kept in "orders" (for benchmarks/shuffle_quality.py)."""
    ready = checked(call({"call": "prepare", **fields(data), "loaders": list(args.loaders)}, isolated), "the set")
    keys = ready["keys"]
    runs: dict[str, list[dict]] = {loader: [] for loader in args.loaders}
    notes: dict[str, str] = {}
    naive, orders = [], {}
    for _ in range(args.repeats):
        naive.append(naive_run(data, size, args, isolated))
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
        "stored": ready["stored"],
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


def stages_of(which: str, data: ImageSet, size: int, args: SimpleNamespace) -> dict[str, float]:
    """The project's ("stages") or DALI's ("dali") CPU per sample by stage, in a fresh process."""
    settings = {"crop_scale": args.crop_scale, "batch_size": args.batch_size, "workers": args.workers}
    return checked(call({"call": which, **fields(data), "size": size, "args": settings}), f"the {which} table")


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
        one: a spec (JSON, as `call` writes it: an epoch, the naive limit, the set, a stage table), run in this
            process (benchmarks/peer_calls.py); its result goes to --out.
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


def image_set(spec: dict) -> ImageSet:
    """The set a run measures (see `peer_calls.image_set`), made in a fresh process if missing."""
    made = checked(call({"call": "set", **spec}), "making the set")
    return ImageSet(made["name"], Path(made["shards"]), Path(made["cache"]))


def main(argv: list[str] | None = None) -> list[dict]:
    args = run_command(options, "benchmarks/peers.py", argv)
    if args.one:
        result = run_call(json.loads(args.one))
        Path(args.out).write_text(json.dumps(result))
        return [result]
    before, results = machine(), []
    sets = (
        [(image_set({"photos": str(args.photos)}), PHOTOS_TRAINED)]
        if args.photos
        else [
            (image_set({"stored": stored, "photo_samples": args.photo_samples}), trained)
            for stored, trained in args.sizes
        ]
    )
    for data, trained in sets:
        result = measure(data, trained, args)
        result.pop("orders")
        results.append(result)
        print(table(result) + "\n", flush=True)
        if "cpu_us" in result["loaders"].get("project", {}):
            result["stages"] = stages_of("stages", data, trained, args)
            print(stage_table(result) + "\n", flush=True)
        if "cpu_us" in result["loaders"].get("dali", {}):
            result["dali_stages"] = stages_of("dali", data, trained, args)
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
