"""The template's own callbacks, each a named section of the config (configs/default.yaml's `callbacks:`), as
LightningCLI adds callbacks that a config can see and change (`add_lightning_class_args`):

    --callbacks.best_checkpoint.monitor val/loss     one argument of one callback, one line
    --callbacks.threads null                          left out
    --callbacks.speed MyMonitor                       another class in its place
    --trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar    your own, beside them

All of them appear in `--print_config` and in each run's config.yaml. A callback in `trainer.callbacks` of the
same class (for checkpoints: the same file name) stands in for the template's: a config written before the
sections existed, which restated the whole list, keeps working.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser

SECTIONS = (
    "best_checkpoint",
    "last_checkpoint",
    "lr_monitor",
    "speed",
    "preemption",
    "hparams",
    "skipped",
    "threads",
    "baseline",
    "early_stopping",
)


def add_callback_sections(parser: LightningArgumentParser) -> None:
    """`callbacks.<name>` for each of SECTIONS: any Callback subclass, or null."""
    for name in SECTIONS:
        parser.add_lightning_class_args(Callback, f"callbacks.{name}", subclass_mode=True, required=False)


def same_role(ours: Callback, theirs: Callback) -> bool:
    """Whether a callback of `trainer.callbacks` does what one of the sections does (so it replaces it)."""
    if isinstance(ours, ModelCheckpoint) and isinstance(theirs, ModelCheckpoint):
        return ours.filename == theirs.filename  # a user's plain ModelCheckpoint stands in for our LastCheckpoint
    return type(ours) is type(theirs)


def chosen(sections: Sequence[Callback | None], configured: Sequence[Callback], checkpoints: bool) -> list[Callback]:
    """The sections' callbacks to add beside the configured ones: none left out by null, none that a configured
    callback stands in for (one line names them), and no ModelCheckpoint when `checkpoints` is False."""
    kept, replaced = [], []
    for callback in sections:
        if callback is None or (not checkpoints and isinstance(callback, ModelCheckpoint)):
            continue
        if any(same_role(callback, other) for other in configured):
            replaced.append(type(callback).__name__)
            continue
        kept.append(callback)
    if replaced:
        print(f"trainer.callbacks holds its own {', '.join(replaced)}: the template's are left out", file=sys.stderr)
    return kept
