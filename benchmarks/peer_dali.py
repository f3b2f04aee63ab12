"""NVIDIA DALI (`pip install nvidia-dali-cuda130`) as a peer of `benchmarks/peers.py`, CPU only
(`device_id=None`), set up as its documentation and its ResNet-50 example do: one process, a pipeline of C++
operators run by `num_threads` threads, batches handed to Python by `pipe.run()`.

    fn.readers.webdataset(the tar shards, DALI's own index files, ext jpg and cls, random_shuffle with a buffer)
      -> fn.decoders.image_random_crop  (libjpeg-turbo decodes only the crop's region: ROI decode)
      -> fn.resize to the trained size  (linear, antialiased when it shrinks, as torchvision's antialias=True)
      -> fn.flip with fn.random.coin_flip(0.5)
      -> (images uint8 [B, 3, S, S] (an NHWC buffer, NCHW view), labels int64 [B], keys)

The crop is the `light` preset's rule (70-100% of the area, aspect 3/4-4/3, 10 tries), or `crop_scale` to 1
(0.08: ImageNet's usual crops). `workers` is the pipeline's thread count: DALI has no worker processes. The
shuffle: shards in a random order, then the reader's buffer of `shuffle_buffer` samples (`initial_fill`), as
the other peers shuffle; one epoch is the reader's `epoch_size` samples (`pad_last_batch`, the padding dropped).

Settings, from DALI's docs ("Performance Tuning"; Pipeline and reader arguments) and tried on this machine
(benchmarks/README.md, "DALI"; `TRIED`): the older executor (`exec_dynamic=False`; DALI 2 uses the dynamic one
unless told otherwise) with each operator's `bytes_per_sample_hint`, which took the least CPU on both image
sizes here, and DALI's default `prefetch_queue_depth` of 2. The index files are written once by DALI's
`wds2idx` (its `IndexCreator`) under the set's `dali/` folder.

`stage_costs` times the pipeline cut after each stage (read; + decode; + resize; + flip), CPU µs a sample.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from nvidia.dali import fn, pipeline_def, types

from project.data.specs import resolve_shards

LIGHT_SCALE = 0.7  # the `light` preset's smallest crop area
RATIO = [3 / 4, 4 / 3]  # torchvision's RandomResizedCrop aspect ratios
TRIES = 10  # torchvision's tries for a box that fits
STAGES = ("read", "decode", "full-decode", "resize", "flip")  # shown as benchmarks/peer_tables.py's DALI_STAGES
# DALI's own defaults for the settings that bear on throughput; hints: each operator's bytes_per_sample_hint (its
# output's size: the largest image expected for the decoder, the trained size after it)
DEFAULTS = {"prefetch_queue_depth": 2, "exec_dynamic": True, "reader_prefetch": 1, "read_ahead": False, "hints": False}
DEFAULTS["mirror_by_cmn"] = False  # flip with fn.flip; True: fn.crop_mirror_normalize(mirror=coin), uint8 out
DEFAULTS["decoder"] = "cpu"  # "mixed": nvJPEG on a GPU, resize and flip there too (`gpu_batches`)
TRIED = {  # `python benchmarks/peer_dali.py`: each a change from DEFAULTS, measured against the others
    "DALI's defaults": {},
    "reader prefetch_queue_depth 2, read_ahead": {"reader_prefetch": 2, "read_ahead": True},
    "prefetch_queue_depth 4": {"prefetch_queue_depth": 4},
    "bytes_per_sample_hint": {"hints": True},
    "exec_dynamic=False (the older executor)": {"exec_dynamic": False},
    "exec_dynamic=False, bytes_per_sample_hint": {"exec_dynamic": False, "hints": True},
    "flip by crop_mirror_normalize (uint8, HWC)": {"mirror_by_cmn": True},
}
BEST = {**DEFAULTS, **TRIED["exec_dynamic=False, bytes_per_sample_hint"]}  # the least CPU (README: "DALI")
DONE_MARK = ".complete"  # as benchmarks/peer_data.py marks a written format
STORED_MAX = 4096 * 4096 * 3  # the decoder's hint: bytes of the largest image it is expected to meet
SOURCE = re.compile(r"(.*?):\d+:(.*)", re.DOTALL)  # DALI's source_info: "<tar path>:<offset>:<member name>"


def local_shards(shards: Path) -> list[str]:
    """The set's tar shards (DALI's reader opens local files only)."""
    paths = [shard.url for shard in resolve_shards(str(shards)).shards]
    if missing := [path for path in paths if not Path(path).is_file()]:
        raise FileNotFoundError(f"DALI reads local tar files; not one: {missing[0]}")
    return paths


def index_of(path: str, folder: Path) -> Path:
    return folder / f"{Path(path).stem}.idx"


def write_indexes(shards: Path, folder: Path) -> None:
    """DALI's index of each shard, as its `wds2idx` tool writes it, into `folder`."""
    from wds2idx import IndexCreator

    folder.mkdir(parents=True, exist_ok=True)
    for path in local_shards(shards):
        with IndexCreator(path, str(index_of(path, folder)), verbose=False) as creator:
            creator.create_index()


