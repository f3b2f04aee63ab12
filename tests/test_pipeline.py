"""The stream through a real DataLoader: exactly-once evaluation, duplicate-free and reproducible
training epochs, bounded buffers, and clear errors for bad shards."""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from project.data.batch import Batch
from project.data.loader import EpochLoader
from project.data.position import ResumePosition
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.data.stream import ShardStream, shuffled
from project.errors import DecodeError, ShardError
from project.tasks.image.batch import ImageBatch

from .conftest import image_data, image_task


def stream_for(folder, *, train, batch_size=4, num_workers=0, world_size=1, rank=0, **kwargs) -> ShardStream:
    stream = ShardStream(
        shards=resolve_shards(str(folder)).shards,
        task=image_task(),
        stage="train" if train else "val",
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle_buffer=kwargs.pop("shuffle_buffer", 16),
        **kwargs,
    )
    stream.set_topology(world_size, rank)
    return stream


def epoch_batches(stream: ShardStream, num_workers: int, epoch: int = 0) -> list[Batch]:
    stream.set_epoch(epoch)
    loader = EpochLoader(stream, num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == len(loader), "len(dataloader) disagrees with the batches it yields"
    return batches


def keys_of(batches: list[Batch]) -> list[str]:
    return [key for batch in batches for key in batch.keys]


def test_read_samples_starts_and_stops_mid_shard(shard_folder):
    folder, keys = shard_folder([9])
    url = str(folder / "train-000000.tar")
    assert [s["__key__"] for s in read_samples(url, 2, 5)] == keys[2:5]
    assert [s["__key__"] for s in read_samples(url, 7)] == keys[7:]
    sample = next(read_samples(url, 3, 4))
    assert set(sample) == {"__key__", "__url__", "jpg", "cls"}
    assert set(next(read_samples(url, extensions=frozenset()))) == {"__key__", "__url__"}
    assert set(next(read_samples(url, extensions=frozenset({"cls"})))) == {"__key__", "__url__", "cls"}


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_evaluation_sees_every_sample_exactly_once(shard_folder, world_size, num_workers):
    folder, keys = shard_folder([7, 2, 9], name="val")  # 18 samples: divides by neither 4 nor 3 ranks x 4
    seen = Counter()
    for rank in range(world_size):
        stream = stream_for(folder, train=False, num_workers=num_workers, world_size=world_size, rank=rank)
        seen.update(keys_of(epoch_batches(stream, num_workers)))
    assert set(seen) == set(keys) and set(seen.values()) == {1}


def test_training_epochs_never_repeat_change_order_and_reproduce(shard_folder):
    folder, keys = shard_folder([10, 7, 13, 6])  # 36 samples
    epochs = {}
    for epoch in (0, 1):
        batches = epoch_batches(stream_for(folder, train=True, num_workers=2, seed=5), 2, epoch)
        epochs[epoch] = keys_of(batches)
        assert len(epochs[epoch]) == len(set(epochs[epoch])) == 36  # 36 = 9 full batches of 4
        assert all(len(b) == 4 for b in batches)
    assert epochs[0] != epochs[1]
    again = epoch_batches(stream_for(folder, train=True, num_workers=2, seed=5), 2, 0)
    assert keys_of(again) == epochs[0]
    first = epoch_batches(stream_for(folder, train=True, num_workers=2, seed=5), 2, 0)[0]
    assert torch.equal(first.image, again[0].image), "augmentation is not reproducible"
    other_seed = keys_of(epoch_batches(stream_for(folder, train=True, num_workers=2, seed=6), 2, 0))
    assert other_seed != epochs[0]


def test_training_ranks_get_equal_batches_and_disjoint_samples(shard_folder):
    folder, keys = shard_folder([5, 11, 3])  # 19 samples, 2 ranks x batch 4: 2 batches each, 3 dropped
    per_rank = [
        epoch_batches(stream_for(folder, train=True, num_workers=2, world_size=2, rank=rank), 2) for rank in range(2)
    ]
    assert [len(b) for b in per_rank] == [2, 2]
    seen = keys_of(per_rank[0]) + keys_of(per_rank[1])
    assert len(seen) == len(set(seen)) == 16


def test_batches_are_typed_uint8_images_with_int64_labels(shard_folder):
    folder, keys = shard_folder([8])
    batch = epoch_batches(stream_for(folder, train=False), 0)[0]
    assert isinstance(batch, ImageBatch) and batch.keys == keys[:4] and batch.skipped == []
    assert batch.image.dtype == torch.uint8 and batch.image.shape == (4, 3, 8, 8)
    assert batch.label.dtype == torch.int64 and batch.label.tolist() == [0, 1, 2, 0]


def test_shuffle_buffer_holds_at_most_its_size():
    pulled = 0

    def source():
        nonlocal pulled
        for i in range(100):
            pulled += 1
            yield i

    held, out = [], []
    for item in shuffled(source(), 8, seed=0):
        out.append(item)
        held.append(pulled - len(out))
    assert max(held) < 8 and sorted(out) == list(range(100)) and out != list(range(100))


def test_the_shuffle_buffer_lets_its_samples_go_as_they_leave_and_never_holds_two_chunks():
    """Memory, not just the count pulled: a sample that has left the buffer is freed, and the next chunk is
    read only after the last one's samples are let go (a worker's heap then reuses their pages)."""

    class Item:  # a weakly referenceable sample
        def __init__(self, number: int) -> None:
            self.number = number

    alive: weakref.WeakSet = weakref.WeakSet()
    most = 0

    def source():
        nonlocal most
        for i in range(100):
            item = Item(i)
            alive.add(item)
            most = max(most, len(alive))  # as the buffer reads: the samples held then, this one included
            yield item
            del item

    seen = []
    for item in shuffled(source(), 8, seed=0):
        seen.append(item.number)
        del item
    assert most <= 8 and sorted(seen) == list(range(100))


def test_the_workers_receive_the_task_and_nothing_of_the_data_module(shard_folder):
    import pickle

    folder, keys = shard_folder([6], name="val")
    data = image_data(val=str(folder))
    pickled = pickle.dumps(data.loader("val").dataset)  # what each worker unpickles
    for name in (b"ImageShards", b"ResumePosition", b"SkipCount", b"ShardIndex", b"EpochLoader", b"lightning"):
        assert name not in pickled, name
    stream = pickle.loads(pickled)
    assert type(stream.task).__name__ == "ImageTask" and stream.task.classes == data.classes
    assert keys_of(epoch_batches(stream, 2)) == keys


def test_the_position_starts_a_restored_pass_once_and_an_evaluation_split_where_it_was_set(shard_folder):
    folder, _ = shard_folder([20])
    stream = stream_for(folder, train=True)  # 5 batches of 4
    planned = {"world_size": 1, "num_workers": 1, "mix_shards": 1}
    position = ResumePosition()
    assert position.pass_start(stream, 3) == (3, 0)
    position.restore({"epoch": 1, "batches": 2, "epoch_batches": 5, **planned})
    assert position.pass_start(stream, 0) == (1, 2)
    assert position.pass_start(stream, 0) == (0, 0)  # taken: the next pass starts its epoch
    position.restore({"epoch": 1, "batches": 5, "epoch_batches": 5, **planned})
    assert position.pass_start(stream, 0) == (2, 0)  # saved at the end of its epoch: the next one
    validation = stream_for(folder, train=False)
    position.start_split_at("val", 3)
    assert position.pass_start(validation, 4) == (4, 3)
    assert position.pass_start(validation, 4) == (4, 0)
    assert position.current(None, stream) == {}
    loader = EpochLoader(stream, position=position)
    position.restore({"epoch": 0, "batches": 3, "epoch_batches": 5, **planned})
    assert len(list(loader)) == 2  # the restored pass resumed at batch 3 of 5


def test_stale_index_is_a_clear_error(shard_folder):
    folder, _ = shard_folder([4, 4], name="val")
    index = folder / "shardindex.json"
    index.write_text(index.read_text().replace('"nsamples": 4', '"nsamples": 6', 1))
    with pytest.raises(ShardError, match="holds 4 samples, but its shard index says 6"):
        epoch_batches(stream_for(folder, train=False), 0)


def test_unreadable_shard_is_a_clear_error(shard_folder):
    folder, _ = shard_folder([4, 4], name="val")
    (folder / "val-000001.tar").write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(ShardError, match="cannot read shard .*val-000001.tar"):
        epoch_batches(stream_for(folder, train=False), 0)


def test_undecodable_image_names_the_sample_and_shard(shard_folder):
    folder, _ = shard_folder([3], name="val", extra_members={"jpg": b"not a jpeg"})
    with pytest.raises(DecodeError, match="cannot decode sample 'val0_00000' in shard .*val-000000.tar"):
        epoch_batches(stream_for(folder, train=False), 0)


def test_shards_stream_from_a_url_through_their_remote_index(shard_folder, tmp_path):
    import functools
    import http.server
    import threading

    folder, keys = shard_folder([5, 3], name="val")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/val/shardindex.json"
        index = resolve_shards(url)
        assert index.shards[0].url == f"http://127.0.0.1:{server.server_port}/val/val-000000.tar"
        stream = ShardStream(shards=index.shards, task=image_task(), stage="val", batch_size=4)
        assert sorted(keys_of(epoch_batches(stream, 2))) == sorted(keys)
    finally:
        server.shutdown()


@dataclass(kw_only=True)
class Mixed(Batch):
    tokens: torch.Tensor
    flags: torch.Tensor
    half: torch.Tensor
    brain: torch.Tensor
    strided: torch.Tensor
    large: torch.Tensor


def test_small_batch_tensors_cross_from_workers_inside_the_pickle_and_large_ones_through_shared_memory():
    """A worker's batch reaches the training process through multiprocessing's pickler: small tensors ride
    inside the pickle as bytes (a shared-memory file a tensor cost more than tokenizing a text batch),
    large ones still go through shared memory, and every tensor comes back equal, with its dtype and shape."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from project.data.batch import INLINE_BYTES, Skipped

    batch = Mixed(
        tokens=torch.arange(64 * 40, dtype=torch.int64).reshape(64, 40),
        flags=torch.tensor([True, False, True]),
        half=torch.randn(3, 5).half(),
        brain=torch.randn(4).bfloat16(),
        strided=torch.arange(20.0).reshape(4, 5).t(),  # not contiguous
        large=torch.ones(INLINE_BYTES // 4 + 1, dtype=torch.float32),
        keys=["a", "b"],
        skipped=[Skipped("u", "k", "why")],
    )
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(batch)
    payload = buffer.getvalue()
    assert batch.tokens.numpy().tobytes() in payload  # inline
    assert len(payload) < batch.tokens.nbytes + 64 * 1024  # the large tensor is not: it went to shared memory
    back = pickle.loads(payload)
    for name in ("tokens", "flags", "half", "brain", "strided", "large"):
        ours, theirs = getattr(batch, name), getattr(back, name)
        assert theirs.dtype == ours.dtype and theirs.shape == ours.shape and torch.equal(theirs, ours), name
    assert back.tokens.is_shared() is False and back.large.is_shared()
    back.tokens += 1  # a writable tensor of its own
    assert back.keys == ["a", "b"] and back.skipped == [Skipped("u", "k", "why")] and len(back) == 2
