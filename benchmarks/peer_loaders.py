"""The loaders `benchmarks/peers.py` compares, each built as its own documentation shows, and one epoch of any
of them measured: samples/s, CPU time of all its processes, peak RSS, and the order of the samples' keys.

Every peer decodes with torchvision's `decode_image` (its libjpeg-turbo JPEG operator, the best public decode
path) and augments with the project's `light` preset (`build_transform("light", size, train=True)`:
RandomResizedCrop with scale 0.7 to 1, then a horizontal flip, torchvision v2), one sample at a time, in its
DataLoader workers: the bench's naive path, `project.bench.images.NaiveSample`. With `crop_scale` (0.08:
ImageNet's usual crops), every loader crops from that share of the area to 1 instead (`crop_transform`). The
project's loader runs as `project.train` configures it with data.augment=light: the same crop and flip rule, through
its own decode and batched crop path (project/tasks/image/decode.py and crops.py).

A peer that is not installed raises `PeerMissing`, which the harness reports in its row.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torchvision
from peer_names import LIGHT_SCALE, PEER_PACKAGES, SHARD_READERS
from peer_processes import Processes
from torchvision.transforms import v2

from project.data.samples import read_samples
from project.data.specs import resolve_shards


class PeerMissing(RuntimeError):
    """A peer library that is not installed: its row says `note` ("not installed" unless told more)."""

    def __init__(self, message: str, note: str = "not installed") -> None:
        super().__init__(message)
        self.note = note


def peer_module(loader: str) -> object:
    """The peer's package, imported now (only when its row runs)."""
    try:
        return importlib.import_module(PEER_PACKAGES[loader])
    except ImportError as error:
        raise PeerMissing(f"{loader}: not installed ({error})") from None


def crop_transform(size: int, crop_scale: float = LIGHT_SCALE) -> v2.Compose:
    """The `light` preset's crop and flip with crops of `crop_scale` to 1 of the area (a v2 pipeline, which
    the project's data.augment takes as it is)."""
    return v2.Compose([v2.RandomResizedCrop(size, scale=(crop_scale, 1.0), antialias=True), v2.RandomHorizontalFlip()])


def Augment(  # noqa: N802 - used as a class
    size: int, crop_scale: float = LIGHT_SCALE
) -> Callable[[bytes | torch.Tensor], torch.Tensor]:
    """Decode and augment one image, the bench's naive path with the `light` preset, or its crop and flip from
    `crop_scale` of the area (picklable: it travels to the workers)."""
    from project.bench.images import NaiveSample  # here: it imports Lightning, which the project's workers need not

    sample = NaiveSample("light", size)
    if crop_scale != LIGHT_SCALE:
        sample.transform = crop_transform(size, crop_scale)
    return sample.image


# -- each loader, as its own documentation builds it ---------------------------------------------------


def project_loader(
    shards: Path,
    *,
    size: int,
    workers: int,
    batch_size: int,
    shuffle_buffer: int,
    seed: int,
    mix_shards: int = 32,
    threads: bool = False,
    crop_scale: float = LIGHT_SCALE,
):
    """This project's training loader: ImageShards with data.augment=light, as `project.train` builds it;
    `threads`: no worker process, `workers` decode threads in this one (data.num_workers 0, data.decode_threads)."""
    from project.data.workers import warm_forkserver
    from project.tasks import WORKER_MODULES
    from project.tasks.image.data import ImageShards

    if workers and not threads:
        warm_forkserver(WORKER_MODULES)  # its one-time start (imports) is the training process's, not the epoch's
    module = ImageShards(
        root=None,
        train=str(shards),
        num_workers=0 if threads else workers,
        decode_threads=max(1, workers) if threads else 1,
        batch_size=batch_size,
        image_size=size,
        augment="light" if crop_scale == LIGHT_SCALE else crop_transform(size, crop_scale),
        shuffle_buffer=shuffle_buffer,
        mix_shards=mix_shards,
        seed=seed,
        pin_memory=False,
    )
    return module.train_dataloader(), lambda batch: batch.keys


class WdsSample:
    """webdataset's map step: a sample dict to (image, label, key)."""

    def __init__(self, size: int, crop_scale: float = LIGHT_SCALE) -> None:
        self.augment = Augment(size, crop_scale)

    def __call__(self, sample: dict) -> tuple:
        return self.augment(sample["jpg"]), int(sample["cls"]), sample["__key__"]


def webdataset_loader(
    shards: Path, *, size: int, workers: int, batch_size: int, crop_scale: float = LIGHT_SCALE, **_: object
):
    """webdataset's README: WebDataset(urls, shardshuffle=100).shuffle(1000), decode and map, .batched(B) in
    the workers, and WebLoader(dataset, batch_size=None, num_workers=N)."""
    peer_module("webdataset")
    urls = [shard.url for shard in resolve_shards(str(shards)).shards]
    from project.bench.images import webdataset_pipeline

    return webdataset_pipeline(urls, WdsSample(size, crop_scale), batch_size, workers), lambda batch: batch[2]


class LitSample:
    """litdata's `transform=`: an optimized item {key, jpg, cls} to (image, label, key)."""

    def __init__(self, size: int, crop_scale: float = LIGHT_SCALE) -> None:
        self.augment = Augment(size, crop_scale)

    def __call__(self, item: dict) -> tuple:
        return self.augment(item["jpg"]), item["cls"], item["key"]


def litdata_loader(
    cache: Path, *, size: int, workers: int, batch_size: int, crop_scale: float = LIGHT_SCALE, **_: object
):
    """litdata's README: StreamingDataset(optimized folder, shuffle=True) and StreamingDataLoader."""
    litdata = peer_module("litdata")
    dataset = litdata.StreamingDataset(str(cache / "litdata"), shuffle=True, transform=LitSample(size, crop_scale))
    loader = litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers)
    return loader, lambda batch: batch[2]


