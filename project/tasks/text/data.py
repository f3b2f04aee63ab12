"""TextShards: the text classification task's data module: a `.txt` text and a `.cls` label per sample, tokenized
in the DataLoader workers by the `TextTask` it builds (project/tasks/text/task.py) with the tokenizer trained on
the training split, and padded per batch. Here: its settings, the tokenizer's path and hash, and the passes over
the training texts before a fit (the baseline's, an encoder's idf)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from lightning.pytorch.utilities import rank_zero_info

from project.data.datamodule import ShardDataModule, check_positive
from project.data.remote import is_remote
from project.data.samples import read_samples
from project.data.scanning import Indexer
from project.errors import DecodeError, UserError
from project.tasks.demos import build_once, uses_folder
from project.tasks.labels import ClassNames
from project.tasks.loading import CheckedLoading
from project.tasks.scan import LABELS
from project.tasks.text.frequencies import count_documents
from project.tasks.text.hashed import NAME as HASHED
from project.tasks.text.hashed import HashedNGrams
from project.tasks.text.task import TextTask, open_tokenizer, text_and_label, text_chars
from project.tasks.text.tokenizer import (
    COMMAND,
    FILE_NAME,
    check_tokenizer,
    file_hash,
    recorded_tokenizer,
)

DEMO_ROOT = Path("data/text-demo")
PAD_TOKENS = ("<pad>", "[PAD]", "<|pad|>")  # ours, BERT-style and GPT-style tokenizers' padding tokens


class TextShards(CheckedLoading, ClassNames, ShardDataModule):
    """Text classification samples from WebDataset shards: a `.txt` member (UTF-8 text) and a `.cls`
    member (an integer label or a class name), as `python -m project.shards.prepare SOURCE --out DIR` writes.

    Texts are tokenized in the DataLoader workers, truncated to `max_tokens`, and padded to the longest
    text of each batch (not to max_tokens). Only these two members are read.

    Args:
        tokenizer: the tokenizer.json to encode with, or a Hugging Face folder (its AutoTokenizer), or
            `hashed`: each text's word 1-2-grams and character 2-5-grams hashed into `hash_buckets` ids, with
            no tokenizer to train (project/tasks/text/hashed.py). By default a pretrained encoder's folder
            (model.encoder.folder), else the one beside the training split's shard index (`python -m
            project.tasks.text.tokenizer DATA` writes it there, and records its hash in the index: a run with
            a tokenizer that differs from the recorded one stops).
        max_tokens: tokens kept of each text (the first ones); with `hashed`, the most ids of a text.
        hash_buckets: the ids hashed n-grams are spread over (`tokenizer: hashed`, or `ngram_ids`): the model's
            vocabulary, or its n-gram branch's.
        ngram_ids: beside each text's tokens, its hashed word and character n-grams (as `tokenizer: hashed` makes
            them), at most this many ids: what a pretrained model's n-gram branch reads (model.ngram_branch,
            configs/text/default.yaml: 8192, about a text's first 1,600 characters). 0, the default: none.
        token_dropout: training augmentation: the share of each text's tokens dropped at random (special
            tokens are kept), seeded per batch, so a resumed run drops the same ones.
        classes: class names, when the shard index does not record them.
        **kwargs: the shard, loader and resume settings of `ShardDataModule` (root, train, val, test,
            batch_size, num_workers, shuffle_buffer, seed, fraction, bucket_by_size, ...).
    """

    task_type: ClassVar[type[TextTask]] = TextTask
    indexer: ClassVar[Indexer] = LABELS  # remote shards without an index: their class names recorded too

    def __init__(
        self,
        *,
        tokenizer: str | None = None,
        max_tokens: int = 128,
        hash_buckets: int = 1 << 18,
        ngram_ids: int = 0,
        token_dropout: float = 0.0,
        classes: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        check_positive(max_tokens=max_tokens)
        if hash_buckets < 2:
            raise UserError(f"data.hash_buckets must be 2 or more, got {hash_buckets}")
        if ngram_ids < 0:
            raise UserError(f"data.ngram_ids must be 0 (none) or positive, got {ngram_ids}")
        if ngram_ids and tokenizer == HASHED:
            raise UserError(
                "data.ngram_ids adds hashed n-grams beside a tokenizer's tokens, and data.tokenizer is "
                "hashed already: set one of them"
            )
        if not 0 <= token_dropout < 1:
            raise UserError(f"data.token_dropout must be in [0, 1), got {token_dropout}")
        super().__init__(**kwargs)
        self.tokenizer_file, self.max_tokens, self.token_dropout = tokenizer, max_tokens, token_dropout
        self.hash_buckets, self.ngram_ids = hash_buckets, ngram_ids
        self._classes = classes
        self._tokenizer = None  # loaded where it is first used

    @property
    def ngram_buckets(self) -> int:
        """The ids of the hashed n-grams beside the tokens (data.ngram_ids), or 0 without them: linked to the
        model's n-gram branch."""
        return self.hash_buckets if self.ngram_ids else 0

    @cached_property
    def ngram_encoder(self) -> HashedNGrams | None:
        """What encodes the n-grams beside the tokens, or None without them."""
        return HashedNGrams(self.hash_buckets, self.ngram_ids) if self.ngram_ids else None

    @property
    def hashed(self) -> bool:
        """Whether texts are encoded as hashed n-grams (`tokenizer: hashed`), not by a tokenizer file."""
        return self.tokenizer_file == HASHED

    @cached_property
    def tokenizer_path(self) -> str:
        """The tokenizer file (or folder, or `hashed`): the configured one, or the one the training split's index
        records."""
        if self.tokenizer_file:
            return self.tokenizer_file
        spec = next((self.specs[split] for split in ("train", "val", "test") if self.specs[split]), None)
        folder = None
        if isinstance(spec, str) and not is_remote(spec):
            folder = spec if os.path.isdir(spec) else os.path.dirname(spec) if spec.endswith(".json") else None
        if folder is None:
            raise UserError(f"set data.tokenizer: no {FILE_NAME} is known beside {spec} ({COMMAND} DATA writes one)")
        if self.specs["train"] == spec and (recorded := recorded_tokenizer(self.index("train"))):
            name = recorded.get("file", FILE_NAME)
            plain = isinstance(name, str) and 0 < len(name) <= 255 and name.isprintable()
            if not plain or os.path.basename(name) != name or name in (".", ".."):
                # the index is a stranger's: it names a file beside itself, never a path elsewhere
                raise UserError(
                    f"the training index records the tokenizer file {name!r}: expected a file name beside it"
                )
            return os.path.join(folder, name)
        return os.path.join(folder, FILE_NAME)

    @cached_property
    def tokenizer_hash(self) -> str:
        """The tokenizer file's sha256, checked against the one the training index records."""
        if self.hashed:  # the features' definition stands for the file
            return HashedNGrams.fingerprint(self.hash_buckets)
        path = self.tokenizer_path
        if Path(path).is_dir():
            from project.tasks.text.pretrained import folder_fingerprint

            return folder_fingerprint(path)
        if not Path(path).is_file():
            raise UserError(f"tokenizer not found: {path} (train one with {COMMAND} DATA, or set data.tokenizer)")
        if self.specs["train"] is not None and recorded_tokenizer(self.index("train")) and not self.tokenizer_file:
            return check_tokenizer(path, self.index("train"))
        return file_hash(path)

    @property
    def tokenizer(self):  # noqa: ANN201 - tokenizers.Tokenizer
        """The tokenizer, for this process's own use (the vocabulary, the padding id, idf's counts); the
        workers' task loads its own."""
        if self._tokenizer is None:
            self._tokenizer = open_tokenizer(self.tokenizer_path, self.max_tokens, self.hash_buckets)
        return self._tokenizer

    @cached_property
    def vocab_size(self) -> int:
        self.tokenizer_hash  # noqa: B018 - the check comes first
        return self.tokenizer.get_vocab_size()

    @cached_property
    def pad_id(self) -> int:
        ids = (self.tokenizer.token_to_id(token) for token in PAD_TOKENS)
        found = next((found for found in ids if found is not None), 0)
        if found >= self.vocab_size:  # a stranger's tokenizer.json: the model's table has vocab_size rows
            raise UserError(f"{self.tokenizer_path}: its padding token's id {found:,} is past its {self.vocab_size:,}")
        return found

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self.decode_threads > 1:
            rank_zero_info(
                "data.decode_threads: tokenizing holds Python's GIL, so threads read texts slower than one thread "
                "(0.7-0.8x on real texts, benchmarks/README.md); worker processes (data.num_workers) run it in parallel"
            )

    def prepare_missing(self) -> None:
        """Build the text demo data when the configuration reads it and it is missing."""
        if uses_folder(self, DEMO_ROOT):
            from project.tasks.text.demo import demo_is_complete, make_demo  # python -m runs it as __main__

            build_once(DEMO_ROOT, demo_is_complete, make_demo, took="about 20 s")

    def make_task(self) -> TextTask:
        """The workers' task (a `task_type`), with what is resolved here, once: they get it without reading an index
        or hashing a file."""
        return self.task_type(
            tokenizer=self.tokenizer_path,
            tokenizer_hash=self.tokenizer_hash,
            vocab_size=self.vocab_size,
            pad_id=self.pad_id,
            max_tokens=self.max_tokens,
            hash_buckets=self.hash_buckets,
            ngram_ids=self.ngram_ids,
            token_dropout=self.token_dropout,
            classes=self.classes,
        )

    def read_texts(self, split: str) -> Iterator[tuple[str, int] | None]:
        """Each sample of a split's shards as training reads it (data.fraction, the text's start, label checks):
        its text and class index, or None for one that training would skip. The baseline and idf's counts read
        through it. Close it (contextlib.closing) when stopping early: the open shard is closed with it."""
        for shard in self.shards(split):
            with contextlib.closing(
                read_samples(shard.url, stop=shard.nsamples, extensions=self.task_type.extensions)
            ) as samples:
                for sample in samples:
                    try:
                        yield text_and_label(sample, split, self.classes, text_chars(self.max_tokens, self.ngram_ids))
                    except DecodeError:
                        yield None

    def document_frequencies(
        self, by_class: bool = False, part: tuple[int, int] = (0, 1), ngrams: bool = False
    ) -> tuple[np.ndarray, int]:
        """How many training texts hold each id, and how many texts were read: an encoder's idf weights, and with
        `by_class` its nb counts per class (frequencies.py). With `ngrams`, of the hashed n-grams beside the
        tokens (data.ngram_ids), which a model's n-gram branch weighs."""
        encoder, vocabulary = (self.ngram_encoder, self.hash_buckets) if ngrams else (self.tokenizer, self.vocab_size)
        return count_documents(self, encoder, vocabulary, by_class, part)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids (padding left out), for reports."""
        return self.tokenizer.decode([token for token in tokens if token != self.pad_id])
