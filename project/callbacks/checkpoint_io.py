"""Checkpoint files: written whole or not at all, and loaded without running code.

Writing. Lightning's `TorchCheckpointIO` serializes a checkpoint in memory, then writes it through an fsspec
transaction. On a local disk that transaction writes a temporary file in the *system's* temporary folder
(`tempfile.mkstemp()`, /tmp or $TMPDIR) and `shutil.move`s it onto the checkpoint: a rename where both are on
one filesystem, but a copy straight into the checkpoint where they are not (a tmpfs /tmp, a container whose
logs are a mounted volume), which a kill tears. Nothing is fsync'ed, and a killed save leaves its temporary
file behind in /tmp. Here a checkpoint is written through `project.data.atomic.write_atomically`; a torn one
met anyway (written by an older version, or by a disk that failed) is one line naming it.

Loading. A checkpoint is a pickle, and unpickling runs whatever code the file names. Lightning loads an
http(s) checkpoint with `weights_only=False`, and a local one with torch's default, which
`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` or a torch build without weights-only loading turns off. Here every
load is `weights_only=True` (tensors and plain data only), and a URL is first downloaded to a local file in
a folder of this user's alone, stopped past its Content-Length and past `LIGHTNING_SHARDS_MAX_CHECKPOINT_GB`
(a server may send a body that never ends); a download refused then, or refused as a checkpoint, is removed.
What is loaded is checked for a Lightning checkpoint's structure before Lightning reads it (checkpoint_shape.py).
"""

from __future__ import annotations

import math
import os
import pickle
import sys
import zipfile
from pathlib import Path
from typing import IO, Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from project.callbacks.checkpoint_pickle import pickle_problem
from project.callbacks.checkpoint_shape import checked_contents
from project.callbacks.checkpoint_stage import check_for_trainer
from project.data.atomic import write_atomically
from project.data.bounded import Limit
from project.data.private import private_folder
from project.data.remote import NETWORK_ERRORS, cached
from project.errors import UserError
from project.redact import redact

DOWNLOADS = "checkpoints"  # the private folder of downloaded checkpoints
DOWNLOADS_BYTES = 20 * 10**9  # the least recently used downloads go beyond this
MAX_GB_VARIABLE = "LIGHTNING_SHARDS_MAX_CHECKPOINT_GB"
MAX_GB = 8.0  # a checkpoint download stops past this: a large model's weights with its optimizer's state fit
downloaded: set[Path] = set()  # this process's copies of checkpoint URLs: removed when a load refuses one


def download_limit() -> Limit:
    """The most bytes a checkpoint download may bring: `LIGHTNING_SHARDS_MAX_CHECKPOINT_GB` (GB, 10^9 bytes)."""
    text = os.environ.get(MAX_GB_VARIABLE, "").strip()
    try:
        gb = float(text) if text else MAX_GB
    except ValueError:
        gb = math.nan
    if not (0 < gb < math.inf):
        raise UserError(f"{MAX_GB_VARIABLE} must be a positive number of GB (10^9 bytes), got {text!r}")
    return Limit(int(gb * 1e9), f"the most {MAX_GB_VARIABLE} allows ({gb:g} GB): set it higher for a larger checkpoint")


def is_local(path: str | os.PathLike) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def local_checkpoint(path: str | os.PathLike, option: str = "--ckpt_path") -> Path:
    """The local file of a checkpoint: `path` itself, or a URL's copy, downloaded once into a folder of this
    user's alone (`project.data.private`), the least recently used copies removed past 20 GB."""
    if is_local(path):
        return Path(str(path).removeprefix("file://"))
    url, limit = str(path), download_limit()
    try:
        copy = cached(url, private_folder(DOWNLOADS), DOWNLOADS_BYTES, limit)
    except (*NETWORK_ERRORS, UserError) as error:  # the download's temporary file is removed (write_atomically)
        raise UserError(f"{option} {redact(url)}: cannot download it: {error}") from None
    downloaded.add(copy)
    print(f"{option}: {redact(url)} is downloaded to {copy}", file=sys.stderr)
    return copy


