"""Task: what a task does with one sample and one batch, in the DataLoader workers.

A task's data module (`ShardDataModule`) builds one `Task` and gives it to the stream, which pickles it into
every worker. So a task is a small object of plain settings (sizes, transforms, class names, a tokenizer's path):
no trainer, loaders, shard indexes or ledgers, and nothing to leave out of its pickle. Everything a task reads
of the data module's resolved state (class names from the index, a tokenizer's hash) is an argument of its
`__init__`, given when the data module builds it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from project.data.batch import Batch
from project.data.samples import Sample


class Task:
    """The per-sample part of a task: which members it reads, how one sample decodes, how examples collate.

    Subclass it with `decode` and `collate`, and set the class attributes below: they are the task's, not an
    instance's, so the data module reads them before it builds the task (its forkserver preload, a plain folder
    given to predict, the active-learning oracle's label members).
    """

    # the tar members `decode` reads (lower-case extensions); no other member is ever read into memory
    extensions: ClassVar[frozenset[str]] = frozenset()
    # the members that hold a sample's label (the active-learning oracle replaces them with a .cls)
    label_extensions: ClassVar[frozenset[str]] = frozenset()
    # the file suffixes (lower case, no dot) of a plain folder that `predict` may read: each file is a sample
    predict_files: ClassVar[frozenset[str]] = frozenset()
    # every random draw of decode takes `batch_generator()` (project/data/decode_threads.py): decode threads may
    # decode batches at once (collate runs in the loader's own thread, and may draw from torch's generator)
    thread_safe: ClassVar[bool] = False

    def decode(self, sample: Sample, stage: str) -> Any:
        """One example from one sample: {"__key__", "__url__", ext: bytes} for the `extensions` present.

        Raise `project.errors.DecodeError` for a sample that cannot be used (a broken image, a missing
        label): the stream leaves it out of its batch and counts it. `stage` is train, val, test or
        predict. torch's random generator is seeded per training batch, so augmentation drawn from it is
        the same when a run resumes.
        """
        raise NotImplementedError(f"{type(self).__name__} must define decode(sample, stage)")

    def collate(self, examples: list[Any], stage: str) -> Batch:
        """One batch from the examples `decode` returned, in order: a `Batch` subclass. The stream fills
        in its `keys`, `urls` and `skipped`."""
        raise NotImplementedError(f"{type(self).__name__} must define collate(examples, stage)")
