"""Does the input pipeline keep a GPU busy? ResNet-50 training images/s fed from shards, against the same
training on synthetic batches already on the GPU (the upper bound). Run it through scripts/gpu_bench.sh.

    python benchmarks/gpu_bench.py [--workers N] [--batch_size B] [--steps N] [--json true]

It writes demo shards of 256 px JPEGs into a temporary folder (a few thousand, listed several times so an
epoch is long enough), then trains torchvision's resnet50 (weights=None) in bf16 autocast with
channels_last, with a plain PyTorch loop, three ways: fed by the project's ImageShards (decode in the
workers, and data.decode_on=device), by NVIDIA DALI's pipeline with its `mixed` (nvJPEG) decoder where DALI
is installed (benchmarks/peer_dali.py's `gpu_batches`; UNTESTED: written without a GPU at hand), and on
synthetic uint8 batches made on the GPU. Each is timed over
--steps steps after --warmup steps. The --device, --model, --precision and size flags let a CPU check
the script itself in seconds (tests/test_bench.py; CPUs without bf16 units emulate it very slowly); the
figures mean something only on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
import torch.nn.functional as F
import torchvision
from lightning.fabric.utilities.apply_func import move_data_to_device

from project.bench.images import subset_index
from project.commands import run_command
from project.data.specs import resolve_shards
from project.tasks.image.data import ImageShards
from project.tasks.image.demo import make_demo
from project.tasks.image.model import IMAGENET_MEAN, IMAGENET_STD


def make_shards(folder: Path, samples: int, stored_size: int, copies: int) -> Path:
    """A training split of `samples` demo images of `stored_size` px, listed `copies` times."""
    make_demo(folder / "demo", train=samples, val=1, test=1, image_size=stored_size, samples_per_shard=500, quiet=True)
    train = resolve_shards(str(folder / "demo" / "train"))
    return subset_index(train.shards, samples, train.extra, folder / "train", copies=copies)


class Normalize(torch.nn.Module):
    """uint8 NCHW on the device to normalized float in channels_last, as ImageClassifier does."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", 1 / (255 * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)))
        self.register_buffer(
            "shift", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() * self.scale - self.shift).contiguous(memory_format=torch.channels_last)


