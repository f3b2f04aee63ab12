"""An exponential moving average of the weights: Lightning 2.6's `EMAWeightAveraging`, composed with the
template (configs/callbacks/ema.yaml).

Lightning's callback keeps the average beside the model, updated after every optimizer step; validation runs on
the average, every checkpoint holds it as `state_dict` (so best.ckpt is chosen by the average's val/acc and holds
it, and evaluate, predict and export read it as any checkpoint) with the live weights as `current_model_state` to
resume from, and the model holds the average when training ends. Three changes make it compose with the template:

- The average leaves the model when validation has ended, not at its epoch's end (which Lightning's callbacks reach
  before the model's own): the model's epoch end then fits the calibration temperature of the weights it validated
  (project/tasks/calibration.py), where Lightning's order fitted none. What validation wrote into buffers (that
  temperature) is kept by the live weights too, or the average would pull it back to their unfitted value.
- A checkpoint is restored whole (live weights and average) only to resume a fit. Lightning's also put the live
  weights into a model that a test after fit loads from best.ckpt (train.py): the test then measured the live
  weights, not the averaged ones the checkpoint was chosen by.
- A checkpoint's live weights and average are checked before they are loaded (names, shapes, finite values), as
  its `state_dict` is: a damaged or hostile file is one line.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging as LightningEMA
from lightning.pytorch.trainer.states import TrainerFn

from project.callbacks.checkpoint_shape import a, check_state_names, is_count, plain, quoted
from project.errors import UserError
from project.tasks.weights import check_finite, same_kind

LIVE, AVERAGING = "current_model_state", "averaging_state"  # Lightning's keys beside `state_dict`


class EMAWeightAveraging(LightningEMA):
    """Lightning's `EMAWeightAveraging`: the average validates, is saved as the checkpoint's weights, and is the
    model when training ends; the live weights train.

    Args:
        decay: how much of the average each update keeps; it averages about the last 1 / (1 - decay) steps.
        update_every_n_steps: update the average after every n-th optimizer step.
        update_starting_at_step: the first step that updates it (null: the first); until then it holds the
            initial weights.
        update_starting_at_epoch: also update it at the end of each epoch from this one (null: never).
        device: where the average is kept (null: beside the model; "cpu" saves accelerator memory).
        use_buffers: average the buffers too (batch norm's statistics); false copies them.
    """

    def __init__(
        self,
        *,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        device: str | None = None,
        use_buffers: bool = True,
    ) -> None:
        if not 0 <= decay < 1:
            raise UserError(f"EMAWeightAveraging's decay is {decay}: it must be at least 0 and below 1")
        super().__init__(
            device=device,
            use_buffers=use_buffers,
            decay=decay,
            update_every_n_steps=update_every_n_steps,
            update_starting_at_step=update_starting_at_step,
            update_starting_at_epoch=update_starting_at_epoch,
        )
        self._validating: list[torch.Tensor] | None = None  # the average's buffers as validation found them

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            # the template's models make every layer in __init__ (configure_model only sets a memory format or
            # compiles), so the average holds them all: Lightning's warning, for sharded layers, does not apply
            warnings.filterwarnings("ignore", message=".*overrides the configure_model")
            super().setup(trainer, pl_module, stage)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is None or self._validating is not None:
            return
        self._swap_models(pl_module)  # the average validates
        self._validating = [buffer.clone() for buffer in pl_module.buffers()]

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Nothing yet: the model's own epoch end, after this, fits what it fits to the weights it validated."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The live weights back into the model (before the checkpoints save: Lightning runs them last), with
        the buffers validation changed."""
        if self._average_model is None or self._validating is None:
            return
        self._swap_models(pl_module)
        average = self._average_model.module.buffers()
        for before, fitted, live in zip(self._validating, average, pl_module.buffers(), strict=True):
            if not torch.equal(before, fitted):
                live.data.copy_(fitted.data)
        self._validating = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self._average_model is None or self._validating is None:
            super().on_save_checkpoint(trainer, pl_module, checkpoint)
            return
        # saved during validation (a DataLoader worker died there): the model holds the average, the average the
        # live weights
        checkpoint[LIVE] = self._average_model.module.state_dict()
        checkpoint[AVERAGING] = {"n_averaged": self._average_model.n_averaged.clone()}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Resuming a fit: the live weights into the model, the checkpoint's weights into the average. Any other
        stage keeps the checkpoint's weights (the average) in the model."""
        if trainer.state.fn != TrainerFn.FITTING or self._average_model is None:
            return
        if LIVE in checkpoint or AVERAGING in checkpoint:
            check_averaged_checkpoint(checkpoint, pl_module)
        super().on_load_checkpoint(trainer, pl_module, checkpoint)


def check_averaged_checkpoint(checkpoint: dict, pl_module: L.LightningModule) -> None:
    """A `UserError` naming what is wrong with a checkpoint's live weights or averaging state, where loading
    them would stop with torch's traceback or train on NaN."""
    own = pl_module.state_dict()
    parameters = {name for name, _ in pl_module.named_parameters()}
    for key in ("state_dict", LIVE):
        state = checkpoint.get(key)
        if not isinstance(state, dict):
            raise UserError(f"the checkpoint's {key} is {a(state)}, not a dict: the file is damaged")
        check_tensors(state, own, key)
        check_finite(state.items(), parameters, f"the checkpoint's {key}: ", "; use an earlier checkpoint")
    averaging = checkpoint.get(AVERAGING)
    count = averaging.get("n_averaged") if isinstance(averaging, dict) else None
    if not is_update_count(count):
        raise UserError(f"the checkpoint's {AVERAGING} holds no count of updates (n_averaged): the file is damaged")
    if set(averaging) != {"n_averaged"}:
        raise UserError(f"the checkpoint's {AVERAGING} holds {quoted(sorted(averaging))}: the file is damaged")


def is_update_count(count: Any) -> bool:
    """Whether `count` is what `AveragedModel` keeps as `n_averaged`: one integer of a plain tensor of no dimension
    (the buffer it loads into), not negative."""
    if not isinstance(count, torch.Tensor) or not plain(count) or count.shape != ():
        return False
    integer = not (count.is_floating_point() or count.is_complex() or count.dtype == torch.bool)
    return integer and is_count(int(count))


def check_tensors(state: Mapping[str, Any], own: Mapping[str, torch.Tensor], key: str) -> None:
    """Every tensor the model has, of its shape, and no other (`check_state_names`)."""
    check_state_names(state, own)
    for name, value in state.items():
        if name.endswith("_extra_state"):  # a module's own extra state, which its set_extra_state reads
            continue
        if not isinstance(value, torch.Tensor) or not plain(value) or value.shape != own[name].shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else a(value)
            raise UserError(
                f"the checkpoint's {key}.{quoted(name)} is {shape}, this model's {tuple(own[name].shape)}: it was "
                "trained with other settings, or the file is damaged"
            )
        if not same_kind(value, own[name]):
            raise UserError(
                f"the checkpoint's {key}.{quoted(name)} holds {value.dtype} values, this model's "
                f"{own[name].dtype}: the file is damaged"
            )
