"""The learning-rate range test from the command line: Lightning's `LearningRateFinder` at the start of fit
(configs/callbacks/lr_find.yaml), which then trains at its suggestion.

Lightning's finder saves the whole training state, trains `num_training_steps` batches at learning rates rising
from `min_lr` to `max_lr` (its own schedule and progress bar, no other callback, no logger), restores that state
and suggests the lr where the loss fell fastest. The restore puts back the model, the optimizer, the loops and
the data module's position, so the run then reads its epochs as it would have: the finder's batches take nothing
from the epoch plan. What this subclass adds:

- The optimizer and its schedule are made again, at the suggestion (`model.lr`, the schedule's peak). Lightning
  sets it in the optimizer's groups only, where the schedule's next step puts back the peak it was made with.
- One line gives the suggestion; the loss against the lr is drawn in the run folder's lr_find.png.
- A resumed fit runs no finder: the optimizer and schedule it restores hold the lr of its first run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.callbacks import LearningRateFinder as LightningFinder
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr

from project.data.atomic import write_atomically
from project.errors import UserError
from project.redact import redact

PLOT = "lr_find.png"  # in the run folder (trainer.log_dir)


class LearningRateFinder(LightningFinder):
    """Lightning's `LearningRateFinder`: before the first epoch, a short run at rising learning rates suggests
    the one where the loss falls fastest, and training starts from the same state at that one.

    Args:
        min_lr: the first learning rate tried.
        max_lr: the last learning rate tried.
        num_training_steps: batches trained, each at the next learning rate.
        mode: how the learning rate rises from batch to batch: exponential or linear.
        early_stop_threshold: stop once the loss exceeds this many times its lowest (null: never).
        update_attr: train at the suggestion; false only reports it (the run keeps its configured lr).
        attr_name: the model's learning-rate hyperparameter ("": lr or learning_rate).
    """

    def __init__(
        self,
        *,
        min_lr: float = 1e-6,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: Literal["exponential", "linear"] = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> None:
        if not 0 < min_lr < max_lr:
            raise UserError(f"LearningRateFinder: min_lr {min_lr} and max_lr {max_lr}: need 0 < min_lr < max_lr")
        super().__init__(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training_steps,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=update_attr,
            attr_name=attr_name,
        )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None:
            if trainer.is_global_zero:
                print("lr_find: a resumed run keeps the learning rate its checkpoint holds", file=sys.stderr)
            return
        name = self.lr_name(pl_module)
        configured = lightning_getattr(pl_module, name)
        super().on_fit_start(trainer, pl_module)  # the finder; its restore leaves the temporary file as ckpt_path
        trainer.ckpt_path = None
        if self.optimal_lr is None:  # Lightning skips it under fast_dev_run
            return
        suggestion = self.optimal_lr.suggestion()
        if suggestion is not None and self._update_attr:
            trainer.strategy.setup_optimizers(trainer)  # the schedule made again, peaking at model.lr
        plot = self.draw(trainer)
        if trainer.is_global_zero:
            print(report(suggestion, configured, self._update_attr, plot, name), file=sys.stderr)

    def lr_name(self, pl_module: L.LightningModule) -> str:
        """The model's learning-rate hyperparameter, or a `UserError` when it has none."""
        names = (self._attr_name,) if self._attr_name else ("lr", "learning_rate")
        found = [name for name in names if lightning_hasattr(pl_module, name)]
        if not found:
            raise UserError(
                f"LearningRateFinder: {type(pl_module).__name__} has no {' or '.join(names)} (an attribute or "
                "hyperparameter): name the model's learning rate with attr_name"
            )
        return found[0]

    def draw(self, trainer: L.Trainer) -> Path | None:
        """The loss against the learning rate, the suggestion marked, as <run folder>/lr_find.png (rank zero)."""
        folder = trainer.log_dir  # a collective under DDP: every rank asks
        if not self.optimal_lr.results.get("lr") or folder is None or "://" in str(folder):
            return None  # no losses, or a logger's folder elsewhere (s3://...)
        path = Path(folder) / PLOT
        if trainer.is_global_zero:
            from matplotlib.figure import Figure  # drawn without pyplot: no display, no global state

            figure = Figure(figsize=(6, 4))
            self.optimal_lr.plot(suggest=True, ax=figure.subplots())
            write_atomically(path, lambda stream: figure.savefig(stream, format="png", dpi=100))
        return path


def report(suggestion: float | None, configured: Any, applied: bool, plot: Path | None, name: str) -> str:
    """The finder's one line: what it suggests, what the run trains at, where its curve is."""
    curve = f"; the curve: {redact(str(plot))}" if plot is not None else ""
    if suggestion is None:
        return f"lr_find: too few finite losses for a suggestion; training at {name} {configured}{curve}"
    then = f"training at it (model {name})" if applied else f"training at {name} {configured} (update_attr false)"
    return f"lr_find: the loss fell fastest at lr {suggestion:.3g}; {then}{curve}"
