"""Checkpoints and config.yaml written atomically: a run killed at any moment leaves either the previous
complete file or the new complete file, never a torn one; and a torn checkpoint met anyway (written by an
older version, or by a disk that failed) is one line naming it instead of a traceback.

Lightning's `TorchCheckpointIO` serializes a checkpoint in memory, then writes it through an fsspec
transaction. On a local disk that transaction writes a temporary file in the *system's* temporary folder
(`tempfile.mkstemp()`, /tmp or $TMPDIR) and `shutil.move`s it onto the checkpoint: a rename where both are on
one filesystem, but a copy straight into the checkpoint where they are not (a tmpfs /tmp, a container whose
logs are a mounted volume), which a kill tears. Nothing is fsync'ed, and a killed save leaves its temporary
file behind in /tmp. LightningCLI's config.yaml (`SaveConfigCallback`, through jsonargparse) is opened for
writing, which empties it, then written. Here both are written to a temporary file in the destination's own
folder, flushed and fsync'ed, then renamed over the destination (`os.replace`, atomic on POSIX and Windows);
a temporary left by a killed writer on this machine is removed by the next save into that folder.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import IO, Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from project.data.atomic import write_atomically
from project.errors import UserError


def is_local(path: str | os.PathLike) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's `TorchCheckpointIO`, saving local checkpoints with `write_atomically` (remote ones, whose
    stores write an object whole, as Lightning does)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        write_atomically(path, lambda stream: self.write(checkpoint, stream))

    def write(self, checkpoint: dict[str, Any], stream: IO[bytes]) -> None:
        """Serialize `checkpoint` into the temporary file (a test slows this down to kill a run mid-write)."""
        torch.save(checkpoint, stream)


def use_atomic_checkpoints(strategy: Any) -> None:
    """Give a strategy `AtomicCheckpointIO` where it would use Lightning's plain `TorchCheckpointIO` (also
    inside a wrapper such as `AsyncCheckpointIO`); a checkpoint IO the user configured is kept."""
    io = strategy.checkpoint_io
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(io, _WrappingCheckpointIO) and type(io.checkpoint_io) is TorchCheckpointIO:
        io._checkpoint_io = AtomicCheckpointIO()  # noqa: SLF001 - its setter keeps a base once one is set


class AtomicSaveConfigCallback(SaveConfigCallback):
    """LightningCLI's `SaveConfigCallback`, writing config.yaml to a temporary file that is then renamed over
    it: evaluate, export and predict rebuild the model from it, and a config.yaml cut at a line boundary
    would still parse, without the keys it lost."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved or not self.save_to_log_dir or not self.overwrite or self.multifile:
            super().setup(trainer, pl_module, stage)
            return
        log_dir = trainer.log_dir  # every rank: a collective call
        if log_dir is None or not is_local(log_dir):
            super().setup(trainer, pl_module, stage)
            return
        final = self.config_filename
        if trainer.is_global_zero:
            config = self.parser.dump(self.config, skip_none=False)
            write_atomically(Path(log_dir) / final, lambda stream: stream.write(config.encode("utf-8")))
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


def check_checkpoint(path: str | os.PathLike, option: str = "--ckpt_path") -> None:
    """A `UserError` naming `path` when it is not a complete checkpoint: empty, or a zip archive (what
    torch.save writes) whose directory, written last at its end, is missing or unreadable (a torn write).
    Reads the directory only, not the tensors. A file of another format is left to the loader."""
    path = Path(path)
    reason = checkpoint_problem(path)
    if reason is None:
        return
    others = sorted(other.name for other in path.parent.glob("*.ckpt")
                    if other != path and checkpoint_problem(other) is None)  # fmt: skip
    then = f"resume from another checkpoint with --ckpt_path PATH (complete ones beside it: {', '.join(others)})"
    then = then if others else "there is no complete checkpoint beside it to resume from instead"
    raise UserError(f"{option}: {path} is not a complete checkpoint ({reason}): {then}, or move it away "
                    "to start over")  # fmt: skip


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint, or None."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(4)
            if not head:
                return "it is empty"
            if head != b"PK\x03\x04":
                return None
            with zipfile.ZipFile(stream):
                return None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        return f"cut short or corrupt: {error}"
