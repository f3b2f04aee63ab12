"""Where the project's image loader spends its CPU time, stage by stage (`python -m project.bench`, and
benchmarks/peers.py on photographs).

Each stage runs alone in this process, one thread, on the same training samples as the loader's epoch, with
CPU time counted (`time.thread_time`) around that stage only:

- read: the tar members read and grouped by key into encoded samples (`PartReader`, the training plan's parts);
- shuffle: the bounded buffer's permutation of those samples;
- decode: each sample's image decoded and its label read (`ImageTask.train_pixels`: the crop's region alone where
  that pays, crop_decode.py, else the whole image near the training size);
- crop: its crop, resize and flip (`ImageTask.train_finish`), run right after decoding it, as the loader does;
- collate: the task's `collate` (the labels, the batch), into a few reused buffers as in a worker;
- hand-over: a batch put on a worker-to-trainer queue by a forked process and taken off it here, as a DataLoader
  worker's batches reach the trainer (the pickle, the queue, the copy out of the worker's reused shared buffer,
  project/data/shared.py);
- the rest: the loader's CPU time per sample in the real epoch (main process and workers) less the stages above:
  what the processes cost beyond the stages (start, the stream's bookkeeping, waiting).
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import torch

from project.data.reading import PartReader
from project.data.shared import pooled_as_a_worker, pooled_empty, released
from project.data.stream import ShardStream, shuffled
from project.tasks.image.data import ImageShards
from project.tasks.image.task import ImageTask

PREFETCH = 2  # the DataLoader's prefetch_factor: batches a worker has under way
STAGES = ("read", "shuffle", "decode", "crop", "collate", "handover")
SHOWN = {  # how the bench's table names them
    "read": "read tar and group by key",
    "shuffle": "shuffle buffer",
    "decode": "decode",
    "crop": "crop, resize, flip",
    "collate": "collate",
    "handover": "hand-over to the trainer",
}


def stage_costs(index: Path, settings: dict) -> dict[str, float]:
    """CPU microseconds per sample of each stage (`STAGES`) of one training epoch of `index` with `settings`
    (the data module's: batch_size, image_size, augment, shuffle_buffer, seed), in this process."""
    module = ImageShards(root=None, train=str(index), num_workers=0, pin_memory=False, **settings)
    stream = module.stream("train")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        with pooled_as_a_worker():  # collate writes into reused buffers, as a worker's: no fresh pages to fault in
            costs, batches = measure_stages(stream, module)
        costs["handover"] = handover_seconds(batches)
    finally:
        torch.set_num_threads(threads)
    count = sum(plan.nsamples for plan in stream.plans())
    return {stage: seconds / count * 1e6 for stage, seconds in costs.items()}


def measure_stages(stream: ShardStream, module: ImageShards) -> tuple[dict[str, float], list]:
    """CPU seconds of read, shuffle, decode, crop and collate over the stream's whole epoch, and its batches."""
    costs = dict.fromkeys(STAGES[:-1], 0.0)
    limits = dict(max_member_bytes=stream.max_member_bytes, skip_corrupt=True)
    task = module.task
    reader = PartReader(stream.shards, task.extensions, stream.open_stream, read_ahead_bytes=0, **limits)
    batches, clock = [], time.thread_time
    for plan in stream.plans():
        start = clock()
        encoded = list(reader.read(plan.parts))
        middle = clock()
        samples = iter(list(shuffled(iter(encoded), stream.shuffle_buffer, plan.shuffle_seed)))
        costs["read"] += middle - start
        costs["shuffle"] += clock() - middle
        for size in plan.batch_sizes:
            chunk = list(itertools.islice(samples, size))
            examples = decode_and_crop(task, chunk, costs, clock)
            start = clock()
            batch = task.collate(examples, "train")
            costs["collate"] += clock() - start
            batch.image = released(batch.image)  # copied out, its buffer free again, as the trainer's receipt does
            batches.append(batch)
    return costs, batches


def decode_and_crop(task: ImageTask, chunk: list, costs: dict[str, float], clock: Callable[[], float]) -> list:
    """The chunk's training examples as the loader makes them (`ImageTask.train_decode`: each sample's crop
    decoded alone where that pays, else the whole image, then cropped at once), with the decoding's CPU time
    added to costs["decode"] and the crop's to costs["crop"]. Timed per sample, since decoding a batch's whole
    images first and cropping them after keeps them all in memory, which the loader never does (on the
    photographs, faulting in fresh pages made each decode a third slower); less the clock's own cost."""
    if task.crop_flip is None:  # no crop of ours: the transform runs in `collate`
        start = clock()
        examples = [task.decode_pixels(sample, "train") for sample in chunk]
        costs["decode"] += clock() - start
        return examples
    examples, decoding, cropping, before = [], 0.0, 0.0, clock()
    for sample in chunk:
        decoded = task.train_pixels(sample)
        middle = clock()
        examples.append(task.train_finish(decoded))
        after = clock()
        decoding, cropping, before = decoding + middle - before, cropping + after - middle, after
    overhead = clock_cost(clock) * len(chunk)
    costs["decode"] += max(0.0, decoding - overhead)
    costs["crop"] += max(0.0, cropping - overhead)
    return examples


@functools.cache
def clock_cost(clock: Callable[[], float], calls: int = 2000) -> float:
    """CPU seconds one call of `clock` takes (a thread's CPU clock is a system call, not a vDSO read)."""
    start = clock()
    for _ in range(calls):
        clock()
    return (clock() - start) / calls


def _put_all(batches: list, queue, results, done, prefetch) -> None:
    torch.set_num_threads(1)  # as a DataLoader worker (a forked OpenMP pool would hang a large copy)
    with pooled_as_a_worker():  # this process hands its batches over as a DataLoader worker does
        start, copying = time.process_time(), 0.0
        for batch in batches:
            prefetch.acquire()  # at most PREFETCH batches under way, as a DataLoader asks of each worker
            begin = time.thread_time()
            pooled = pooled_empty(batch.image.shape)  # what collate writes into in a worker: not the hand-over
            pooled.copy_(batch.image)
            batch.image = pooled
            copying += time.thread_time() - begin
            queue.put(batch)
        queue.put(None)
        results.put(time.process_time() - start - copying)
        done.wait()  # the queue's thread pickles the batches (leasing their buffers) after put; and a tensor's
        # shared memory passes as a file descriptor that this process hands over when asked


def handover_seconds(batches: list) -> float:
    """CPU seconds of handing `batches` from a forked process to this one through a torch multiprocessing
    queue, as a DataLoader worker's batches reach the trainer: the sender's time plus the receiver's."""
    import torch.multiprocessing  # noqa: F401 - registers the tensor reductions (shared memory) with the pickler

    context = multiprocessing.get_context("fork")
    queue, results, done, prefetch = context.Queue(), context.Queue(), context.Event(), context.Semaphore(PREFETCH)
    sender = context.Process(target=_put_all, args=(batches, queue, results, done, prefetch))
    sender.start()
    received = 0.0
    while True:
        start = time.thread_time()
        batch = queue.get()
        received += time.thread_time() - start
        if batch is None:
            break
        del batch
        prefetch.release()
    sent = results.get()
    done.set()
    sender.join()
    return sent + received
