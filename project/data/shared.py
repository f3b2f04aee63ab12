"""Batch memory a DataLoader worker reuses: the hand-over of large batches without new shared memory each time.

A worker hands a tensor to the training process through shared memory. torch's DataLoader makes a new
shared-memory file for every batch, and the kernel gives each of its pages to the worker zeroed: for a
batch of 128 photographs at 224 px (19 MB) that costs 25-30 ms of the worker's CPU, some 0.2 ms a sample,
a sixth of decoding them (benchmarks/README.md). Here a worker writes its batches into a few shared buffers
that it keeps (`pooled_empty`), and the training process hands each buffer back as it receives the batch:
it copies the tensor out while unpickling it (`Batch.__setstate__` calls `Lease.receive`), then marks the
buffer free (`Lease.release`). No one outside this module ever holds a view of a pooled buffer in the
training process, so a buffer the worker rewrites is never one that a model, a callback or a user still reads.

The copy costs the training process about what mapping a new file cost it before (its pages are faulted in
either way); with `pin_memory` the pin thread makes one more copy. A buffer that is never received (its
batch dropped in the worker) stays taken: the worker makes another, up to `SLOTS`, then new shared memory
for each batch as torch does. Outside a worker (`num_workers=0`) batches are made in ordinary memory.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

SLOTS = 4  # buffers a worker keeps: the DataLoader's prefetch (2 a worker) in flight, one being received, one spare
FREE, TAKEN = 0, 1
NUMPY_COPIES = frozenset(
    {
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.bool,
    }
)


class Lease(NamedTuple):
    """A pooled tensor on its way to the training process, with the flag that gives its buffer back."""

    tensor: torch.Tensor
    flags: torch.Tensor  # int32 [SLOTS] in shared memory: the worker's flag of each buffer
    slot: int

    def receive(self) -> torch.Tensor:
        """In the training process: the tensor copied into this process's own memory, strides kept (a
        channels-last batch stays channels-last). The buffer stays the worker's until `release`."""
        copy = torch.empty_like(self.tensor, memory_format=torch.preserve_format)
        if self.tensor.dtype in NUMPY_COPIES:
            # numpy's copy is one thread; torch's, on the trainer's threads, spins them all for a memcpy
            # (10 ms of CPU against 1 ms for a 19 MB batch on 2 threads)
            np.copyto(copy.numpy(), self.tensor.numpy())
        else:
            copy.copy_(self.tensor)
        return copy

    def release(self) -> None:
        """Give the buffer back to its worker: once every tensor viewing it has been received."""
        self.flags[self.slot] = FREE


class _Pool:
    """One worker's buffers: shared-memory storages and a shared flag for each (TAKEN from `take` until the
    training process's `Lease.receive`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.flags = torch.zeros(SLOTS, dtype=torch.int32).share_memory_()
        self.storages: list[torch.UntypedStorage | None] = [None] * SLOTS
        self.owner: dict[int, int] = {}  # a storage's data pointer: its slot

    def take(self, nbytes: int) -> torch.UntypedStorage:
        """A free buffer of at least `nbytes` (made or remade to that size if none fits), or a new unpooled
        shared storage when every slot is taken."""
        free = [slot for slot in range(SLOTS) if int(self.flags[slot]) == FREE]
        if not free:
            return torch.UntypedStorage._new_shared(nbytes)
        fitting = [slot for slot in free if self.storages[slot] is not None and self.storages[slot].nbytes() >= nbytes]
        slot = fitting[0] if fitting else free[0]
        if not fitting:
            old = self.storages[slot]
            if old is not None:
                del self.owner[old.data_ptr()]
            self.storages[slot] = torch.UntypedStorage._new_shared(nbytes)
            self.owner[self.storages[slot].data_ptr()] = slot
        self.flags[slot] = TAKEN
        return self.storages[slot]

    def lease(self, tensor: torch.Tensor) -> Lease | None:
        """The lease of a tensor that views one of this pool's buffers; None for any other tensor."""
        slot = self.owner.get(tensor.untyped_storage().data_ptr())
        return None if slot is None else Lease(tensor, self.flags, slot)


_pool: _Pool | None = None


def worker_pool() -> _Pool | None:
    """This DataLoader worker's pool (made on first use); None outside a worker, unless `start_pool` made one
    in this process."""
    global _pool
    if _pool is not None and _pool.pid == os.getpid():
        return _pool
    if get_worker_info() is None:
        return None
    _pool = _Pool()
    return _pool


def start_pool() -> None:
    """Hand batches over as a worker does from this process, which is none (project/bench/stages.py)."""
    global _pool
    _pool = _Pool()


def pooled_empty(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised contiguous tensor for a batch: in a worker, a view of one of its reused shared
    buffers (handed back when the training process receives the batch); elsewhere, ordinary memory."""
    pool = worker_pool()
    if pool is None:
        return torch.empty(shape, dtype=dtype)
    count = math.prod(shape)
    storage = pool.take(count * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (count,)).view(shape)


def leased(tensor: torch.Tensor) -> Lease | None:
    """What `Batch.__getstate__` sends in a tensor's place when it views a buffer of this worker's pool."""
    return _pool.lease(tensor) if _pool is not None and _pool.pid == os.getpid() else None
