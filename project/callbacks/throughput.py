"""Training speed in TensorBoard: samples/s, the share of step time spent waiting for data, and peak
memory; and, at the end of fit, one line saying whether the run was input-bound or compute-bound."""

from __future__ import annotations

import resource
import sys
import time
import warnings
from collections import deque
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.utilities import rank_zero_info

# samples/s needs no FLOP count; MFU would need one per model (see lightning's measure_flops)
warnings.filterwarnings("ignore", message=".*need to define a `flops_per_batch`.*")


def batch_samples(batch: Any) -> int:
    """Samples in a batch: its rows (a `project.data.batch.Batch` knows its length)."""
    return len(batch)


class SpeedMonitor(ThroughputMonitor):
    """Lightning's ThroughputMonitor (train/device/samples_per_sec, train/device/batches_per_sec, and the
    same for validation and test), plus, every `trainer.log_every_n_steps` training steps:

    - `perf/data_wait`: the share of step time spent waiting for the next batch over the last
      `window_size` steps: from the end of one training step to the start of the next, which covers
      fetching it from the DataLoader, moving it to the device and decoding it there (data.decode_on);
    - `perf/peak_device_memory_gb` (CUDA: the most memory tensors have held), or
      `perf/peak_host_memory_gb` elsewhere (the main process's peak RSS).

    At the end of fit it prints whether training was input-bound (waiting for data more than
    `input_bound_above` of its step time) or compute-bound, and by how much. On CUDA, like
    ThroughputMonitor itself, it synchronizes once a step so that times are the device's.

    Args:
        window_size: steps in the rolling averages of samples/s and data wait.
        input_bound_above: data-wait share above which a run counts as input-bound.
    """

    def __init__(self, window_size: int = 20, input_bound_above: float = 0.1) -> None:
        super().__init__(batch_size_fn=batch_samples, window_size=window_size)
        self.window_size = window_size
        self.input_bound_above = input_bound_above
        self._step_end: float | None = None
        self._step_start = 0.0
        self._waits: deque[float] = deque(maxlen=window_size)
        self._steps: deque[float] = deque(maxlen=window_size)
        self.total_wait = self.total_compute = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.total_wait = self.total_compute = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the epoch's first wait includes starting the DataLoader workers: a real cost of every epoch
        self._step_end = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._step_end is not None:
            self._step_end = time.perf_counter()  # validation is not waiting for training data

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # synchronizes on CUDA
        if pl_module.device.type == "cuda" and not trainer.is_global_zero:
            torch.cuda.synchronize(pl_module.device)  # ThroughputMonitor's hooks run on rank zero only
        now = time.perf_counter()
        wait = self._step_start - self._step_end if self._step_end is not None else 0.0
        compute = now - self._step_start
        self._step_end = now
        self.total_wait += wait
        self.total_compute += compute
        self._waits.append(wait)
        self._steps.append(wait + compute)
        if not will_log(trainer):  # a step value the loggers would not write: not worth a log call (1 ms on a CPU)
            return
        pl_module.log("perf/data_wait", sum(self._waits) / max(sum(self._steps), 1e-9), on_step=True, on_epoch=False)
        name, gigabytes = peak_memory(pl_module.device)
        pl_module.log(name, gigabytes, on_step=True, on_epoch=False)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        line = self.verdict()
        if line:
            rank_zero_info(line)

    def verdict(self) -> str:
        """One line: input-bound or compute-bound, and by how much ('' before any training step)."""
        total = self.total_wait + self.total_compute
        if total <= 0:
            return ""
        share = self.total_wait / total
        if share > self.input_bound_above:
            return (
                f"input-bound: training waited for data {share:.0%} of its step time; an input pipeline that "
                f"kept up would make it up to {1 / (1 - share):.1f}x faster (more data.num_workers; for images "
                "also data.decode_on=device or smaller stored images; see README, Finding bottlenecks)"
            )
        return (
            f"compute-bound: training waited for data only {share:.0%} of its step time; the model's steps "
            "set the pace (on GPUs mixed precision speeds them up; for images also model.channels_last and "
            "model.compile)"
        )


def will_log(trainer: L.Trainer) -> bool:
    """Whether the loggers write this training step's values (every `trainer.log_every_n_steps`): what Lightning's
    own LearningRateMonitor asks, through the same attribute."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))


def peak_memory(device: torch.device) -> tuple[str, float]:
    """(metric name, GB): peak CUDA memory held by tensors, or else the main process's peak RSS."""
    if device.type == "cuda":
        return "perf/peak_device_memory_gb", torch.cuda.max_memory_allocated(device) / 1e9
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, kB on Linux
    return "perf/peak_host_memory_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9
