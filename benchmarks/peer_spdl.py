"""SPDL (Meta's "Scalable and Performant Data Loading", `pip install spdl`) as a peer of `benchmarks/peers.py`,
set up as its documentation shows: one process, a `spdl.pipeline.PipelineBuilder` pipeline whose stages run
on a shared thread pool, with the decoding in `spdl.io` (FFmpeg), which releases the GIL.

    shard paths (shuffled) -> read a shard, split it with spdl.io.iter_tarfile  (a thread)
                           -> a shuffle buffer -> aggregate(batch size)
                           -> decode the batch: per image, demux_image + decode_packets with an FFmpeg filter
                              (crop, scale to the trained size, flip, RGB) then convert_frames   (N threads)
                           -> sink -> (images uint8 [B, 3, S, S], labels int64 [B], keys)

The augmentation is the `light` preset's rule, the one every peer gets: a RandomResizedCrop box (70-100% of
the area, aspect 3/4-4/3, torchvision's rule as `project.tasks.image.crops.CropFlip.box` draws it) and a
horizontal flip with p=0.5, here as FFmpeg filters applied while decoding, before the RGB conversion: SPDL's
"Data Augmentation with Filters" (docs: io/filtering). Pipeline shape: its image_dataloading example
(`.aggregate(batch_size).pipe(batch_decode, concurrency=num_threads)`, `build(num_threads=...)`).

`workers` is the pipeline's thread count (`build(num_threads=N)`, the decode stage's concurrency N): SPDL has
no worker processes. The shuffle is webdataset's and the project's kind: shards in a random order, then a
buffer of `shuffle_buffer` samples drawn from at random (SPDL ships no shuffle stage for streamed shards).

`spdl.io` loads FFmpeg's libraries at its first call; without them (Debian: libavutil57 libavcodec59
libavformat59 libavfilter8 libswscale6 libavdevice59) `SpdlMissing` says so in one line.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import spdl.io
import torch
from spdl.pipeline import Pipeline, PipelineBuilder
from spdl.pipeline.defs import Aggregator
from webdataset.tariterators import base_plus_ext

from project.data.specs import resolve_shards
from project.tasks.image.crops import DRAWS, CropFlip
from project.tasks.image.transforms import build_transform

FFMPEG_PACKAGES = "libavutil57 libavcodec59 libavformat59 libavfilter8 libswscale6 libavdevice59"


class SpdlMissing(RuntimeError):
    """FFmpeg's libraries, which spdl.io loads at its first call, are not installed."""


def require_ffmpeg() -> None:
    """Decode one tiny JPEG with spdl.io, or raise `SpdlMissing` with one line."""
    from torchvision.io import encode_jpeg

    tiny = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8)).numpy().tobytes()
    try:
        spdl.io.decode_packets(spdl.io.demux_image(tiny))
    except (RuntimeError, OSError, ImportError):  # spdl's own message lists every FFmpeg version it tried
        raise SpdlMissing(
            f"not installed: FFmpeg's libraries are missing (apt-get install {FFMPEG_PACKAGES})"
        ) from None


def read_shard(path: str) -> list[tuple[str, bytes, int]]:
    """One shard's samples (key, JPEG bytes, label), its bytes parsed by spdl.io.iter_tarfile."""
    with open(path, "rb") as stream:
        data = stream.read()
    members: dict[str, dict[str, memoryview]] = {}
    for name, contents in spdl.io.iter_tarfile(data):
        key, extension = base_plus_ext(name)  # webdataset's key rule, as the project's reader groups members
        if key is not None:
            members.setdefault(key, {})[extension] = contents
    return [(key, bytes(parts["jpg"]), int(bytes(parts["cls"]))) for key, parts in members.items()]


class ShuffleBuffer(Aggregator):
    """An aggregator holding `size` samples: each new one replaces one drawn at random, which goes on; at the
    end of the stream the rest goes on in a random order."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.rng, self.buffer = max(1, size), random.Random(seed), []

    def accumulate(self, item: object) -> list | None:
        if len(self.buffer) < self.size:
            self.buffer.append(item)
            return None
        index = self.rng.randrange(self.size)
        out, self.buffer[index] = self.buffer[index], item
        return [out]

    def flush(self) -> list | None:
        rest, self.buffer = self.buffer, []
        self.rng.shuffle(rest)
        return rest or None


class DecodeBatch:
    """A batch of (key, JPEG bytes, label) to (uint8 [B, 3, S, S], int64 labels [B], keys): each image decoded
    by FFmpeg with its crop, scale and flip as a filter, the batch made by spdl.io.convert_frames."""

    def __init__(self, size: int, seed: int, crop_scale: float | None = None) -> None:
        crop, _ = CropFlip.split(build_transform("light", size, train=True))
        if crop_scale is not None:  # benchmarks/peers.py --crop_scale: the same rule from that share of the area
            crop = CropFlip(size, (crop_scale, 1.0), crop.ratio, crop.flip)
        self.crop, self.size, self.seed = crop, size, seed

    def filters(self, packets: list, generator: np.random.Generator) -> list[str]:
        draws = generator.random((len(packets), DRAWS)).tolist()
        boxes = [self.crop.box(p.height, p.width, row) for p, row in zip(packets, draws, strict=True)]
        flips = [row[-1] < self.crop.flip for row in draws]
        return [
            spdl.io.get_video_filter_desc(
                filter_desc=f"crop=w={w}:h={h}:x={left}:y={top},scale=w={self.size}:h={self.size}:flags=bilinear"
                + (",hflip" if flip else ""),
                pix_fmt="rgb24",
            )
            for (top, left, h, w), flip in zip(boxes, flips, strict=True)
        ]

    def __call__(self, batch: list[tuple[str, bytes, int]]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        keys = [key for key, _, _ in batch]
        generator = np.random.default_rng([self.seed, zlib.crc32(keys[0].encode())])  # whatever thread decodes it
        packets = [spdl.io.demux_image(data) for _, data, _ in batch]
        frames = [
            spdl.io.decode_packets(packet, filter_desc=desc)
            for packet, desc in zip(packets, self.filters(packets, generator), strict=True)
        ]
        images = spdl.io.to_torch(spdl.io.convert_frames(frames)).permute(0, 3, 1, 2)  # NHWC buffer, NCHW view
        return images, torch.tensor([label for _, _, label in batch]), keys


def spdl_batches(
    shards: Path,
    size: int,
    workers: int,
    batch_size: int,
    *,
    shuffle_buffer: int = 1000,
    seed: int = 0,
    crop_scale: float | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """One shuffled epoch of `shards` through an SPDL pipeline of `workers` threads (see the module); crops
    from `crop_scale` of the area to 1 where given (else the `light` preset's)."""
    require_ffmpeg()
    urls = [shard.url for shard in resolve_shards(str(shards)).shards]
    random.Random(seed).shuffle(urls)
    threads = max(1, workers)
    pipeline = (
        PipelineBuilder()
        .add_source(urls)
        .pipe(read_shard, concurrency=1)
        .disaggregate()
        .aggregate(ShuffleBuffer(shuffle_buffer, seed))
        .disaggregate()
        .aggregate(batch_size)
        .pipe(DecodeBatch(size, seed, crop_scale), concurrency=threads)
        .add_sink(threads * 2)
        .build(num_threads=threads)
    )
    return run(pipeline)


def run(pipeline: Pipeline) -> Iterator:
    """The pipeline's batches, started at the first and stopped after the last (or when the caller stops)."""
    with pipeline.auto_stop():
        yield from pipeline.get_iterator(timeout=600)
