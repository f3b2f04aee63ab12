"""EpochLoader: the DataLoader of a `ShardStream`, which sets the stream's epoch before each pass and starts it
where the data module's `ResumePosition` says (mid-epoch after a restored checkpoint)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from project.data.position import ResumePosition
from project.data.stream import ShardStream
from project.data.workers import StartMethod, WorkerInit, as_is, worker_context


class EpochLoader(DataLoader):
    """A DataLoader that sets its ShardStream's epoch before each pass, and resumes mid-epoch.

    Lightning calls `set_epoch` only on samplers, and an IterableDataset has none. The resume position
    is kept by the data module's `state_dict`: Lightning restores it before anything iterates the loader
    (its loops' loader states arrive only after `configure_optimizers` has already iterated it, when
    the model asks for `estimated_stepping_batches`).

    Args:
        dataset: the stream; its task is pickled into each worker.
        position: where each pass starts (None: at the start of the stream's epoch).
        trainer: the Trainer whose epoch each pass reads (None: the stream's own epoch).
        worker_start: how the workers start (see project/data/workers.py).
        **kwargs: DataLoader's (num_workers, pin_memory, prefetch_factor, ...).
    """

    def __init__(
        self,
        dataset: ShardStream,
        *,
        position: ResumePosition | None = None,
        trainer: Any = None,
        worker_start: StartMethod = "forkserver",
        **kwargs: Any,
    ) -> None:
        workers = kwargs.get("num_workers", 0)
        dataset.num_workers = max(1, workers)  # the plan splits over these workers
        # batches leave the stream complete: DataLoader's default_convert would only walk every field
        kwargs.setdefault("collate_fn", as_is)
        if workers > 0:
            # see project/data/workers.py; the task's module is preloaded if this starts the forkserver
            kwargs["multiprocessing_context"] = worker_context(worker_start, [type(dataset.task).__module__])
        super().__init__(dataset, batch_size=None, worker_init_fn=WorkerInit(), **kwargs)
        self.position, self.trainer = position, trainer

    def __iter__(self):  # noqa: ANN204
        stream = self.dataset
        epoch = self.trainer.current_epoch if self.trainer is not None else stream.epoch
        epoch, done = self.position.pass_start(stream, epoch) if self.position is not None else (epoch, 0)
        stream.set_epoch(epoch)
        stream.resume_after(done)
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        """Where training stands in this loader (also in the data module's state): marks it as resumable."""
        stream = self.dataset
        return self.position.current(self.trainer, stream) if self.position is not None and stream.train else {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Nothing to do: the data module's state, restored first, carries the position."""
