"""Measure the input pipeline and the training loop side by side, in one run, on the same shards.

    python -m project.bench [--data DIR] [--workers N] [--json] [--repeats R] [--samples N] [--steps N]
                            [--image-size S] [--quick]

On the training split of DIR (the demo's by default, built if missing), with the data settings of
configs/default.yaml:

  (a) decode limit: bare decoding (image bytes to uint8 pixels, and the label) of the same encoded
      samples, held in memory, by N forked processes: what the loader could reach with nothing else to do;
  (b) the project's train loader (ShardDataModule, N workers), and the same with 1 and 2 workers;
  (c) torchvision's ImageFolder + DataLoader on the same images written out as files, same transform,
      same N workers;
  (d) the loader's peak memory over a dataset of S and of 8S samples (the same shards listed 8 times),
      each in a fresh process: the kernel's peak RSS (getrusage) of the main process plus N times that
      of the largest worker, an upper bound of their simultaneous total;
  (e) training samples/s of the template (the Lightning Trainer, ImageClassifier and ShardDataModule as
      `project.train` builds them) against a minimal hand-written PyTorch loop (forward, loss, backward,
      AdamW step) on the same model and the same batches, timed from the end of the first step; both
      with the intra-op threads the workers leave (cores - N, at least 1).

Each figure is the median of R repeats, run interleaved so that a busy machine slows all of them alike.
With --json the last line is one JSON object: every run's figure, the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

from project.bench_training import template_rate
from project.cli import share_cores_with_workers
from project.data.decode import IMAGE_EXTENSIONS, decode_sample
from project.data.pipeline import pixels, read_samples
from project.data.shards import INDEX_NAME, Shard, resolve_shards, write_index
from project.data.workers import proc_stat, warm_forkserver, worker_context
from project.errors import UserError, run_main

# the template run trains without validation, and LightningCLI sees this command's own arguments in sys.argv
warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")
warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")

RATIO_KEYS = (
    "loader_vs_decode",
    "loader_vs_imagefolder",
    "workers_2_vs_1",
    "rss_large_vs_small",
    "template_vs_hand_loop",
)


def data_settings() -> dict:
    """The data section of configs/default.yaml: batch size, image size, augmentation, shuffle buffer, seed."""
    from project.cli import DEFAULT_CONFIG

    data = yaml.safe_load(DEFAULT_CONFIG.read_text())["data"]
    keys = ("batch_size", "image_size", "augment", "shuffle_buffer", "seed")
    return {key: data[key] for key in keys if key in data}


def subset_index(shards: list[Shard], samples: int, classes: list[str] | None, folder: Path, copies: int = 1) -> Path:
    """A shard index of the first shards holding at least `samples` samples, listed `copies` times over
    (a dataset `copies` times as large that uses no more disk)."""
    chosen, total = [], 0
    for shard in shards:
        if total >= samples:
            break
        chosen.append(shard)
        total += shard.nsamples
    folder.mkdir(parents=True, exist_ok=True)
    return write_index(folder / INDEX_NAME, chosen * copies, classes, name=folder.name)


# (a) the decode limit -------------------------------------------------------------------------------


def _decode_all(samples: list[dict], size: int) -> None:
    for sample in samples:
        image, _ = decode_sample(sample, size)
        pixels(image)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited (workers, once joined)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own_cpu_seconds() + children.ru_utime + children.ru_stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def decode_rate(samples: list[dict], processes: int, size: int) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample) of bare decoding by `processes` forked processes, each
    with an equal share."""
    context = multiprocessing.get_context("fork")  # the cheapest start: this bounds the loader from above
    start, cpu = time.perf_counter(), cpu_seconds()
    workers = [context.Process(target=_decode_all, args=(samples[i::processes], size)) for i in range(processes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if any(worker.exitcode for worker in workers):
        raise RuntimeError("a decoding process failed")
    return len(samples) / (time.perf_counter() - start), (cpu_seconds() - cpu) / len(samples) * 1e6


# (b) the project's loader, (c) ImageFolder ----------------------------------------------------------


def make_datamodule(index: Path, workers: int, settings: dict):  # noqa: ANN201
    from project.data.datamodule import ShardDataModule

    return ShardDataModule(root=None, train=str(index), num_workers=workers, pin_memory=False, **settings)


def loader_rate(index: Path, workers: int, settings: dict) -> tuple[float, float]:
    """(samples/s, CPU microseconds per sample in the main process and the workers) of one training
    epoch of the project's loader, from iter() to its last batch.

    The workers start from the forkserver, so they are not this process's children and RUSAGE_CHILDREN
    never sees them: their CPU time is read from /proc as the last batch arrives, when they are done.
    """
    loader = make_datamodule(index, workers, settings).train_dataloader()
    batches = len(loader.dataset)
    start, own, count, worker_cpu = time.perf_counter(), own_cpu_seconds(), 0, 0.0
    iterator = iter(loader)
    for number, batch in enumerate(iterator, 1):
        count += len(batch["label"])
        if number == batches:
            worker_cpu = workers_cpu_seconds(iterator)
    rate = count / (time.perf_counter() - start)
    return rate, (own_cpu_seconds() - own + worker_cpu) / count * 1e6


def workers_cpu_seconds(iterator: object) -> float:
    """CPU seconds so far of a DataLoader iterator's worker processes (Linux /proc; 0 elsewhere)."""
    total = 0.0
    for worker in getattr(iterator, "_workers", []):
        try:
            fields = proc_stat(worker.pid)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def write_image_folder(samples: list[dict], folder: Path) -> Path:
    """The samples' images as files in an ImageFolder tree, folder/<label>/<key>.<extension>."""
    from project.data.decode import decode_label

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

    from project.data.transforms import build_transform

    transform = v2.Compose([v2.PILToTensor(), build_transform(settings["augment"], settings["image_size"], True)])
    dataset = ImageFolder(str(folder), transform=transform)
    loader = DataLoader(dataset, batch_size=settings["batch_size"], shuffle=True, num_workers=workers)
    start, count = time.perf_counter(), 0
    for _, labels in loader:
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


# (e) training: the template against a hand-written loop, in project/bench_training.py


# the run --------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, scratch: Path) -> dict:
    """Every figure of the benchmark: {name: [one value per repeat]}, plus the settings used."""
    settings = data_settings()
    if args.image_size is not None:
        settings["image_size"] = args.image_size
    train = resolve_shards(str(Path(args.data) / "train"))
    index = subset_index(train.shards, args.samples, train.classes, scratch / "train")
    samples = [sample for shard in resolve_shards(str(index)).shards for sample in read_samples(shard.url)]
    folder = write_image_folder(samples, scratch / "imagefolder")
    workers, size = args.workers, settings["image_size"]
    names = ("decode", "decode_cpu_us", "loader", "loader_cpu_us", "loader_1", "loader_2", "imagefolder")
    runs: dict[str, list[float]] = {name: [] for name in names}
    warm_forkserver()  # its one-time start (importing the pipeline) is not part of any epoch
    for _ in range(args.repeats):
        for name, (rate, cpu) in (
            ("decode", decode_rate(samples, max(1, workers), size)),
            ("loader", loader_rate(index, workers, settings)),
        ):
            runs[name].append(rate)
            runs[f"{name}_cpu_us"].append(cpu)
        runs["loader_1"].append(loader_rate(index, 1, settings)[0] if workers != 1 else runs["loader"][-1])
        runs["loader_2"].append(loader_rate(index, 2, settings)[0] if workers != 2 else runs["loader"][-1])
        runs["imagefolder"].append(imagefolder_rate(folder, workers, settings))
    rss_samples = max(1, args.samples // 4)
    small = subset_index(train.shards, rss_samples, train.classes, scratch / "rss-small")
    large = subset_index(train.shards, rss_samples, train.classes, scratch / "rss-large", copies=8)
    small_mb, large_mb = peak_rss_mb([small, large], workers, settings)
    runs["rss_small_mb"], runs["rss_large_mb"] = [small_mb], [large_mb]
    runs["template"], runs["hand_loop"] = [], []
    threads = torch.get_num_threads()
    share_cores_with_workers(workers)  # as project.train does on a CPU; the hand loop runs with the same
    try:
        for repeat in range(args.repeats):
            logs = scratch / f"logs{repeat}"
            template, hand_loop = template_rate(args.data, index, workers, args.steps, logs, size)
            runs["template"].append(template)
            runs["hand_loop"].append(hand_loop())
        training_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    return {
        "data": str(args.data),
        "workers": workers,
        "training_threads": training_threads,
        "repeats": args.repeats,
        "samples": len(samples),
        "rss_samples": [resolve_shards(str(small)).nsamples, resolve_shards(str(large)).nsamples],
        "steps": args.steps,
        "settings": settings,
        "runs": runs,
    }


def summarize(result: dict) -> dict:
    """Add the medians and the ratios to a `measure` result."""
    medians = {name: statistics.median(values) for name, values in result["runs"].items()}
    result["medians"] = medians
    result["ratios"] = {
        "loader_vs_decode": medians["loader"] / medians["decode"],
        "loader_vs_imagefolder": medians["loader"] / medians["imagefolder"],
        "workers_2_vs_1": medians["loader_2"] / medians["loader_1"],
        "rss_large_vs_small": medians["rss_large_mb"] / medians["rss_small_mb"],
        "template_vs_hand_loop": medians["template"] / medians["hand_loop"],
    }
    return result


def table(result: dict) -> str:
    """The figures and ratios as a Markdown table."""
    m, r, n = result["medians"], result["ratios"], result["workers"]
    small, large = result["rss_samples"]
    rows = [
        ("(a) decode limit: bare decoding", f"{n} processes", f"{m['decode']:,.0f} samples/s"),
        ("    CPU time per sample, all processes", "", f"{m['decode_cpu_us']:,.0f} µs"),
        ("(b) project train loader", f"{n} workers", f"{m['loader']:,.0f} samples/s"),
        ("    CPU time per sample, all processes", "", f"{m['loader_cpu_us']:,.0f} µs"),
        ("    project train loader", "1 worker", f"{m['loader_1']:,.0f} samples/s"),
        ("    project train loader", "2 workers", f"{m['loader_2']:,.0f} samples/s"),
        ("(c) ImageFolder + DataLoader", f"{n} workers", f"{m['imagefolder']:,.0f} samples/s"),
        ("(d) loader peak RSS", f"{small:,} samples", f"{m['rss_small_mb']:,.0f} MB"),
        ("    loader peak RSS", f"{large:,} samples", f"{m['rss_large_mb']:,.0f} MB"),
        ("(e) template training (Lightning)", f"{n} workers", f"{m['template']:,.0f} samples/s"),
        ("    hand-written PyTorch loop", f"{n} workers", f"{m['hand_loop']:,.0f} samples/s"),
    ]
    rows += [(f"ratio {key}", "", f"{r[key]:.2f}") for key in RATIO_KEYS]
    lines = ["| measure | setting | median |", "|---|---|---|"]
    lines += [f"| {what} | {setting} | {value} |" for what, setting, value in rows]
    settings = result["settings"]
    lines.append(
        f"\n{result['samples']:,} samples of {result['data']}, batch {settings['batch_size']}, "
        f"image size {settings['image_size']}, augment {settings['augment']}; "
        f"medians of {result['repeats']} repeats; training over {result['steps']} steps "
        f"with {result['training_threads']} intra-op thread(s)."
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m project.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="data/demo", help="a folder with a train/ split (default: the demo)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers and decoding processes")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON: figures and ratios")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each measurement (medians)")
    parser.add_argument("--samples", type=int, default=20000, help="training samples the loaders read")
    parser.add_argument("--steps", type=int, default=60, help="training steps of (e)")
    parser.add_argument("--image-size", type=int, default=None, help="training image size (default: the config's)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 512 samples, 6 steps: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.samples, args.steps = 1, min(args.samples, 512), min(args.steps, 6)
    if args.workers < 0 or args.repeats < 1 or args.samples < 1 or args.steps < 2:
        raise UserError("--workers must be >= 0, --repeats and --samples >= 1, --steps >= 2")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if Path(args.data).resolve() == Path("data/demo").resolve():
        from project.cli import DEMO_ROOT, ensure_demo

        ensure_demo(DEMO_ROOT)
    elif not (Path(args.data) / "train").is_dir():
        raise UserError(f"--data {args.data}: no train/ folder with shards in it")
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        result = summarize(measure(args, Path(scratch)))
    print(table(result))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    run_main(main)
