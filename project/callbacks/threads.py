"""torch's intra-op threads on a CPU: a fixed rule that leaves the DataLoader workers their cores, and a
callback that measures, in the first steps of fit, whether training runs faster with every core."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info


def usable_cores() -> int:
    """The cores this process may run on (`taskset` and container CPU sets count; os.cpu_count() does not)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def fixed_threads(num_workers: int, processes: int = 1) -> int:
    """The rule for a run that feeds from workers: cores ÷ processes − workers, at least 1."""
    return max(1, usable_cores() // max(1, processes) - num_workers)


def loader_threads(datamodule: Any) -> int:
    """The threads that decode a process's batches beside its training: each worker's decode threads, or,
    without workers, the training process's own decode threads (one decoding in turn with training: none)."""
    workers, threads = getattr(datamodule, "num_workers", 0), getattr(datamodule, "decode_threads", 1)
    return workers * threads if workers else (threads if threads > 1 else 0)


# OMP_NUM_THREADS as the user left it, noted when this project starts, before Lightning's launcher sets it for
# the processes it starts (cores ÷ processes, under CPU DDP): they inherit the note, so the launcher's value is
# not taken for the user's wish.
USER_THREADS = "LIGHTNING_SHARDS_USER_OMP"
os.environ.setdefault(USER_THREADS, os.environ.get("OMP_NUM_THREADS", ""))


def threads_fixed_by_user() -> bool:
    """Whether the user fixed the thread count: OMP_NUM_THREADS is set, to what it was when the project started."""
    value = os.environ.get("OMP_NUM_THREADS")
    return value is not None and os.environ.get(USER_THREADS, value) == value


class ThreadPolicy(Callback):
    """Chooses torch's intra-op threads for training on a CPU by measuring them in the first steps of fit.

    Leaving the DataLoader workers their cores (`fixed_threads`: cores ÷ processes − workers) suits an
    input-bound run; giving training every core suits a compute-bound one (the demo on 2 cores: 3.4 steps/s
    with 1 thread, 4.6 with 2). Which one a run is depends on the model, the data and the machine, so after
    `skip` steps each candidate runs `steps` steps, alternating, `rounds` times; the candidate with the
    shortest median step, data wait included, keeps the rest of the run (within `margin`, the one that
    leaves the workers their cores). Ranks agree on one choice; it is saved in checkpoints, so a resumed run
    uses it without measuring again. The schedule follows the global step, so a run resumed within the
    warm-up runs each step at the count the interrupted run used, and decides at the same step from the
    steps it timed itself.

    Inactive, leaving the fixed rule, when OMP_NUM_THREADS is set (the user's count wins), when the trainer
    is deterministic (a thread count chosen by timing would make two runs, or a run and its resume, sum in a
    different order), off the CPU, and without workers or decode threads (there is nothing to share then).
    """

    def __init__(
        self, num_workers: int | None = None, skip: int = 3, steps: int = 4, rounds: int = 2, margin: float = 0.02
    ) -> None:
        """Args:
        num_workers: the threads that decode per process (default: the trainer's data module's `loader_threads`).
        skip: steps left untimed first (start-up).
        steps: steps a candidate runs in one turn.
        rounds: turns of each candidate.
        margin: the share by which every core must be faster to be chosen over the workers-first count.
        """
        self.num_workers = num_workers
        self.skip, self.steps, self.rounds, self.margin = skip, steps, rounds, margin
        self.candidates: list[int] = []
        self.chosen: int | None = None
        self.timings: dict[int, list[float]] = {}
        self._previous: tuple[int, float, int, bool] | None = None  # batch_idx, start, threads, counted

    @property
    def warmup_steps(self) -> int:
        return self.skip + self.steps * self.rounds * len(self.candidates)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.candidates, self._previous = [], None
        workers = self.num_workers if self.num_workers is not None else loader_threads(trainer.datamodule)
        if not isinstance(trainer.accelerator, CPUAccelerator) or threads_fixed_by_user() or not workers:
            return
        fixed = fixed_threads(workers, trainer.num_devices)
        every = max(1, usable_cores() // max(1, trainer.num_devices))
        if torch.are_deterministic_algorithms_enabled() or fixed == every:
            torch.set_num_threads(fixed)
            return
        if self.chosen is not None:  # resumed: the choice the run made, on at most this machine's cores
            self.chosen = min(self.chosen, every)
            torch.set_num_threads(self.chosen)
            return
        self.candidates = [fixed, every]
        self.timings = {count: [] for count in self.candidates}
        torch.set_num_threads(fixed)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.candidates or self.chosen is not None:
            return
        now = time.perf_counter()
        if self._previous is not None:
            index, start, threads, counted = self._previous
            if counted and batch_idx == index + 1:  # a whole step (compute and the next batch's wait)
                self.timings[threads].append(now - start)
        position = trainer.global_step - self.skip
        if position < 0:
            self._previous = None
            return
        trial = position // self.steps
        if trial >= self.rounds * len(self.candidates):
            self._decide(trainer)
            return
        threads = self.candidates[trial % len(self.candidates)]
        torch.set_num_threads(threads)
        # the first step of a trial runs with the previous count's batch already fetched: not timed
        self._previous = (batch_idx, now, threads, position % self.steps != 0)

    def _decide(self, trainer: L.Trainer) -> None:
        # a count never timed (a run resumed at the end of the warm-up) reads as infinitely slow; every rank
        # makes the same choice from the mean of the ranks' medians
        medians = [statistics.median(self.timings[c]) if self.timings[c] else float("inf") for c in self.candidates]
        agreed = trainer.strategy.reduce(torch.tensor(medians, dtype=torch.float64), reduce_op="mean").tolist()
        best = min(range(len(agreed)), key=lambda i: agreed[i])
        if not agreed[best] < agreed[0] * (1 - self.margin):  # inf < inf is False: the rule then
            best = 0
        self.chosen = self.candidates[best]
        torch.set_num_threads(self.chosen)
        measured = ", ".join(
            f"{c} thread{'s' * (c > 1)} {t * 1000:.0f} ms" for c, t in zip(self.candidates, agreed, strict=True)
        )
        rank_zero_info(
            f"threads: training uses {self.chosen} intra-op thread{'s' * (self.chosen > 1)} (median step over "
            f"steps {self.skip + 1}-{self.warmup_steps}: {measured}; OMP_NUM_THREADS=N fixes the count)"
        )

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.candidates and self.chosen is None:  # fit ended within the warm-up: back to the rule
            torch.set_num_threads(self.candidates[0])

    def state_dict(self) -> dict[str, Any]:
        return {"threads": self.chosen} if self.chosen is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.chosen = state_dict.get("threads")
