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

A buffer is mapped into the training process once: a worker's first batch in a buffer sends its file descriptor
(over a socket, with an authentication handshake: about 0.2 ms on each side), and the training process keeps the
mapping of buffers up to `MAPPED_BYTES` (`_Mappings`), so later batches in that buffer send only its slot. The
buffers' flags are sent once too. Larger buffers still send their descriptor with each batch: their copy costs
far more than it, and a mapping kept would hold that memory in the training process as well. Mappings of a
worker that has exited are dropped when the next worker's first batch arrives; at most `MAX_POOLS` workers' are
kept, and a worker past that sends its descriptors with each batch, as before.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

from project.data.workers import process_alive

SLOTS = 4  # buffers a worker keeps: the DataLoader's prefetch (2 a worker) in flight, one being received, one spare
MAPPED_BYTES = 8 * 2**20  # buffers up to this size stay mapped in the training process (a 32 px batch: 0.4 MB)
MAX_POOLS = 64  # workers whose buffers the training process keeps mapped at once
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
    """A pooled tensor on its way to the training process, with the flag that gives its buffer back.

    `tensor` and `state` travel through torch's shared memory (a file descriptor each) only while the training
    process does not hold them mapped (`_Mappings`); otherwise they are None and `layout` places the tensor in
    the buffer mapped before."""

    pool: int  # the worker's pool's token
    pid: int  # the worker's process
    slot: int
    generation: int  # of the slot's buffer: a buffer remade at another size is another generation
    tensor: torch.Tensor | None
    state: torch.Tensor | None  # int32 [2 * SLOTS] in shared memory: each buffer's flag, then its mapped generation
    layout: tuple  # (dtype, storage offset, shape, stride) of the tensor in the buffer

    def receive(self) -> torch.Tensor:
        """In the training process: the tensor copied into this process's own memory, strides kept (a
        channels-last batch stays channels-last). The buffer stays the worker's until `release`."""
        source = _mappings.receive(self)
        copy = torch.empty_like(source, memory_format=torch.preserve_format)
        if source.dtype in NUMPY_COPIES:
            # numpy's copy is one thread; torch's, on the trainer's threads, spins them all for a memcpy
            # (10 ms of CPU against 1 ms for a 19 MB batch on 2 threads)
            np.copyto(copy.numpy(), source.numpy())
        else:
            copy.copy_(source)
        return copy

    def release(self) -> None:
        """Give the buffer back to its worker: once every tensor viewing it has been received."""
        _mappings.flags(self)[self.slot] = FREE


class _Mapped(NamedTuple):
    """A worker's pool as the training process holds it: its shared state and its buffers kept mapped."""

    pid: int
    view: np.ndarray  # its shared state as numpy (which keeps it mapped): flags at [:SLOTS], then each buffer's
    # mapped generation, then whether the state is held
    buffers: dict[int, tuple[int, torch.UntypedStorage]]  # slot: (generation, storage)


class _Mappings:
    """The training process's side: the pools whose state (and small buffers) it holds mapped."""

    def __init__(self) -> None:
        self.pools: dict[int, _Mapped] = {}

    def receive(self, lease: Lease) -> torch.Tensor:
        """The lease's tensor: a view of the buffer mapped before, or the one it carries (then kept mapped, if
        small enough)."""
        mapped = self.pools.get(lease.pool) if lease.state is None else self._register(lease)
        if lease.tensor is None:
            generation, storage = mapped.buffers[lease.slot]  # the worker sends no tensor only for these
            dtype, offset, shape, stride = lease.layout
            return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
        if mapped is not None and lease.tensor.untyped_storage().nbytes() <= MAPPED_BYTES:
            mapped.buffers[lease.slot] = (lease.generation, lease.tensor.untyped_storage())
            mapped.view[SLOTS + lease.slot] = lease.generation  # the worker sends only the slot from now on
        return lease.tensor

    def flags(self, lease: Lease) -> np.ndarray | torch.Tensor:
        """The flags of the lease's pool's buffers."""
        mapped = self.pools.get(lease.pool)
        return mapped.view if mapped is not None else lease.state

    def _register(self, lease: Lease) -> _Mapped | None:
        """Keep a pool's state mapped (dropping those of workers that have exited first); None past MAX_POOLS."""
        if lease.pool in self.pools:
            return self.pools[lease.pool]
        for token in [token for token, mapped in self.pools.items() if not process_alive(mapped.pid)]:
            del self.pools[token]  # its buffers' memory goes with the last mapping
        if len(self.pools) >= MAX_POOLS:
            return None
        mapped = _Mapped(lease.pid, lease.state.numpy(), {})
        self.pools[lease.pool] = mapped
        mapped.view[2 * SLOTS] = 1  # the worker sends its state no more
        return mapped


