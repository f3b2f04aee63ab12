"""Both of Lightning's views of a run from one `Trainer(profiler=...)`, which takes a single profiler:
PyTorchProfiler's operator traces and SimpleProfiler's time per Lightning hook (configs/trainer/profile.yaml)."""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.profilers import Profiler, PyTorchProfiler, SimpleProfiler
from lightning.pytorch.utilities import rank_zero_info

PRINTED_ROWS = 20  # of the summary table, which lists every hook of every callback


class TraceAndSummaryProfiler(Profiler):
    """PyTorchProfiler traces of a few steps of each stage, plus SimpleProfiler's summary of the whole run.

    Both are written into the run folder (logs/<experiment>/version_N/): the traces as
    `<stage>-<filename>-...pt.trace.json` (open them in https://ui.perfetto.dev or chrome://tracing), the
    summary as `<stage>-<filename>-summary.txt`, whose top rows are also printed at the end of the stage.

    Args:
        filename: the start of the files' names.
        wait: steps of each stage to skip before tracing (the first ones start workers and warm up).
        warmup: steps traced but discarded, so that the profiler's start-up is not in the trace.
        active: steps in the trace.
        record_shapes: record operator input shapes (larger traces).
        profile_memory: record tensor allocations (larger traces).
        with_stack: record Python stacks of operators (much larger traces).
    """

    def __init__(
        self,
        *,
        filename: str = "profile",
        wait: int = 5,
        warmup: int = 2,
        active: int = 5,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
    ) -> None:
        super().__init__(filename=filename)
        self.simple = SimpleProfiler(filename=f"{filename}-summary")
        self.pytorch = PyTorchProfiler(
            filename=filename,
            # one trace per stage: torch.profiler's default repeat=0 would write one every few steps
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
        )

    @property
    def _lightning_module(self) -> Any:  # the Trainer sets it; PyTorchProfiler names modules with it
        return self.pytorch._lightning_module

    @_lightning_module.setter
    def _lightning_module(self, module: Any) -> None:
        if hasattr(self, "pytorch"):
            self.pytorch._lightning_module = module

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self.simple.setup(stage, local_rank, log_dir)
        self.pytorch.setup(stage, local_rank, log_dir)

    def start(self, action_name: str) -> None:
        self.simple.start(action_name)
        self.pytorch.start(action_name)

    def stop(self, action_name: str) -> None:
        self.pytorch.stop(action_name)
        self.simple.stop(action_name)

    def summary(self) -> str:
        return self.simple.summary()

    def describe(self) -> None:
        """Print the summary's top rows; write it whole, and the traces, into the run folder."""
        if self.simple.recorded_durations:
            lines = self.simple.summary().splitlines()
            path = os.path.join(self.simple.dirpath or ".", self.simple._prepare_filename())
            rank_zero_info("\n".join([*lines[:PRINTED_ROWS], f"(the whole table: {path})"]))
        self.simple.describe()
        self.pytorch.describe()
        self.simple.recorded_durations.clear()  # the next stage (test after fit) starts a fresh summary

    def teardown(self, stage: str | None) -> None:
        self.simple.teardown(stage)
        self.pytorch.teardown(stage)
        super().teardown(stage)
