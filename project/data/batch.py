"""What every batch carries, whatever the task: its samples' keys and shards, and the samples left out of it.

A task's batch is a dataclass that extends `Batch` with its own tensors (`ImageBatch` adds `image` and
`label`). Lightning moves a batch to the device through its `to`, and the DataLoader pins it through
`pin_memory`, so a typed batch costs nothing over a dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from project.data.shared import Lease, leased

INLINE_BYTES = 256 * 1024  # tensors up to this size cross from a worker inside the pickle, not through shared memory
BLOCKING_DEVICE_TYPES = ("cpu", "mps")  # copies to these are not issued non-blocking (as Lightning's own transfer)
PLAIN = (str, bytes, int, float, bool, type(None))  # what a batch's other fields hold: nothing to move


class Skipped(NamedTuple):
    """A sample the stream could not read or the task could not decode, left out of its batch."""

    url: str  # the shard
    key: str  # the sample's key, or "sample N" when the shard broke before its key could be read
    reason: str


@dataclass(kw_only=True)
class Batch:
    """The fields the core fills in after the task's `collate`; a task's batch adds its own.

    Attributes:
        keys: the sample keys of the batch's rows, in order.
        urls: the shard of each row, in order.
        skipped: the samples planned for this batch that were left out (unreadable or undecodable).
    """

    keys: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def __getstate__(self) -> dict[str, Any]:
        """Small CPU tensors travel inside the pickle, as bytes: a worker hands a tensor to the training
        process through a shared-memory file by default, which costs a file, a mapping and a descriptor
        sent over a socket for each tensor (for a text batch of 64 that was more than tokenizing it)."""
        state = self.__dict__.copy()
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and (lease := leased(value)) is not None:
                state[name] = lease  # a worker's reused buffer, copied out and given back on receipt (shared.py)
            elif (
                isinstance(value, torch.Tensor)
                and value.device.type == "cpu"
                and value.layout == torch.strided
                and not value.requires_grad
                and value.dtype != torch.bfloat16  # numpy has no bfloat16
                and value.nbytes <= INLINE_BYTES
            ):
                state[name] = _Inline(value.contiguous().numpy().tobytes(), str(value.dtype), tuple(value.shape))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        leases = [value for value in state.values() if isinstance(value, Lease)]
        for name, value in state.items():
            if isinstance(value, _Inline):
                state[name] = value.tensor()
            elif isinstance(value, Lease):
                state[name] = value.receive()
        for lease in leases:  # after every copy: two fields may view one buffer
            lease.release()
        self.__dict__.update(state)

    def to(self, device: torch.device | str) -> Batch:
        """A copy with its tensors on `device`. Lightning moves a batch through this one call; without it, its
        generic transfer walks every key and url of the batch (1 ms a step on a CPU). Fields that are neither
        tensors nor plain values (a task's own nested tensors) are moved as Lightning would move them."""
        device = torch.device(device)
        non_blocking = device.type not in BLOCKING_DEVICE_TYPES
        moved = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, torch.Tensor):
                moved[item.name] = value.to(device, non_blocking=non_blocking)
            elif not _plain(value):
                moved[item.name] = move_data_to_device(value, device)
        return self._with(moved)

    def pin_memory(self) -> Batch:
        """A copy whose tensors are in page-locked memory (the DataLoader calls this with pin_memory=True)."""
        pinned = {
            item.name: value.pin_memory()
            for item in dataclasses.fields(self)
            if isinstance(value := getattr(self, item.name), torch.Tensor)
        }
        return self._with(pinned)

    def _with(self, changes: dict[str, Any]) -> Batch:
        """A copy with `changes` to its fields. Not through __init__ (dataclasses.replace): a task's field declared
        init=False could not be given, and its __post_init__ would run again; nor copy.copy, which would pickle
        through __getstate__."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, **changes)
        return copy


def _plain(value: Any) -> bool:
    """A value with no tensor to move: a plain value, or a list or tuple of them (keys, urls, skipped samples)."""
    if isinstance(value, (list, tuple)):
        return all(isinstance(item, (*PLAIN, Skipped)) for item in value)
    return isinstance(value, PLAIN)


class _Inline(NamedTuple):
    """A small tensor as the bytes of its data (see `Batch.__getstate__`)."""

    data: bytes
    dtype: str  # "torch.int64"
    shape: tuple[int, ...]

    def tensor(self) -> torch.Tensor:
        dtype = getattr(torch, self.dtype.removeprefix("torch."))
        array = np.frombuffer(bytearray(self.data), dtype=torch.empty((), dtype=dtype).numpy().dtype)
        return torch.from_numpy(array).reshape(self.shape)