def load_checkpoint_file(path: str | os.PathLike, option: str = "--ckpt_path", map_location: Any = "cpu") -> dict:
    """A checkpoint's contents, read with `weights_only=True` and checked for a Lightning checkpoint's structure
    (`checked_contents`): a file that needs anything else to load (a class, a function: code) or that is no
    Lightning checkpoint is refused in one line, never run; a downloaded copy that is refused is removed."""
    local = local_checkpoint(path, option)
    try:
        return checked_contents(read_weights(local, path, option, map_location), f"{option} {redact(str(path))}")
    except UserError:
        if local in downloaded:  # a refused download leaves nothing cached
            local.unlink(missing_ok=True)
            downloaded.discard(local)
        raise


def read_weights(local: Path, path: str | os.PathLike, option: str, map_location: Any) -> Any:
    """`torch.load(weights_only=True)` of `local` (the file of `path`), its errors one line; first its pickles are
    measured (checkpoint_pickle.py): plain data that would cost without bound to unpickle, hash or walk is refused."""
    try:
        if problem := pickle_problem(local):
            raise UserError(f"{option} {redact(str(path))}: refused: {problem} (a bomb, or a damaged file)")
        return torch.load(local, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        # torch's message is advice to load it anyway; the line naming what the file asks for is the reason
        reason = next((line for line in lines if "GLOBAL" in line or "global" in line), lines[0] if lines else "")
        raise UserError(
            f"{option} {redact(str(path))}: refused: it holds more than tensors and plain data, and "
            f"loading it would run code ({reason})"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise UserError(f"{option} {redact(str(path))}: not a readable checkpoint ({error})") from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's `TorchCheckpointIO`, saving local checkpoints with `write_atomically` (remote ones, whose
    stores write an object whole, as Lightning does) and loading every checkpoint with `load_checkpoint_file`;
    given its `strategy`, also checked for what the trainer's stage restores (`check_for_trainer`)."""

    def __init__(self, strategy: Any = None) -> None:
        super().__init__()
        self.strategy = strategy

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        write_atomically(path, lambda stream: self.write(checkpoint, stream))

    def write(self, checkpoint: dict[str, Any], stream: IO[bytes]) -> None:
        """Serialize `checkpoint` into the temporary file (a test slows this down to kill a run mid-write)."""
        torch.save(checkpoint, stream)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if is_local(path) and not Path(str(path).removeprefix("file://")).exists():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")  # as Lightning's, which callers expect
        if weights_only is False:
            raise UserError(f"{redact(str(path))}: loading a checkpoint with weights_only=False could run its code")
        checkpoint = load_checkpoint_file(path, map_location=map_location or "cpu")
        module = getattr(self.strategy, "_lightning_module", None)  # the strategy's, as Lightning connected it
        trainer = getattr(module, "_trainer", None)
        if trainer is not None:
            check_for_trainer(checkpoint, trainer, f"--ckpt_path {redact(str(path))}")
        return checkpoint


def use_atomic_checkpoints(strategy: Any) -> None:
    """Give a strategy `AtomicCheckpointIO` where it would use Lightning's plain `TorchCheckpointIO` (also
    inside a wrapper such as `AsyncCheckpointIO`); a checkpoint IO the user configured is kept."""
    io = strategy.checkpoint_io
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO(strategy)
    elif isinstance(io, _WrappingCheckpointIO) and type(io.checkpoint_io) is TorchCheckpointIO:
        io._checkpoint_io = AtomicCheckpointIO(strategy)  # noqa: SLF001 - its setter keeps a base once one is set


def check_checkpoint(path: str | os.PathLike, option: str = "--ckpt_path") -> None:
    """A `UserError` naming `path` when it is not a complete checkpoint: empty, or a zip archive (what
    torch.save writes) whose directory, written last at its end, is missing or unreadable (a torn write).
    Reads the directory only, not the tensors. A file of another format is left to the loader."""
    path = Path(path)
    reason = checkpoint_problem(path)
    if reason is None:
        return
    complete = [other.name for other in path.parent.glob("*.ckpt") if other != path and not checkpoint_problem(other)]
    beside = ", ".join(sorted(complete))
    then = f"resume from another checkpoint with --ckpt_path PATH (complete ones beside it: {beside})"
    then = then if complete else "there is no complete checkpoint beside it to resume from instead"
    raise UserError(f"{option}: {path} is not a complete checkpoint ({reason}): {then}, or move it away to start over")


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
