"""Decode threads (`data.decode_threads`): the same batches as one thread's, augmentation included, in the
training process and in workers; resume, errors and early stops; tasks whose draws are not thread-safe."""

from __future__ import annotations

import io
import logging
import threading

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from webdataset import TarWriter

from project.data.decode_threads import BatchRandom, batch_generator, ordered_map
from project.data.loader import EpochLoader
from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.data.specs import resolve_shards
from project.data.stream import ShardStream
from project.errors import DecodeError, UserError
from project.tasks.image.data import ImageShards
from project.tasks.image.task import ImageTask
from project.tasks.image.transforms import training_transform

from .conftest import CLASSES, image_data, image_task


@pytest.fixture
def shard_folder(tmp_path):
    """conftest's shard_folder, but each image a different pattern (PNG, lossless, 24 px): crops of different
    boxes differ, where a flat image's would not."""

    def make(sizes, name="train"):  # noqa: ANN001, ANN202
        folder, keys, shards = tmp_path / name, [], []
        folder.mkdir()
        for number, size in enumerate(sizes):
            path = folder / f"{name}-{number:06d}.tar"
            with TarWriter(str(path), encoder=False) as writer:
                for i in range(size):
                    keys.append(f"{name}{number}_{i:05d}")
                    pixels = np.random.default_rng([number, i]).integers(0, 256, (24, 24, 3), dtype=np.uint8)
                    buffer = io.BytesIO()
                    Image.fromarray(pixels).save(buffer, format="PNG")
                    writer.write({"__key__": keys[-1], "png": buffer.getvalue(), "cls": str(i % 3).encode()})
            shards.append(Shard(str(path), size, path.stat().st_size))
        write_index(folder / INDEX_NAME, shards, name=name, extra={"classes": CLASSES})
        return folder, keys

    return make


def stream_for(folder, task, *, train=True, threads=1, num_workers=0, **kwargs) -> ShardStream:
    return ShardStream(
        shards=resolve_shards(str(folder)).shards,
        task=task,
        stage="train" if train else "val",
        batch_size=4,
        num_workers=num_workers,
        shuffle_buffer=16,
        seed=7,
        decode_threads=threads,
        **kwargs,
    )


def epoch(stream: ShardStream, num_workers: int = 0, done: int = 0) -> list:
    """The epoch's batches through a DataLoader, or from batch `done` on, as a restored checkpoint starts it (the
    loader alone would start the epoch over)."""
    if done:
        stream.resume_after(done)
    batches = stream if done else EpochLoader(stream, num_workers=num_workers)
    return [(b.keys, b.image.clone(), b.label.clone()) for b in batches]


def assert_same(first: list, second: list) -> None:
    assert len(first) == len(second) > 0
    for (keys, image, label), (keys2, image2, label2) in zip(first, second, strict=True):
        assert keys == keys2 and torch.equal(label, label2)
        assert torch.equal(image, image2), f"the images of batch {keys} differ"


# a user's own v2 pipeline: its draws come from torch's default generator, per sample
USER_PIPELINE = v2.Compose([v2.RandomResizedCrop(8, antialias=True), v2.RandomHorizontalFlip(), v2.ColorJitter(0.4)])


@pytest.mark.parametrize("augment", ["light", "standard", USER_PIPELINE], ids=["light", "standard", "v2"])
def test_threads_give_the_batches_of_one_thread_augmentation_included(shard_folder, augment):
    folder, keys = shard_folder([10, 7, 13, 6])
    task = image_task(augment=augment)
    one = epoch(stream_for(folder, task))
    assert sorted(k for batch in one for k in batch[0]) == sorted(keys)  # 36: nine batches of 4
    for threads in (2, 3):
        assert_same(epoch(stream_for(folder, task, threads=threads)), one)
    other_seed = stream_for(folder, task, threads=2)
    other_seed.seed = 8
    assert epoch(other_seed)[0][0] != one[0][0]


def test_threads_in_workers_give_the_batches_of_one_thread_per_worker(shard_folder):
    folder, _ = shard_folder([10, 7, 13, 6])
    task = image_task()
    assert_same(epoch(stream_for(folder, task, threads=2, num_workers=2), 2), epoch(stream_for(folder, task), 2))


def test_evaluation_with_threads_reads_every_sample_once_in_order(shard_folder):
    folder, keys = shard_folder([7, 2, 9], name="val")
    task = image_task()
    threaded = epoch(stream_for(folder, task, train=False, threads=3))
    assert [k for batch in threaded for k in batch[0]] == keys
    assert_same(threaded, epoch(stream_for(folder, task, train=False)))


def test_a_resumed_threaded_epoch_is_the_rest_of_the_uninterrupted_one(shard_folder):
    folder, _ = shard_folder([10, 7, 13, 6])
    task = image_task()
    whole = epoch(stream_for(folder, task, threads=2))
    for done in (1, 5, 8):
        assert_same(epoch(stream_for(folder, task, threads=2), done=done), whole[done:])


def own(task_type: type[ImageTask]) -> ImageTask:
    """A task of a user's own, subclassing the image task (8 px, light augmentation, labels named by CLASSES)."""
    return task_type(image_size=8, train_transform=training_transform("light", 8), classes=CLASSES)


class Unsafe(ImageTask):
    """A user's task whose decode draws from torch's generator, not `batch_generator()`, so it says it is not
    thread-safe (as a task of its own does by default, `Task`'s)."""

    thread_safe = False

    def decode(self, sample, stage):  # noqa: ANN001, ANN201
        example = super().decode(sample, stage)
        noise = torch.randint(0, 50, example.pixels.shape, dtype=torch.uint8)
        return example._replace(pixels=example.pixels + noise)


