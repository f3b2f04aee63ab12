"""Measure the input pipeline and the training loop side by side, in one run, on the same shards.

    python -m project.bench [--task image|text] [--data DIR] [--workers N] [--json true] [--repeats R]
        [--samples N] [--steps N] [--image_size S] [--quick true]

`--task text` measures the text task's loader instead (see project/bench/text.py); what follows is the
image task's bench, the default.

On the training split of DIR (the demo's by default, built if missing), with the data settings of
configs/default.yaml:

  (a) work limit: the naive path, torchvision's decode at full size then the configured preset's v2
      transform per sample, of the same encoded samples held in memory, by N forked processes: what a
      loader that runs torchvision's path could reach with nothing else to do; and the decode limit, bare
      decoding by the project's own decoder (image bytes to uint8 pixels, and the label), likewise;
  (b) the project's train loader (ShardDataModule, N workers), and the same with 1 and 2 workers;
  (c) torchvision's ImageFolder + DataLoader on the same images written out as files, same transform,
      same N workers;
  (d) the loader's peak memory over a dataset of S and of 8S samples (the same shards listed 8 times),
      each in a fresh process: the kernel's peak RSS (getrusage) of the main process plus N times that
      of the largest worker, an upper bound of their simultaneous total;
  (e) training samples/s of the template (the Lightning Trainer, ImageClassifier and ShardDataModule as
      `project.train` builds them) against a minimal hand-written PyTorch loop (forward, loss, backward,
      AdamW step) on the same model and the same batches, timed from the end of the first step over
      `--steps` (150: a repeat of 60 moved by ±0.1 on a 2-core machine); both with the intra-op threads the
      workers leave (cores - N, at least 1), in an order that alternates between repeats;
  (f) webdataset's own pipeline (WebDataset + WebLoader, as its README builds it) on the same shards,
      running the naive path in N workers (benchmarks/peers.py adds litdata and mosaicml-streaming);
  (g) where (b)'s CPU time goes: each stage of its epoch alone in one thread (read and group, shuffle, decode,
      crop, collate, hand-over through a worker's queue; project/bench/stages.py), the main process's share of
      (b), and the rest of (b) beyond them (processes, the stream's bookkeeping, waits).

The loader's training order in (b) also gives `shuffle_entropy`: the mean label entropy of its batches over
that of a full random permutation of the same labels (1.0 is as mixed as a full shuffle).

Each figure is the median of R repeats, run interleaved so that a busy machine slows all of them alike.
With `--json true` the last line is one JSON object: every run's figure, the medians and the ratios.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
import yaml

from project.bench.images import (
    decode_rate,
    imagefolder_rate,
    loader_rate,
    peak_rss_mb,
    subset_index,
    webdataset_rate,
    work_limit_rate,
    write_image_folder,
)
from project.bench.shuffle import entropy_ratio
from project.bench.stages import STAGES, stage_costs
from project.bench.summary import summarize, table
from project.bench.text import ensure_text_demo, measure_text, summarize_text, text_table
from project.bench.training import paired_rates
from project.callbacks.threads import USER_THREADS, fixed_threads
from project.cli import DEFAULT_CONFIG
from project.commands import run_command
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.data.workers import warm_forkserver
from project.errors import UserError, run_main
from project.tasks import WORKER_MODULES
from project.tasks.image.data import DEMO_ROOT, ensure_demo
from project.tasks.text.data import DEMO_ROOT as TEXT_DEMO_ROOT

# the template run trains without validation
warnings.filterwarnings("ignore", message=".*could not find the monitored key.*")


def data_settings() -> dict:
    """The data section of configs/default.yaml: batch size, image size, augmentation, shuffle buffer, seed."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())["data"]["init_args"]
    keys = ("batch_size", "image_size", "augment", "shuffle_buffer", "seed")
    return {key: data[key] for key in keys if key in data}