def mosaic_dataset_class() -> type:
    streaming = peer_module("mosaic")

    class MosaicImages(streaming.StreamingDataset):
        """mosaicml-streaming's documented pattern: subclass StreamingDataset and transform in __getitem__."""

        def __init__(self, size: int, crop_scale: float = LIGHT_SCALE, **kwargs: object) -> None:
            super().__init__(**kwargs)
            self.augment = Augment(size, crop_scale)

        def __getitem__(self, index: int) -> tuple:
            item = super().__getitem__(index)
            return self.augment(item["jpg"]), item["cls"], item["key"]

    return MosaicImages


def mosaic_loader(
    cache: Path, *, size: int, workers: int, batch_size: int, crop_scale: float = LIGHT_SCALE, **_: object
):
    """mosaicml-streaming: StreamingDataset(local=MDS folder, shuffle=True, batch_size=B), its default shuffle
    algorithm (py1e), in a torch DataLoader."""
    from torch.utils.data import DataLoader

    dataset = mosaic_dataset_class()(size, crop_scale, local=str(cache / "mosaic"), shuffle=True, batch_size=batch_size)
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers), lambda batch: batch[2]


def read_jpeg(path: str) -> torch.Tensor:
    return torchvision.io.read_file(path)


class KeyedImageFolder(torchvision.datasets.ImageFolder):
    """ImageFolder whose items also carry the sample's key: the file's path in its class folder without its
    extension (a key with a "/" is a file in a subfolder, which ImageFolder finds too)."""

    def __getitem__(self, index: int) -> tuple:
        image, label = super().__getitem__(index)
        path = Path(self.samples[index][0])
        return image, label, path.relative_to(Path(self.root) / self.classes[label]).as_posix().removesuffix(".jpg")


def imagefolder_loader(
    cache: Path, *, size: int, workers: int, batch_size: int, crop_scale: float = LIGHT_SCALE, **_: object
):
    """torchvision's ImageFolder (files read with read_file, decoded with decode_jpeg) and a shuffled DataLoader."""
    from torch.utils.data import DataLoader

    dataset = KeyedImageFolder(str(cache / "imagefolder"), loader=read_jpeg, transform=Augment(size, crop_scale))
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers), lambda batch: batch[2]


def spdl_loader(shards: Path, *, size: int, workers: int, batch_size: int, **options: object):
    """SPDL's pipeline of `workers` threads in this process (benchmarks/peer_spdl.py), on the tar shards;
    `options`: shuffle_buffer, seed, crop_scale."""
    peer_module("spdl")
    import peer_spdl  # only in the spdl row's process: the other rows' memory stays free of it

    try:
        batches = peer_spdl.spdl_batches(shards, size, workers, batch_size, **options)
    except peer_spdl.SpdlMissing as missing:
        raise PeerMissing(f"spdl: {missing}", note=str(missing)) from None
    return batches, lambda batch: batch[2]


def dali_loader(shards: Path, *, size: int, workers: int, batch_size: int, cache: Path, **options: object):
    """DALI's CPU pipeline of `workers` threads in this process (benchmarks/peer_dali.py), on the tar shards
    with its index files in cache/dali; `options`: shuffle_buffer, seed, crop_scale."""
    peer_module("dali")
    import peer_dali  # only in the dali row's process

    return peer_dali.dali_batches(shards, cache, size, workers, batch_size, **options), lambda batch: batch[2]


BUILDERS: dict[str, Callable] = {
    "project": project_loader,
    "project-threads": functools.partial(project_loader, threads=True),
    "webdataset": webdataset_loader,
    "litdata": litdata_loader,
    "mosaic": mosaic_loader,
    "imagefolder": imagefolder_loader,
    "spdl": spdl_loader,
    "dali": dali_loader,
}


# -- one epoch, measured ---------------------------------------------------------------------------------


def run_epoch(
    loader: str,
    *,
    shards: Path,
    cache: Path,
    size: int,
    workers: int,
    batch_size: int,
    shuffle_buffer: int = 1000,
    seed: int = 0,
    mix_shards: int | None = None,
    crop_scale: float = LIGHT_SCALE,
) -> dict:
    """One full shuffled epoch of `loader`: samples/s from iter() to the last batch, CPU microseconds per
    sample of all its processes, their peak summed RSS in MB, and the keys in the order they came.
    `mix_shards`: the project's data.mix_shards (None: its default); `crop_scale`: see the module."""
    where = shards if loader in SHARD_READERS else cache
    options = {"mix_shards": mix_shards} if mix_shards is not None else {}
    options.update(crop_scale=crop_scale, **({"cache": cache} if loader == "dali" else {}))
    batches, keys_of = BUILDERS[loader](
        where, size=size, workers=workers, batch_size=batch_size, shuffle_buffer=shuffle_buffer, seed=seed, **options
    )
    processes = Processes()
    keys: list[str] = []
    start = time.perf_counter()
    for batch in batches:
        keys.extend(keys_of(batch))
        processes.sample()
    seconds = time.perf_counter() - start
    del batches
    return {
        "loader": loader,
        "samples": len(keys),
        "seconds": seconds,
        "rate": len(keys) / seconds,
        "cpu_us": processes.cpu_seconds() / max(1, len(keys)) * 1e6,
        "peak_rss_mb": processes.peak_rss / 2**20,
        "peak_pss_mb": processes.peak_pss / 2**20,
        "keys": keys,
    }


def stored_samples(shards: Path) -> Iterable[dict]:
    """The set's samples in stored order (shards in index order)."""
    for shard in resolve_shards(str(shards)).shards:
        yield from read_samples(shard.url)
