"""EpochLoader: the DataLoader of a `ShardStream`, which sets the stream's epoch before each pass and
resumes mid-epoch where a restored checkpoint stopped."""

from __future__ import annotations

from typing import Any, Protocol

from torch.utils.data import DataLoader

from project.data.position import resumed_start
from project.data.stream import ShardStream
from project.data.workers import StartMethod, WorkerInit, as_is, worker_context


class PositionKeeper(Protocol):
    """Where a loader's training position is kept (`ShardDataModule`): its trainer, the position saved in
    checkpoints and restored from them, and where a resumed evaluation pass (predict) starts."""

    trainer: Any

    def train_position(self) -> dict[str, int]: ...

    def take_resume_position(self) -> dict | None: ...

    def take_split_start(self, split: str) -> int: ...


class EpochLoader(DataLoader):
    """A DataLoader that sets its ShardStream's epoch before each pass, and resumes mid-epoch.

    Lightning calls `set_epoch` only on samplers, and an IterableDataset has none. The resume position
    is kept by the data module's `state_dict`: Lightning restores it before anything iterates the loader
    (its loops' loader states arrive only after `configure_optimizers` has already iterated it, when
    the model asks for `estimated_stepping_batches`).
    """

    def __init__(
        self,
        dataset: ShardStream,
        datamodule: PositionKeeper | None = None,
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
        self.datamodule = datamodule

    def __iter__(self):  # noqa: ANN204
        stream = self.dataset
        trainer = self.datamodule.trainer if self.datamodule is not None else None
        epoch, done = (trainer.current_epoch if trainer is not None else stream.epoch), 0
        position = self.datamodule.take_resume_position() if self.datamodule and stream.train else None
        if position is not None:
            epoch, done = resumed_start(position, stream)
        elif self.datamodule is not None and not stream.train:
            done = self.datamodule.take_split_start(stream.stage)
        stream.set_epoch(epoch)
        stream.resume_after(done)
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        """The training position (also in the data module's state): marks this loader as resumable."""
        return self.datamodule.train_position() if self.datamodule is not None else {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Nothing to do: the data module's state, restored first, carries the position."""
