"""What benchmarks/peers.py runs in a fresh process of its own (`python benchmarks/peers.py --one SPEC`): each
loader's epoch, the naive work limit, the set and its peers' formats, the stage tables. torch and every loader
are imported here only when called, so that the driving process never holds them: here, while one process held
torch and Lightning (idle), every loader's epoch in another ran 15-60% slower (benchmarks/README.md).

Each call takes a JSON-able spec and gives a JSON-able result; `call` names it ("epoch" unless told).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from types import SimpleNamespace

from peer_data import ImageSet, demo_set, ensure_format, photo_set, photos_in, stored_samples
from peer_names import LIGHT_SCALE

PHOTOS_TRAINED = 224  # px, what --photos trains at


def naive_limit(shards: Path, size: int, processes: int, samples: int = 2000, crop_scale: float = LIGHT_SCALE) -> dict:
    """decode_jpeg + the light augmentation of each sample (held in memory; crops from `crop_scale` of the
    area), in this process with one torch thread as a DataLoader worker has: microseconds a sample, and that
    work's rate on `processes` processes."""
    import torch
    from peer_loaders import Augment

    items = [(s["jpg"], s["cls"]) for s in itertools.islice(stored_samples(shards), samples)]
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


def stored_size(shards: Path) -> int:
    """The side of the set's first stored image, in px."""
    import torch
    from torchvision.io import decode_jpeg

    first = next(iter(stored_samples(shards)))["jpg"]
    return int(decode_jpeg(torch.frombuffer(bytearray(first), dtype=torch.uint8)).shape[-1])


def project_stages(data: ImageSet, size: int, args: SimpleNamespace) -> dict[str, float]:
    """CPU µs per sample of each stage of the project's loader on `data`, each alone (project/bench/stages.py),
    with the settings its epochs above ran with."""
    from peer_loaders import crop_transform

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


def image_set(spec: dict) -> dict:
    """The set a run measures (the photographs of a folder, the demo, or demo images drawn at a size), made if
    missing: its name, shards and cache folder."""
    if spec.get("photos"):
        data = photos_in(Path(spec["photos"]))
    else:
        data = demo_set() if spec["stored"] == 32 else photo_set(samples=spec["photo_samples"], size=spec["stored"])
    return {"name": data.name, "shards": str(data.shards), "cache": str(data.cache)}


def prepared(data: ImageSet, loaders: list[str]) -> dict:
    """Each loader's format of the set written (once), the keys in stored order and the stored size."""
    for loader in loaders:
        ensure_format(data, loader)
    return {"keys": [sample["__key__"] for sample in stored_samples(data.shards)], "stored": stored_size(data.shards)}


def epoch(spec: dict) -> dict:
    """One epoch of a loader (peer_loaders.run_epoch, with the spec as its arguments), or its note where the
    peer is not installed."""
    from peer_loaders import PeerMissing, run_epoch

    try:
        return run_epoch(**dict(spec, shards=Path(spec["shards"]), cache=Path(spec["cache"])))
    except PeerMissing as missing:
        return {"loader": spec["loader"], "missing": str(missing), "note": missing.note}


def run_call(spec: dict) -> dict | list:
    """The result of the call a spec names: "epoch" (the default), "naive", "set", "prepare", "stages", "dali"."""
    spec = dict(spec)
    name = spec.pop("call", "epoch")
    if name == "epoch":
        return epoch(spec)
    if name == "set":
        return image_set(spec)
    data = ImageSet(spec["name"], Path(spec["shards"]), Path(spec["cache"]))
    if name == "prepare":
        return prepared(data, spec["loaders"])
    if name == "naive":
        return naive_limit(data.shards, spec["size"], spec["workers"], crop_scale=spec["crop_scale"])
    args = SimpleNamespace(**spec["args"])
    return {"stages": project_stages, "dali": dali_stages}[name](data, spec["size"], args)
