"""TextTask: what the DataLoader workers do with a text classification sample: cut the text's start, tokenize it
(with some tokens dropped in training), read its label, and pad a batch to its longest text."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from project.data.decode_threads import batch_generator
from project.data.samples import Sample
from project.data.task import Task
from project.errors import DecodeError
from project.tasks.labels import MAX_LABEL_BYTES, NO_LABEL, label_index
from project.tasks.text.batch import TextBatch, TextExample, pad_examples
from project.tasks.text.hashed import NAME as HASHED
from project.tasks.text.hashed import HashedNGrams
from project.tasks.text.tokenizer import load_tokenizer, text_prefix

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are the parallelism
CHARS_PER_TOKEN = 32  # a BPE or WordPiece token spans a few characters; 32 leaves room for long merged runs


def open_tokenizer(source: str, max_tokens: int, hash_buckets: int) -> Any:
    """The tokenizer of `source` (a tokenizer.json, a Hugging Face folder, or `hashed`), truncating to
    `max_tokens` and padding nothing (collate pads, to each batch's longest text): a `tokenizers.Tokenizer`, or
    `HashedNGrams`, which answers the same calls."""
    if source == HASHED:
        tokenizer = HashedNGrams(hash_buckets, max_tokens)
    elif Path(source).is_dir():  # a pretrained model's folder: its AutoTokenizer
        from project.tasks.text.pretrained import folder_tokenizer

        tokenizer = folder_tokenizer(source)
        tokenizer.encode_special_tokens = True
    else:
        tokenizer = load_tokenizer(source)
    tokenizer.enable_truncation(max_tokens)  # keeps a BERT tokenizer's [CLS] ... [SEP]
    tokenizer.no_padding()
    return tokenizer


@functools.lru_cache(maxsize=4)
def process_tokenizer(source: str, sha256: str, max_tokens: int, hash_buckets: int) -> Any:
    """`open_tokenizer`, once per process for a tokenizer of this sha256: each worker loads its task's tokenizer
    on its first sample, and the task's pickle holds only where it is."""
    del sha256  # part of the cache's key: a file rewritten in place is another tokenizer
    return open_tokenizer(source, max_tokens, hash_buckets)


def label_text(sample: Sample) -> str:
    """The text of a sample's .cls member; a ValueError for one too large to be a label."""
    data = sample["cls"]
    if len(data) > MAX_LABEL_BYTES:
        raise ValueError(f"its .cls label member holds {len(data):,} bytes, over {MAX_LABEL_BYTES:,}")
    return data.decode("utf-8").strip()


def optional_label(sample: Sample, classes: Sequence[str] | None) -> int:
    """For predict: the sample's class index, or `NO_LABEL` when it has none that can be read."""
    try:
        return label_index(label_text(sample), classes)
    except (KeyError, ValueError, UnicodeDecodeError):
        return NO_LABEL


def text_and_label(sample: Sample, stage: str, classes: Sequence[str] | None, chars: int) -> tuple[str, int]:
    """The sample's text (its first `chars` characters, `text_prefix`) and class index; a `DecodeError` for one
    that cannot be used. Training and the linear baseline (tasks/text/linear.py) read samples through it alike."""
    try:
        text = text_prefix(sample["txt"], chars)
        label = optional_label(sample, classes) if stage == "predict" else label_index(label_text(sample), classes)
    except KeyError as error:
        raise DecodeError.of(sample, f"no .{error.args[0]} member") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise DecodeError.of(sample, error) from None
    if not text.strip():
        raise DecodeError.of(sample, "the text is empty")
    return text, label


class TextTask(Task):
    """A `.txt` member (UTF-8 text) and a `.cls` member (an integer label or a class name) per sample, as token
    ids padded per batch.

    Args:
        tokenizer: a tokenizer.json, a Hugging Face folder, or `hashed` (project/tasks/text/hashed.py).
        tokenizer_hash: its sha256 (a folder's, or the hashed n-grams' definition), checked by the data module.
        vocab_size: the ids the model's table has: a text with an id past it is skipped.
        pad_id: the id `collate` pads with.
        max_tokens: tokens kept of each text (the first ones).
        hash_buckets: the ids hashed n-grams are spread over (`hashed`, or `ngram_ids`).
        ngram_ids: beside the tokens, each text's hashed n-grams, at most this many ids (0: none).
        token_dropout: the share of each training text's tokens dropped at random (special tokens are kept).
        classes: the class names a label may name (None: integer labels only).
    """

    extensions = frozenset({"txt", "cls"})
    label_extensions = frozenset({"cls"})
    predict_files = frozenset({"txt"})  # a plain folder of .txt files: one text each
    thread_safe = True  # every draw of decode takes batch_generator() (decode_threads.py)

    def __init__(
        self,
        *,
        tokenizer: str,
        tokenizer_hash: str,
        vocab_size: int,
        pad_id: int,
        max_tokens: int = 128,
        hash_buckets: int = 1 << 18,
        ngram_ids: int = 0,
        token_dropout: float = 0.0,
        classes: Sequence[str] | None = None,
    ) -> None:
        self.tokenizer_source, self.tokenizer_hash = tokenizer, tokenizer_hash
        self.vocab_size, self.pad_id, self.max_tokens = vocab_size, pad_id, max_tokens
        self.hash_buckets, self.ngram_ids, self.token_dropout = hash_buckets, ngram_ids, token_dropout
        self.classes = classes
        self.ngram_encoder = HashedNGrams(hash_buckets, ngram_ids) if ngram_ids else None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer, loaded where it is first used: once in each DataLoader worker."""
        return process_tokenizer(self.tokenizer_source, self.tokenizer_hash, self.max_tokens, self.hash_buckets)

    @property
    def chars(self) -> int:
        """Characters read of a text: enough for `max_tokens` tokens (hashed n-grams read at most 2 characters
        per id of the text's start, hashed.py). A tokenizer's work is linear in what it is given, and a member
        may hold 512 MiB, so the rest is never decoded."""
        return text_chars(self.max_tokens, self.ngram_ids)

    def text_and_label(self, sample: Sample, stage: str) -> tuple[str, int]:
        """The sample's text and class index (`text_and_label`)."""
        return text_and_label(sample, stage, self.classes, self.chars)

    def decode(self, sample: Sample, stage: str) -> TextExample:
        """The sample's label and its token ids, some dropped at random in training (`token_dropout`)."""
        text, label = self.text_and_label(sample, stage)
        encoding = self.tokenizer.encode(text)
        tokens = encoding.ids
        if not tokens or max(tokens) >= self.vocab_size:  # a stranger's tokenizer.json: ids the model's table lacks
            raise DecodeError.of(sample, f"the tokenizer gives it no ids, or ids past its {self.vocab_size:,}")
        if stage == "train" and self.token_dropout > 0 and len(tokens) > 1:
            # torch's generator, seeded per training batch by the stream: the same drops on resume
            drop = (torch.rand(len(tokens), generator=batch_generator()) < self.token_dropout).tolist()
            special = encoding.special_tokens_mask
            kept = [token for token, gone, keep in zip(tokens, drop, special, strict=True) if keep or not gone]
            tokens = kept if len(kept) > sum(special) else tokens
        ngrams = None if self.ngram_encoder is None else self.ngram_encoder.encode(text).ids
        return TextExample(tokens, label, ngrams)

    def collate(self, examples: list[TextExample], stage: str) -> TextBatch:
        """Pad the examples' tokens to the longest of them."""
        return pad_examples(examples, self.pad_id)


def text_chars(max_tokens: int, ngram_ids: int) -> int:
    """The characters of a text's start that can hold `max_tokens` tokens (CHARS_PER_TOKEN each), or `ngram_ids`
    hashed n-gram ids."""
    return max(max_tokens * CHARS_PER_TOKEN, ngram_ids)
