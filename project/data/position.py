"""Where training stands, saved in checkpoints and restored from them, and where each pass over a split starts:
the one owner of exact resume. The data module holds one `ResumePosition` and saves it under its
"train_position" key; its loaders ask it where each pass starts."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

PLANNED_BY = ("world_size", "num_workers", "mix_shards")  # what the epoch plan depends on besides epoch and seed
SAVED_BEFORE = {"mix_shards": 1}  # a position saved before a setting existed was planned as with this value


class ResumePosition:
    """The training position (epoch, batches done, and the settings that planned the epoch), the one restored
    from a checkpoint until the first training pass takes it, and the batch where a resumed evaluation pass
    (predict) starts."""

    def __init__(self) -> None:
        self.restored: dict | None = None  # a checkpoint's, until the next training pass starts from it
        self.split_starts: dict[str, int] = {}  # an evaluation split's next pass starts at this batch

    @staticmethod
    def current(trainer: Any, stream: Any) -> dict[str, int]:
        """Where training stands in `stream` (the training loader's): {} without a trainer or a stream."""
        if trainer is None or stream is None:
            return {}
        # batches whose training step ran; Lightning's fetcher has already pulled one more (prefetch),
        # so what the loader yielded would overcount by one
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        planned = {name: getattr(stream, name) for name in PLANNED_BY}
        return {"epoch": trainer.current_epoch, "batches": done, "epoch_batches": len(stream), **planned}

    def restore(self, position: dict | None) -> None:
        """The position a checkpoint saved (None: none): the next training pass starts there."""
        self.restored = position

    def start_split_at(self, split: str, batches: int) -> None:
        """Start the next pass over an evaluation split at its batch `batches` (a resumed predict)."""
        self.split_starts[split] = batches

    def pass_start(self, stream: Any, epoch: int) -> tuple[int, int]:
        """(epoch, batches done) where the next pass over `stream` starts, in the trainer's `epoch`: a restored
        training position or an evaluation split's start is taken, once; otherwise the epoch's first batch."""
        if not stream.train:
            return epoch, self.split_starts.pop(stream.stage, 0)
        position, self.restored = self.restored, None
        return (epoch, 0) if position is None else resumed_start(position, stream)


def resumed_start(position: dict, stream: Any) -> tuple[int, int]:
    """(epoch, batches done) where a stream's pass starts from a restored `position`; a warning when the
    position was planned with other settings, since its epoch then continues on another plan."""
    epoch, done = position["epoch"], position["batches"]
    if done >= position["epoch_batches"]:  # saved at the end of its epoch: start the next one
        return epoch + 1, 0
    changed = [
        f"{name} {position.get(name, SAVED_BEFORE.get(name))} → {getattr(stream, name)}"
        for name in PLANNED_BY
        if position.get(name, SAVED_BEFORE.get(name)) != getattr(stream, name)
    ]
    if changed:
        rank_zero_warn(
            f"resuming mid-epoch with other settings ({', '.join(changed)}): this epoch continues on the new "
            "plan and may repeat or miss samples; later epochs are exact"
        )
    return epoch, done