def measure(args: SimpleNamespace, scratch: Path) -> dict:
    """Every figure of the benchmark: {name: [one value per repeat]}, plus the settings used."""
    settings = data_settings()
    if args.image_size is not None:
        settings["image_size"] = args.image_size
    train = resolve_shards(str(Path(args.data) / "train"))
    index = subset_index(train.shards, args.samples, train.extra, scratch / "train")
    samples = [sample for shard in resolve_shards(str(index)).shards for sample in read_samples(shard.url)]
    folder = write_image_folder(samples, scratch / "imagefolder")
    workers, size = args.workers, settings["image_size"]
    names = (
        "work_limit",
        "decode",
        "decode_cpu_us",
        "loader",
        "loader_cpu_us",
        "loader_1",
        "loader_2",
        "imagefolder",
        "webdataset",
        "shuffle_entropy",
        "loader_main_cpu_us",
        *(f"stage_{stage}_us" for stage in STAGES),
    )
    runs: dict[str, list[float]] = {name: [] for name in names}
    warm_forkserver(WORKER_MODULES)  # its one-time start (importing the pipeline) is not part of any epoch
    for _ in range(args.repeats):
        runs["work_limit"].append(work_limit_rate(samples, max(1, workers), settings["augment"], size))
        labels: list[int] = []
        split: dict[str, float] = {}
        for name, (rate, cpu) in (
            ("decode", decode_rate(samples, max(1, workers), size)),
            ("loader", loader_rate(index, workers, settings, labels, split)),
        ):
            runs[name].append(rate)
            runs[f"{name}_cpu_us"].append(cpu)
        runs["loader_main_cpu_us"].append(split["main"])
        for stage, microseconds in stage_costs(index, settings).items():
            runs[f"stage_{stage}_us"].append(microseconds)
        runs["shuffle_entropy"].append(entropy_ratio(labels, settings["batch_size"]))
        runs["loader_1"].append(loader_rate(index, 1, settings)[0] if workers != 1 else runs["loader"][-1])
        runs["loader_2"].append(loader_rate(index, 2, settings)[0] if workers != 2 else runs["loader"][-1])
        runs["imagefolder"].append(imagefolder_rate(folder, workers, settings))
        runs["webdataset"].append(webdataset_rate(index, workers, settings))
    rss_samples = max(1, args.samples // 4)
    small = subset_index(train.shards, rss_samples, train.extra, scratch / "rss-small")
    large = subset_index(train.shards, rss_samples, train.extra, scratch / "rss-large", copies=8)
    small_mb, large_mb = peak_rss_mb([small, large], workers, settings)
    runs["rss_small_mb"], runs["rss_large_mb"] = [small_mb], [large_mb]
    runs["template"], runs["hand_loop"] = [], []
    with fixed_thread_count(workers):
        for repeat in range(args.repeats):
            logs = scratch / f"logs{repeat}"
            template, hand_loop = paired_rates(
                args.data, index, workers, args.steps, logs=logs, image_size=size, hand_first=repeat % 2 == 1
            )
            runs["template"].append(template)
            runs["hand_loop"].append(hand_loop)
        training_threads = torch.get_num_threads()
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


@contextlib.contextmanager
def fixed_thread_count(workers: int) -> Iterator[None]:
    """Both loops of (e) with the threads the workers leave, as a user who fixed the count: the template's
    ThreadPolicy then times no other count in its first steps, which would weigh on (e) and not on the hand loop.
    The policy takes OMP_NUM_THREADS for the user's only where it was so when the project started (USER_THREADS),
    so both are set (OMP_NUM_THREADS alone left it timing 19 of the 60 steps at another count); all put back."""
    threads, saved = torch.get_num_threads(), {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", USER_THREADS)}
    torch.set_num_threads(fixed_threads(workers))
    os.environ["OMP_NUM_THREADS"] = os.environ[USER_THREADS] = str(torch.get_num_threads())
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def options(
    *,
    task: Literal["image", "text"] = "image",
    data: str | None = None,
    workers: int = 2,
    json: bool = False,
    repeats: int = 5,
    samples: int = 20000,
    steps: int = 150,
    image_size: int | None = None,
    quick: bool = False,
) -> SimpleNamespace:
    """Measure the input pipeline and the training loop side by side, in one run, on the same shards.

    Args:
        task: the task whose loader to measure.
        data: a folder with a train/ split (default: the task's demo).
        workers: DataLoader workers and decoding/tokenizing processes.
        json: end with one line of JSON: figures and ratios.
        repeats: repeats of each measurement (medians; a repeat of (e) moves by a few percent on a CPU).
        samples: training samples the loaders read.
        steps: training steps of (e).
        image_size: training image size (default: the config's).
        quick: 1 repeat, 512 samples, 6 steps: a smoke run.
    """
    if quick:
        repeats, samples, steps = 1, min(samples, 512), min(steps, 6)
    if workers < 0 or repeats < 1 or samples < 1 or steps < 2:
        raise UserError("--workers must be >= 0, --repeats and --samples >= 1, --steps >= 2")
    demo = TEXT_DEMO_ROOT if task == "text" else DEMO_ROOT
    return SimpleNamespace(
        task=task,
        data=str(demo) if data is None else data,
        workers=workers,
        json=json,
        repeats=repeats,
        samples=samples,
        steps=steps,
        image_size=image_size,
    )


def main(argv: list[str] | None = None) -> dict:
    args = run_command(options, "project.bench", argv)
    if args.task == "text":
        return text_main(args)
    if Path(args.data).resolve() == DEMO_ROOT.resolve():
        ensure_demo(DEMO_ROOT)
    elif not (Path(args.data) / "train").is_dir():
        raise UserError(f"--data {args.data}: no train/ folder with shards in it")
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        result = summarize(measure(args, Path(scratch)))
    print(table(result))
    if args.json:
        print(json.dumps(result))
    return result


def text_main(args: SimpleNamespace) -> dict:
    data = Path(args.data)
    ensure_text_demo(data)
    with tempfile.TemporaryDirectory(prefix="bench-text-") as scratch:
        result = summarize_text(measure_text(data, args.workers, args.samples, args.repeats, Path(scratch)))
    print(text_table(result))
    if args.json:
        print(json.dumps(result))
    return result


def console() -> None:
    """The `shards-bench` console script."""
    run_main(main)
