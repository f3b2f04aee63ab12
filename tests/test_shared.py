"""A worker's reused batch buffers (project/data/shared.py): every batch the training process holds keeps its
values while the worker rewrites its buffers, the buffers are reused, and what is not pooled passes as before."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch.utils.data import DataLoader, IterableDataset

from project.data import shared
from project.data.batch import Batch
from project.data.workers import as_is
from project.tasks.image.batch import ImageBatch


class Filled(IterableDataset):
    """`count` batches whose images are pooled buffers filled with the batch's number, each with how many
    buffers the worker's pool holds by then and whether the image went out leased."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        for number in range(self.count):
            image = shared.pooled_empty((4, 6, 6, 3))
            image.fill_(number)
            pool = shared.worker_pool()
            lease = shared.leased(image)
            sent = [int(lease is not None), int(lease is not None and lease.tensor is None)]
            made = torch.tensor([len(pool.owner), *sent, int(lease is not None and lease.state is None)])
            yield ImageBatch(image=image.permute(0, 3, 1, 2), label=made)


def test_batches_held_by_the_trainer_keep_their_values_while_the_worker_reuses_its_buffers():
    loader = DataLoader(Filled(12), batch_size=None, num_workers=1, collate_fn=as_is, prefetch_factor=2)
    held = list(loader)  # every batch kept: a rewritten buffer would show in an earlier one
    assert [int(batch.image.float().mean()) for batch in held] == list(range(12))
    assert all(batch.image.unique().tolist() == [number] for number, batch in enumerate(held))
    assert not any(batch.image.is_shared() for batch in held)  # copied out of the worker's buffer on receipt
    assert all(batch.image.is_contiguous(memory_format=torch.channels_last) for batch in held)
    buffers = [int(batch.label[0]) for batch in held]
    assert all(int(batch.label[1]) for batch in held)  # every batch went out in one of the pool's buffers
    assert max(buffers) <= shared.SLOTS and buffers[-1] < 12  # reused, not one per batch
    # a buffer's first batch sends its file descriptor; the training process keeps it mapped, so each later
    # batch in that buffer sends only its slot
    by_reference = [int(batch.label[2]) for batch in held]
    assert by_reference.count(0) == buffers[-1] and by_reference[-1] == 1
    assert [int(batch.label[3]) for batch in held][-1] == 1  # the buffers' flags were sent once


def test_large_buffers_send_their_memory_with_each_batch_and_the_values_hold(monkeypatch):
    monkeypatch.setattr(shared, "MAPPED_BYTES", 0)  # the training process's choice: keep none mapped
    held = list(DataLoader(Filled(8), batch_size=None, num_workers=1, collate_fn=as_is, prefetch_factor=2))
    assert [int(batch.image.float().mean()) for batch in held] == list(range(8))
    assert all(int(batch.label[1]) and not int(batch.label[2]) for batch in held)  # pooled, never by reference


def _lease_of(pool: shared._Pool, value: int) -> shared.Lease:
    tensor = torch.empty(0, dtype=torch.uint8).set_(pool.take(16)).view(4, 4)
    return pool.lease(tensor.fill_(value))


def test_the_mappings_of_exited_workers_are_dropped_and_past_the_limit_leases_carry_their_memory(monkeypatch):
    mappings = shared._Mappings()
    monkeypatch.setattr(shared, "_mappings", mappings)
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    gone = shared._Pool()
    gone.pid = int(exited.stdout)  # a worker that has exited since
    lease = _lease_of(gone, 1)
    assert torch.equal(lease.receive(), torch.full((4, 4), 1, dtype=torch.uint8))
    lease.release()
    assert list(mappings.pools) == [gone.token]
    live = shared._Pool()
    lease = _lease_of(live, 2)
    lease.receive(), lease.release()
    assert list(mappings.pools) == [live.token]  # the exited worker's buffers are let go
    again = _lease_of(live, 3)
    assert again.tensor is None and again.state is None  # now sent by reference
    assert torch.equal(again.receive(), torch.full((4, 4), 3, dtype=torch.uint8))
    again.release()
    assert int(live.flags[again.slot]) == shared.FREE
    monkeypatch.setattr(shared, "MAX_POOLS", 1)
    other = shared._Pool()
    lease = _lease_of(other, 4)
    assert torch.equal(lease.receive(), torch.full((4, 4), 4, dtype=torch.uint8))
    lease.release()
    assert int(other.flags[lease.slot]) == shared.FREE and other.token not in mappings.pools
    assert _lease_of(other, 5).tensor is not None  # not mapped: its memory travels with each batch


def test_a_lease_copies_out_and_frees_its_buffer_and_a_full_pool_falls_back_to_new_memory():
    pool = shared._Pool()
    storage = pool.take(4 * 6 * 6 * 3)
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage).view(4, 6, 6, 3).permute(0, 3, 1, 2)
    tensor.fill_(7)
    lease = pool.lease(tensor)
    assert lease is not None and int(pool.flags[lease.slot]) == shared.TAKEN
    received = lease.receive()
    assert int(pool.flags[lease.slot]) == shared.TAKEN  # until every field viewing it is copied
    lease.release()
    assert int(pool.flags[lease.slot]) == shared.FREE
    assert torch.equal(received, tensor) and received.data_ptr() != tensor.data_ptr()
    assert received.stride() == tensor.stride()  # channels-last stays channels-last
    assert pool.take(10).data_ptr() == storage.data_ptr()  # a free buffer that fits is reused
    bigger = pool.take(10_000)  # none fits among the free ones: a buffer remade at the larger size
    assert bigger.nbytes() >= 10_000 and pool.lease(torch.empty(0, dtype=torch.uint8).set_(bigger)) is not None
    pool.flags.fill_(shared.TAKEN)
    spare = pool.take(100)  # every buffer under way: new shared memory, not leased
    assert spare.is_shared() and pool.lease(torch.empty(0, dtype=torch.uint8).set_(spare)) is None


def test_outside_a_worker_batches_are_ordinary_memory_and_pickle_as_before():
    image = shared.pooled_empty((2, 3, 3, 3))
    assert not image.is_shared() and shared.leased(image) is None
    batch = ImageBatch(image=image.fill_(5), label=torch.zeros(2, dtype=torch.long))
    again = Batch.__new__(ImageBatch)
    again.__setstate__(batch.__getstate__())
    assert torch.equal(again.image, batch.image)
