"""(e) of `python -m project.bench`: training samples/s of the template (Trainer, ImageClassifier and
ShardDataModule as `project.train` builds them) against a minimal hand-written loop, on the same model
and the same batches."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback

from project.cli import ProjectCLI
from project.errors import UserError


class StepClock(Callback):
    """The time at the end of each training step (after the device has finished it)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        synchronize(pl_module.device)
        self.times.append(time.perf_counter())


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steady_rate(times: list[float], batch_size: int) -> float:
    """Samples/s between the end of the first step and the end of the last."""
    if len(times) < 2:
        raise UserError("too few training steps to time: raise --steps or --samples")
    return (len(times) - 1) * batch_size / (times[-1] - times[0])


def template_run(root: str, index: Path, workers: int, steps: int, *, logs: Path, image_size: int):  # noqa: ANN201
    """The Trainer, model and data module as `project.train` builds them, for `steps` training steps."""
    args = [
        f"--data.root={root}",
        f"--data.image_size={image_size}",
        f"--data.train={index}",
        f"--data.num_workers={workers}",
        "--trainer.max_epochs=1",
        f"--trainer.limit_train_batches={steps}",
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={logs}",
    ]
    return ProjectCLI(args=args)


def paired_rates(
    root: str, index: Path, workers: int, steps: int, *, logs: Path, image_size: int, hand_first: bool = False
) -> tuple[float, float]:
    """Samples/s of the template, and of the hand loop on a copy of the same model and a fresh copy of the same
    data module (so the same batches), run one after the other; `hand_first` swaps their order, so that repeats
    alternating it share out any drift of the machine between the two alike."""
    cli = template_run(root, index, workers, steps, logs=logs, image_size=image_size)
    model, data = copy.deepcopy(cli.model), copy.deepcopy(cli.datamodule)
    device, lr = cli.trainer.strategy.root_device, cli.model.hparams.lr
    if hand_first:
        hand = hand_loop_rate(model, data, steps, device, lr)
        return fit_rate(cli), hand
    return fit_rate(cli), hand_loop_rate(model, data, steps, device, lr)


def fit_rate(cli: ProjectCLI) -> float:
    """Samples/s of the CLI's fit, timed from the end of its first step."""
    clock = StepClock()
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return steady_rate(clock.times, cli.datamodule.batch_size)


def hand_loop_rate(model: torch.nn.Module, data, steps: int, device: torch.device, lr: float) -> float:  # noqa: ANN001
    """A minimal PyTorch training loop over the data module's training batches."""
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    times = []
    for step, batch in enumerate(data.train_dataloader()):
        if step == steps:
            break
        inputs, targets = model.inputs_and_targets(batch)  # inputs: forward's one tensor, or a tuple of them
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        inputs = [tensor.to(device, non_blocking=True) for tensor in inputs]
        loss = F.cross_entropy(model(*inputs), targets.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize(device)
        times.append(time.perf_counter())
    return steady_rate(times, data.batch_size)
