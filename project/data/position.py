"""Where training stands, saved in checkpoints and restored from them: the mid-epoch resume position (mixed
into `ShardDataModule`), and what a restored position means for the loader's next pass."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

PLANNED_BY = ("world_size", "num_workers", "mix_shards")  # what the epoch plan depends on besides epoch and seed
SAVED_BEFORE = {"mix_shards": 1}  # a position saved before a setting existed was planned as with this value


class ResumePosition:
    """A data module's training position (mixed into `ShardDataModule`, which provides `trainer` and the
    loaders it made, `_loaders`), and the start of a resumed evaluation pass (predict)."""

    trainer: Any
    _loaders: dict
    _resume_position: dict | None
    _split_starts: dict[str, int]  # a split's next pass starts at this batch

    def train_position(self) -> dict[str, int]:
        """Where training stands: epoch, batches done in it, and the settings that planned it."""
        trainer, loader = self.trainer, self._loaders.get("train")
        if trainer is None or loader is None:
            return {}
        # batches whose training step ran; Lightning's fetcher has already pulled one more (prefetch),
        # so what the loader yielded would overcount by one
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        stream = loader.dataset
        planned = {name: getattr(stream, name) for name in PLANNED_BY}
        return {"epoch": trainer.current_epoch, "batches": done, "epoch_batches": len(stream), **planned}

    def state_dict(self) -> dict[str, Any]:
        position = self.train_position()
        return {"train_position": position} if position else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_position = state.get("train_position")

    def take_resume_position(self) -> dict | None:
        """The restored training position, once: only the first pass after a restore resumes."""
        position, self._resume_position = self._resume_position, None
        return position

    def start_split_at(self, split: str, batches: int) -> None:
        """Start the next pass over an evaluation split at its batch `batches` (a resumed predict)."""
        self._split_starts[split] = batches

    def take_split_start(self, split: str) -> int:
        """The batch where this pass over `split` starts, once (0 unless `start_split_at` set one)."""
        return self._split_starts.pop(split, 0)


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
