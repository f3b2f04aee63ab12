"""(a) to (d) of `python -m project.bench`: the decode limit, the project's loader, torchvision's ImageFolder,
and the loader's peak memory, each on the same samples."""

from __future__ import annotations

import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torchvision.io import ImageReadMode, decode_image

from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.specs import resolve_shards
from project.data.workers import proc_stat, worker_context
from project.tasks.image.data import ImageShards
from project.tasks.image.decode import IMAGE_EXTENSIONS, decode_label, decode_sample
from project.tasks.image.transforms import build_transform, pixels

WDS_SHUFFLE = 1000  # the sample shuffle buffer webdataset's README shows: .shuffle(1000)
WDS_SHARDSHUFFLE = 100  # what webdataset turns shardshuffle=True into, as its README writes it


def subset_index(shards: list[Shard], samples: int, extra: dict, folder: Path, copies: int = 1) -> Path:
    """A shard index of the first shards holding at least `samples` samples, listed `copies` times over
    (a dataset `copies` times as large that uses no more disk), with the index keys `extra` (class names)."""
    chosen, total = [], 0
    for shard in shards:
        if total >= samples:
            break
        chosen.append(shard)
        total += shard.nsamples
    folder.mkdir(parents=True, exist_ok=True)
    return write_index(folder / INDEX_NAME, chosen * copies, name=folder.name, extra=extra)


def _decode_all(samples: list[dict], size: int) -> None:
    for sample in samples:
        image, _ = decode_sample(sample, size)
        pixels(image)


class NaiveSample:
    """The unfused path: torchvision's decode (its JPEG operator) at full size, then the preset's v2
    transform, per sample (picklable: the peers' workers run it too, benchmarks/peer_loaders.py)."""

    def __init__(self, augment: str, size: int) -> None:
        self.transform = build_transform(augment, size, train=True)

    def image(self, data: bytes | torch.Tensor) -> torch.Tensor:
        """Encoded image bytes (or a uint8 tensor of them) to the augmented uint8 CHW RGB image."""
        encoded = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return self.transform(decode_image(encoded, mode=ImageReadMode.RGB))

    def __call__(self, sample: dict) -> tuple[torch.Tensor, int]:
        extension = next(e for e in IMAGE_EXTENSIONS if e in sample)
        return self.image(sample[extension]), decode_label(sample)


def _work_all(samples: list[dict], augment: str, size: int) -> None:
    torch.set_num_threads(1)  # as in a DataLoader worker
    work = NaiveSample(augment, size)
    for sample in samples:
        work(sample)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited (workers, once joined)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own_cpu_seconds() + children.ru_utime + children.ru_stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def forked_rate(target: Callable[..., None], samples: list[dict], processes: int, *args: object) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample) of `target(share, *args)` run by `processes` forked processes,
    each with an equal share of `samples`."""
    context = multiprocessing.get_context("fork")  # the cheapest start: this bounds the loader from above
    start, cpu = time.perf_counter(), cpu_seconds()
    jobs = [context.Process(target=target, args=(samples[i::processes], *args)) for i in range(processes)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    if any(job.exitcode for job in jobs):
        raise RuntimeError(f"a measuring process ({target.__name__}) failed")
    return len(samples) / (time.perf_counter() - start), (cpu_seconds() - cpu) / len(samples) * 1e6


def decode_rate(samples: list[dict], processes: int, size: int) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample) of bare decoding by `processes` forked processes."""
    return forked_rate(_decode_all, samples, processes, size)


def work_limit_rate(samples: list[dict], processes: int, augment: str, size: int) -> float:
    """Samples/s of the naive work (`NaiveSample`: decode plus the same augmentation, unfused) by `processes`
    forked processes, each with an equal share: the limit of a loader that runs torchvision's path."""
    return forked_rate(_work_all, samples, processes, augment, size)[0]


# (b) the project's loader, (c) ImageFolder, (f) webdataset ----------------------------------------------------------


def make_datamodule(index: Path, workers: int, settings: dict) -> ImageShards:
    return ImageShards(root=None, train=str(index), num_workers=workers, pin_memory=False, **settings)