def train_rate(
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    model: torch.nn.Module,
    device: torch.device,
    *,
    warmup: int,
    steps: int,
    bf16: bool = True,
) -> tuple[float, float]:
    """(images/s, share of the timed steps spent waiting for the next batch) of training steps."""
    normalize = Normalize().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5)
    waited, count, start = 0.0, 0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start, waited, count = time.perf_counter(), 0.0, 0
        before = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - before
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(normalize(images)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        count += len(labels)
    synchronize(device)
    elapsed = time.perf_counter() - start
    return count / elapsed, waited / elapsed


def pipeline_batches(data: ImageShards, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The data module's training batches on the device (pinned memory, non-blocking copies), epoch after epoch."""
    epoch = 0
    while True:
        loader = data.train_dataloader()
        loader.dataset.set_epoch(epoch)
        for batch in loader:
            batch = move_data_to_device(batch, device)
            batch = data.on_after_batch_transfer(batch, 0)  # decodes on the device with decode_on=device
            yield batch.image, batch.label
        epoch += 1


def synthetic_batches(
    batch_size: int, image_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One fixed uint8 batch already on the device, forever: no input cost at all."""
    images = torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (batch_size,), device=device)
    while True:
        yield images, labels


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(name: str, device: torch.device) -> torch.nn.Module:
    model = getattr(torchvision.models, name)(weights=None, num_classes=10)
    return model.to(device).to(memory_format=torch.channels_last).train()


def measure(args: SimpleNamespace) -> dict:
    """images/s from shards (decoding in the workers, and on the device) and from synthetic batches."""
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.set_flush_denormal(True)  # a CPU check's tiny batches make denormal floats, 100x slower on CPUs
    copies = -(-(args.warmup + args.steps) * args.batch_size // args.samples) + 1  # an epoch outlasts the run
    schedule = {"warmup": args.warmup, "steps": args.steps, "bf16": args.precision == "bf16"}
    results = {"model": args.model, "precision": args.precision, "batch_size": args.batch_size}
    results["image_size"] = args.image_size
    results["workers"] = args.workers
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as scratch:
        index = make_shards(Path(scratch), args.samples, args.image_size * 8 // 7, copies)
        for decode_on in ("cpu", "device"):
            data = ImageShards(
                root=None,
                train=str(index),
                batch_size=args.batch_size,
                num_workers=args.workers,
                image_size=args.image_size,
                augment="light",
                pin_memory=device.type == "cuda",
                prefetch_factor=4,
                decode_on=decode_on,
            )
            model = build_model(args.model, device)
            rate, wait = train_rate(pipeline_batches(data, device), model, device, **schedule)
            results[f"decode_{decode_on}"] = {"images_per_s": rate, "data_wait": wait}
        if device.type == "cuda" and importlib.util.find_spec("nvidia.dali") is not None:  # UNTESTED here (no GPU)
            import peer_dali

            dali = peer_dali.gpu_batches(index, Path(scratch), args.image_size, args.workers, args.batch_size)
            rate, wait = train_rate(dali, build_model(args.model, device), device, **schedule)
            results["dali_mixed"] = {"images_per_s": rate, "data_wait": wait}
    batches = synthetic_batches(args.batch_size, args.image_size, device)
    synthetic, _ = train_rate(batches, build_model(args.model, device), device, **schedule)
    results["synthetic"] = {"images_per_s": synthetic}
    results["ratios"] = {
        f"{run}_vs_synthetic": results[run]["images_per_s"] / synthetic
        for run in ("decode_cpu", "decode_device", "dali_mixed")
        if run in results
    }
    results["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    return results


def report(results: dict) -> str:
    lines = [
        f"{results['model']}, {results['precision']}, channels_last, batch {results['batch_size']}, "
        f"{results['image_size']} px, {results['workers']} workers, on {results['device_name']}:"
    ]
    shown = {"decode_cpu": "from shards, decoded on the cpu   ", "decode_device": "from shards, decoded on the device"}
    shown["dali_mixed"] = "DALI, its mixed (nvJPEG) decoder   "
    for name, text in shown.items():
        if name not in results:
            continue  # DALI: not installed, or not on a GPU
        run, ratio = results[name], results["ratios"][f"{name}_vs_synthetic"]
        lines.append(
            f"  {text} {run['images_per_s']:8.0f} images/s = {ratio:.2f}x synthetic "
            f"(waiting for data {run['data_wait']:.0%} of the time)"
        )
    lines.append(
        f"  synthetic batches on the device   {results['synthetic']['images_per_s']:8.0f} images/s (the bound)"
    )
    return "\n".join(lines)


def options(
    *,
    workers: int | None = None,
    batch_size: int = 256,
    steps: int = 60,
    warmup: int = 15,
    image_size: int = 224,
    samples: int = 4000,
    model: str = "resnet50",
    device: str = "cuda",
    precision: Literal["bf16", "32"] = "bf16",
    json: bool = False,
) -> SimpleNamespace:
    """Training images/s fed from shards against synthetic batches on the device.

    Args:
        workers: DataLoader workers (default: the cores, at most 16).
        batch_size: samples per batch.
        steps: timed steps of each run.
        warmup: untimed steps first (workers, cuDNN autotuning).
        image_size: training size (stored JPEGs: 8/7 of it).
        samples: distinct images in the shards.
        model: a torchvision classification model.
        device: the device trained on.
        precision: bf16 autocast, or float32.
        json: end with one JSON line.
    """
    workers = min(16, os.cpu_count() or 1) if workers is None else workers
    return SimpleNamespace(
        workers=workers,
        batch_size=batch_size,
        steps=steps,
        warmup=warmup,
        image_size=image_size,
        samples=samples,
        model=model,
        device=device,
        precision=precision,
        json=json,
    )


def main(argv: list[str] | None = None) -> dict:
    args = run_command(options, "benchmarks/gpu_bench.py", argv)
    results = measure(args)
    print(report(results))
    if args.json:
        print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