@pipeline_def
def train_pipeline(*, paths, indexes, size, crop_scale, shuffle_buffer, settings, stage="flip"):
    """The training pipeline (see the module), cut after `stage` (one of STAGES)."""
    decoded, trained = ([STORED_MAX], [size * size * 3]) if settings["hints"] else ([0], [0])
    jpegs, labels = fn.readers.webdataset(
        paths=paths,
        index_paths=indexes,
        ext=["jpg", "cls"],
        missing_component_behavior="skip",
        random_shuffle=True,
        initial_fill=shuffle_buffer,
        pad_last_batch=True,
        prefetch_queue_depth=settings["reader_prefetch"],
        read_ahead=settings["read_ahead"],
        name="reader",
    )
    if stage == "read":
        return jpegs, labels
    if stage == "full-decode":
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), labels
    gpu = {"device_memory_padding": 211025920, "host_memory_padding": 140544512}  # DALI's ResNet-50 example's
    images = fn.decoders.image_random_crop(
        jpegs,
        device=settings["decoder"],
        **(gpu if settings["decoder"] == "mixed" else {}),
        output_type=types.RGB,
        random_area=[crop_scale, 1.0],
        random_aspect_ratio=RATIO,
        num_attempts=TRIES,
        bytes_per_sample_hint=decoded,
    )
    if stage == "decode":
        return images, labels
    images = fn.resize(images, resize_x=size, resize_y=size, bytes_per_sample_hint=trained)
    if stage == "resize":
        return images, labels
    coin = fn.random.coin_flip(probability=0.5)
    if settings["mirror_by_cmn"]:
        return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC", mirror=coin), labels
    return fn.flip(images, horizontal=coin, bytes_per_sample_hint=trained), labels


def build(shards: Path, cache: Path, size: int, workers: int, batch_size: int, **options: object):
    """The pipeline over `shards` (their index files in cache/dali), built: options are shuffle_buffer, seed,
    crop_scale, stage and settings (BEST's keys)."""
    paths = local_shards(shards)
    random.Random(options.get("seed", 0)).shuffle(paths)  # the shards' order, as the other peers shuffle it
    settings = {**BEST, **(options.get("settings") or {})}
    pipe = train_pipeline(
        paths=paths,
        indexes=[str(index_of(path, cache / "dali")) for path in paths],
        size=size,
        crop_scale=options.get("crop_scale", LIGHT_SCALE),
        shuffle_buffer=options.get("shuffle_buffer", 1000),
        settings=settings,
        stage=options.get("stage", "flip"),
        batch_size=batch_size,
        num_threads=max(1, workers),
        device_id=torch.cuda.current_device() if settings["decoder"] == "mixed" else None,
        seed=options.get("seed", 0),
        prefetch_queue_depth=settings["prefetch_queue_depth"],
        exec_dynamic=settings["exec_dynamic"],
    )
    pipe.build()
    return pipe


def key_of(source: str) -> str:
    """The sample's key from DALI's source_info: its member name without the extension (webdataset's rule)."""
    name = SOURCE.match(source).group(2)
    dot = name.find(".", name.rfind("/") + 1)
    return name[:dot] if dot > 0 else name


def dali_batches(shards: Path, cache: Path, size: int, workers: int, batch_size: int, **options: object) -> Iterator:
    """One shuffled epoch through the pipeline (see `build` for the options): (uint8 [B, 3, S, S], int64 [B],
    keys) per batch. The pipeline is built now (as SPDL's is, before its epoch); it runs from the first batch."""
    return epoch(build(shards, cache, size, workers, batch_size, **options))


def epoch(pipe: object) -> Iterator:
    left = pipe.reader_meta("reader")["epoch_size"]
    while left > 0:
        images, labels = pipe.run()
        take = min(len(images), left)  # the last batch's padding is the next epoch's
        left -= take
        pixels = torch.from_numpy(images.as_array()[:take]).permute(0, 3, 1, 2)  # NHWC buffer, NCHW view
        numbers = torch.tensor([int(bytes(labels[i])) for i in range(take)])
        yield pixels, numbers, [key_of(labels[i].source_info()) for i in range(take)]  # the reader's own