def loader_rate(
    index: Path, workers: int, settings: dict, labels: list | None = None, split: dict | None = None
) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample in the main process and the workers) of one training
    epoch of the project's loader, from iter() to its last batch; the labels in training order go to
    `labels` when given, and the main process's and the workers' shares of the CPU time to `split`.

    The workers start from the forkserver, so they are not this process's children and RUSAGE_CHILDREN
    never sees them: their CPU time is read from /proc as each batch arrives, the last value of each kept (a
    worker that has finished may exit before the last batch arrives from another).
    """
    loader = make_datamodule(index, workers, settings).train_dataloader()
    start, own, count, seen = time.perf_counter(), own_cpu_seconds(), 0, {}
    iterator = iter(loader)
    for batch in iterator:
        count += len(batch)
        if labels is not None:
            labels.extend(batch.label.tolist())
        seen.update(workers_cpu_seconds(iterator))
    rate, main_cpu, worker_cpu = count / (time.perf_counter() - start), own_cpu_seconds() - own, sum(seen.values())
    if split is not None:
        split.update(main=main_cpu / count * 1e6, workers=worker_cpu / count * 1e6)
    return rate, (main_cpu + worker_cpu) / count * 1e6


def workers_cpu_seconds(iterator: object) -> dict[int, float]:
    """CPU seconds so far of each live worker process of a DataLoader iterator, by pid (Linux /proc; none
    elsewhere)."""
    seconds = {}
    for worker in getattr(iterator, "_workers", []):
        try:
            fields = proc_stat(worker.pid)
        except OSError:
            continue
        seconds[worker.pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return seconds


def write_image_folder(samples: list[dict], folder: Path) -> Path:
    """The samples' images as files in an ImageFolder tree, folder/<label>/<key>.<extension>."""
    for sample in samples:
        extension = next(e for e in IMAGE_EXTENSIONS if e in sample)
        label_folder = folder / f"{decode_label(sample):05d}"
        label_folder.mkdir(parents=True, exist_ok=True)
        (label_folder / f"{sample['__key__'].replace('/', '_')}.{extension}").write_bytes(sample[extension])
    return folder


def imagefolder_rate(folder: Path, workers: int, settings: dict) -> float:
    """Samples/s of one shuffled epoch of torchvision's ImageFolder through a DataLoader."""
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    transform = v2.Compose([v2.PILToTensor(), build_transform(settings["augment"], settings["image_size"], True)])
    dataset = ImageFolder(str(folder), transform=transform)
    loader = DataLoader(dataset, batch_size=settings["batch_size"], shuffle=True, num_workers=workers)
    start, count = time.perf_counter(), 0
    for _, labels in loader:
        count += len(labels)
    return count / (time.perf_counter() - start)


def webdataset_pipeline(urls: list[str], work: Callable[[dict], object], batch_size: int, workers: int) -> Any:
    """webdataset's own pipeline as its README builds it: WebDataset(urls, shardshuffle=100).shuffle(1000),
    `work` mapped over the samples, .batched(B) in the workers, and WebLoader(batch_size=None)."""
    import webdataset as wds

    dataset = wds.WebDataset(urls, shardshuffle=WDS_SHARDSHUFFLE, empty_check=False).shuffle(WDS_SHUFFLE)
    return wds.WebLoader(dataset.map(work).batched(batch_size), batch_size=None, num_workers=workers)


def webdataset_rate(index: Path, workers: int, settings: dict) -> float:
    """Samples/s of one epoch of `webdataset_pipeline` on the same shards, running the naive work per sample
    (benchmarks/peers.py adds litdata and mosaicml-streaming)."""
    urls = [shard.url for shard in resolve_shards(str(index)).shards]
    work = NaiveSample(settings["augment"], settings["image_size"])
    start, count = time.perf_counter(), 0
    for _, labels in webdataset_pipeline(urls, work, settings["batch_size"], workers):
        count += len(labels)
    return count / (time.perf_counter() - start)


# (d) peak memory ------------------------------------------------------------------------------------


def _peak_rss_child(index: str, workers: int, settings: dict, results: multiprocessing.Queue) -> None:
    # fork: the workers must be this process's children to count in RUSAGE_CHILDREN; it has no threads
    for _ in make_datamodule(Path(index), workers, {**settings, "worker_start": "fork"}).train_dataloader():
        pass
    kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports kB
    if workers:  # the workers have exited: their peaks are in RUSAGE_CHILDREN (the largest one's)
        kilobytes += workers * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    results.put(kilobytes / 1024)


def peak_rss_mb(indexes: list[Path], workers: int, settings: dict) -> list[float]:
    """Peak RSS in MB of one epoch of the loader over each index, each in a fresh process.

    The processes fork from the DataLoader workers' forkserver, which has imported the data pipeline and
    nothing else, so they start alike and inherit none of this process's memory (spawning each would
    import torch each time).
    """
    context = worker_context("forkserver")
    results = context.Queue()
    peaks = []
    for index in indexes:
        child = context.Process(target=_peak_rss_child, args=(str(index), workers, settings, results))
        child.start()
        peaks.append(results.get())
        child.join()
    return peaks
