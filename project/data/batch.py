"""What every batch carries, whatever the task: its samples' keys and the samples left out of it.

A task's batch is a dataclass that extends `Batch` with its own tensors (`ImageBatch` adds `image` and
`label`). Lightning moves dataclasses to the device field by field, and the DataLoader pins them through
`pin_memory`, so a typed batch costs nothing over a dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

import torch


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
        skipped: the samples planned for this batch that were left out (unreadable or undecodable).
    """

    keys: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def pin_memory(self) -> Batch:
        """A copy whose tensors are in page-locked memory (the DataLoader calls this with pin_memory=True)."""
        pinned = {
            item.name: value.pin_memory()
            for item in dataclasses.fields(self)
            if isinstance(value := getattr(self, item.name), torch.Tensor)
        }
        return dataclasses.replace(self, **pinned)