def stage_costs(shards: Path, cache: Path, size: int, workers: int, batch_size: int, **options: object) -> dict:
    """CPU µs a sample (all the process's threads) of one epoch of the pipeline cut after each of STAGES."""
    costs = {}
    for stage in STAGES:
        pipe = build(shards, cache, size, workers, batch_size, stage=stage, **options)
        total, done = pipe.reader_meta("reader")["epoch_size"], 0
        start = time.process_time()
        while done < total:
            done += len(pipe.run()[0])
        costs[stage] = (time.process_time() - start) / total * 1e6
        del pipe
    return costs


def epoch_cost(shards: Path, cache: Path, size: int, workers: int, batch_size: int, **options: object) -> dict:
    """One epoch of `dali_batches` in this process: samples/s and CPU µs a sample (all its threads)."""
    batches = dali_batches(shards, cache, size, workers, batch_size, **options)
    wall, cpu, count = time.perf_counter(), time.process_time(), 0
    for _, labels, _ in batches:
        count += len(labels)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"rate": count / wall, "cpu_us": cpu / count * 1e6}


def sweep(
    *,
    photos: Path | None = None,
    crop_scale: float = LIGHT_SCALE,
    workers: int = 2,
    batch_size: int = 128,
    repeats: int = 3,
) -> dict:
    """DALI's pipeline with each of the settings tried (TRIED), interleaved, medians of `repeats` epochs.

    Args:
        photos: the photographs benchmarks/photos.py wrote to DIR (trained at 224); else the 32 px demo.
        crop_scale: the smallest crop, a share of the image's area (0.7: light's; 0.08: ImageNet's).
        workers: the pipeline's threads.
        batch_size: samples per batch.
        repeats: epochs per setting.
    """
    import statistics

    from peer_data import demo_set, ensure_format, photos_in

    data, size = (photos_in(photos), 224) if photos else (demo_set(), 32)
    ensure_format(data, "dali")
    runs: dict[str, list[dict]] = {name: [] for name in TRIED}
    for _ in range(repeats):
        for name, tried in TRIED.items():
            options = {"crop_scale": crop_scale, "settings": {**DEFAULTS, **tried}}
            runs[name].append(epoch_cost(data.shards, data.cache, size, workers, batch_size, **options))
    print(f"| DALI setting ({data.name}, crops {crop_scale:.0%}-100%) | samples/s | CPU µs/sample |\n|---|---|---|")
    for name, results in runs.items():
        rate, cpu = (statistics.median(r[key] for r in results) for key in ("rate", "cpu_us"))
        print(f"| {name} | {rate:,.0f} | {cpu:,.0f} |")
    return runs


def gpu_batches(shards: Path, cache: Path, size: int, workers: int, batch_size: int) -> Iterator:
    """(uint8 [B, 3, S, S] and int64 labels, on the GPU) epoch after epoch, from the pipeline with DALI's
    `mixed` decoder (nvJPEG: Huffman decoding on the `workers` CPU threads, the rest on the GPU; the hardware
    JPEG decoder where the GPU has one), resize and flip on the GPU, for benchmarks/gpu_bench.py.
    UNTESTED: written on a machine without a GPU; its CPU twin, `dali_batches`, is the tested path."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    if not (cache / "dali" / DONE_MARK).exists():
        write_indexes(shards, cache / "dali")
        (cache / "dali" / DONE_MARK).touch()
    pipe = build(shards, cache, size, workers, batch_size, settings={"decoder": "mixed"})
    stream = torch.cuda.current_stream()
    while True:
        images, labels = pipe.run()
        dense = images.as_tensor()
        pixels = torch.empty(dense.shape(), dtype=torch.uint8, device="cuda")
        feed_ndarray(dense, pixels, cuda_stream=stream)  # as DALI's PyTorch iterator copies its outputs
        numbers = torch.tensor([int(bytes(labels[i])) for i in range(len(labels))])
        yield pixels.permute(0, 3, 1, 2), numbers.to("cuda", non_blocking=True)  # NHWC buffer: channels_last


if __name__ == "__main__":
    from project.commands import run_command
    from project.errors import run_main

    run_main(lambda argv=None: run_command(sweep, "benchmarks/peer_dali.py", argv))