_mappings = _Mappings()


class _Pool:
    """One worker's buffers: shared-memory storages and a shared flag for each (TAKEN from `take` until the
    training process's `Lease.release`), with the generation of each that the training process holds mapped."""

    def __init__(self) -> None:
        self.pid, self.token = os.getpid(), secrets.randbits(62)
        self.state = torch.zeros(2 * SLOTS + 1, dtype=torch.int32).share_memory_()
        self.view = self.state.numpy()  # read and written per batch: numpy's item access is ~50x cheaper
        self.flags = self.state[:SLOTS]
        self.storages: list[torch.UntypedStorage | None] = [None] * SLOTS
        self.generations = [0] * SLOTS
        self.owner: dict[int, int] = {}  # a storage's data pointer: its slot

    def take(self, nbytes: int) -> torch.UntypedStorage:
        """A free buffer of at least `nbytes` (made or remade to that size if none fits), or a new unpooled
        shared storage when every slot is taken."""
        free = [slot for slot in range(SLOTS) if self.view[slot] == FREE]
        if not free:
            return torch.UntypedStorage._new_shared(nbytes)
        fitting = [slot for slot in free if self.storages[slot] is not None and self.storages[slot].nbytes() >= nbytes]
        slot = fitting[0] if fitting else free[0]
        if not fitting:
            old = self.storages[slot]
            if old is not None:
                del self.owner[old.data_ptr()]
            self.storages[slot] = torch.UntypedStorage._new_shared(nbytes)
            self.generations[slot] += 1
            self.owner[self.storages[slot].data_ptr()] = slot
        self.view[slot] = TAKEN
        return self.storages[slot]

    def lease(self, tensor: torch.Tensor) -> Lease | None:
        """The lease of a tensor that views one of this pool's buffers; None for any other tensor."""
        slot = self.owner.get(tensor.untyped_storage().data_ptr())
        if slot is None:
            return None
        generation, state_known = self.generations[slot], self.view[2 * SLOTS] == 1
        mapped = state_known and self.view[SLOTS + slot] == generation
        layout = (tensor.dtype, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        return Lease(
            self.token,
            self.pid,
            slot,
            generation,
            None if mapped else tensor,
            None if state_known else self.state,
            layout,
        )


_pool: _Pool | None = None


def worker_pool() -> _Pool | None:
    """This DataLoader worker's pool (made on first use); None outside a worker, unless `pooled_as_a_worker`
    made one in this process."""
    global _pool
    if _pool is not None and _pool.pid == os.getpid():
        return _pool
    if get_worker_info() is None:
        return None
    _pool = _Pool()
    return _pool


@contextlib.contextmanager
def pooled_as_a_worker() -> Iterator[None]:
    """Within: this process, which is no DataLoader worker, makes and hands over its batches in a pool of reused
    buffers as a worker does (project/bench/stages.py; `released` frees a buffer as the trainer's receipt would)."""
    global _pool
    before, _pool = _pool, _Pool()
    try:
        yield
    finally:
        _pool = before


def released(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a tensor that views this process's pool, its buffer marked free as on receipt (the tensor
    itself where it views none)."""
    lease = leased(tensor)
    if lease is None:
        return tensor
    copy = tensor.clone(memory_format=torch.preserve_format)
    _pool.view[lease.slot] = FREE
    return copy


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