def test_a_task_that_is_not_thread_safe_still_gets_the_batches_of_one_thread(shard_folder):
    folder, _ = shard_folder([10, 7, 13, 6])

    class UnsafeShards(ImageShards):
        task_type = Unsafe

    with pytest.warns(UserWarning, match="Unsafe is not thread_safe, so its batches decode one at a time"):
        data = UnsafeShards(root=None, image_size=8, augment="light", classes=CLASSES, num_workers=0, decode_threads=2)
    task = data.task
    assert type(task) is Unsafe
    assert_same(epoch(stream_for(folder, task, threads=3)), epoch(stream_for(folder, task)))


class Meeting(ImageTask):
    """Each decode waits for another thread's decode: only batches decoded at once get past it."""

    thread_safe = True
    meeting = threading.Barrier(2)

    def decode(self, sample, stage):  # noqa: ANN001, ANN201
        self.meeting.wait(timeout=10)  # a BrokenBarrierError (the sample skipped) unless two threads decode
        return super().decode(sample, stage)


def test_threads_decode_batches_at_the_same_time(shard_folder):
    folder, keys = shard_folder([8, 8])
    task = own(Meeting)
    batches = epoch(stream_for(folder, task, threads=2, skip_corrupt=False))
    assert sorted(k for batch in batches for k in batch[0]) == sorted(keys)


class Breaks(ImageTask):
    thread_safe = True

    def decode(self, sample, stage):  # noqa: ANN001, ANN201
        if sample["__key__"] == "val1_00003":
            raise DecodeError.of(sample, "broken on purpose")
        return super().decode(sample, stage)


def decode_threads_alive() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("decode")]


def test_an_error_in_a_decode_thread_is_raised_in_order_and_the_threads_stop(shard_folder):
    folder, keys = shard_folder([8, 8], name="val")
    task = own(Breaks)
    got = []
    with pytest.raises(DecodeError, match="broken on purpose"):
        for batch in stream_for(folder, task, train=False, threads=2, skip_corrupt=False):
            got.append(batch.keys)
    assert got == [keys[0:4], keys[4:8]]  # the batches before the broken one's, in order
    assert not decode_threads_alive()
    skipping = list(stream_for(folder, task, train=False, threads=2, skip_corrupt=True))
    assert [skipped.key for batch in skipping for skipped in batch.skipped] == ["val1_00003"]
    assert [key for batch in skipping for key in batch.keys] == keys[:11] + keys[12:]


def test_stopping_early_stops_the_decode_threads(shard_folder):
    folder, _ = shard_folder([10, 7, 13, 6])
    batches = iter(stream_for(folder, image_task(), threads=3))
    next(batches)
    assert decode_threads_alive()
    batches.close()
    assert not decode_threads_alive()


def test_ordered_map_keeps_order_and_takes_few_jobs_ahead():
    taken = 0

    def jobs():
        nonlocal taken
        for job in range(20):
            taken += 1
            yield job

    ahead = []
    for index, result in enumerate(ordered_map(lambda job: job * job, jobs(), threads=3)):
        assert result == index * index
        ahead.append(taken - index - 1)
    assert max(ahead) <= 3


def test_a_batch_draws_what_the_seeded_generator_would_whatever_else_draws_between():
    torch.manual_seed(11)
    expected = [torch.rand(3), torch.rand(2)]
    random = BatchRandom(11)
    with random.current():  # in a decode thread: the task's draws in decode
        first = torch.rand(3, generator=batch_generator())
    torch.manual_seed(5)
    before = torch.rand(4, generator=torch.Generator().manual_seed(5))
    with random.continued():  # collate, in the loader's thread: the default generator continues the batch's draws
        second = torch.rand(2)
    assert torch.equal(first, expected[0]) and torch.equal(second, expected[1])
    assert torch.equal(torch.rand(4), before)  # and is given back as it was
    assert batch_generator() is None  # outside a decode thread: torch's default one, which the stream seeds


def test_draws_of_the_users_own_between_batches_change_no_threaded_batch(shard_folder):
    """A callback of the user's that draws from torch's generator while the threads decode (found by trying
    one: torchvision's steps drew from the same generator, and 3-5 batches of 12 came out otherwise)."""
    folder, _ = shard_folder([10, 7, 13, 6])
    task = image_task(augment="standard")
    one = epoch(stream_for(folder, task))
    for _ in range(3):  # a race: the code before the fix failed about two epochs in three
        threaded = []
        for batch in stream_for(folder, task, threads=3):
            threaded.append((batch.keys, batch.image.clone(), batch.label.clone()))
            for _ in range(2000):
                torch.rand(3)  # the user's callback, in the training process's thread
        assert_same(threaded, one)


def test_decode_threads_must_be_positive():
    with pytest.raises(UserError, match="data.decode_threads must be positive, got 0"):
        image_task(decode_threads=0)


@pytest.mark.parametrize(
    ("augment", "told"), [("light", False), ("none", False), ("standard", True), (USER_PIPELINE, True)]
)
def test_fit_says_when_torchvisions_steps_run_one_batch_at_a_time(caplog, augment, told):
    data = image_data(augment=augment, decode_threads=2)
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    assert ("torchvision's per-sample steps run one batch at a time" in caplog.text) == told


@pytest.mark.parametrize("threads", [1, 2])
def test_fit_says_that_threads_read_texts_slower_than_one_thread(tmp_path, caplog, threads):
    from project.tasks.text import TextShards

    from .test_text import make_text_data

    data = TextShards(root=str(make_text_data(tmp_path)), num_workers=0, decode_threads=threads)
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    assert ("tokenizing holds Python's GIL, so threads read texts slower" in caplog.text) == (threads > 1)
