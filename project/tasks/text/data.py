"""TextShards: the text classification task's data module: a `.txt` text and a `.cls` label per sample,
tokenized in the DataLoader workers with the tokenizer trained on the training split, and padded per batch."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info

from project.data.datamodule import ShardDataModule, check_positive
from project.data.decode_threads import batch_generator
from project.data.remote import is_remote
from project.data.samples import Sample, read_samples
from project.data.stream import ShardStream
from project.errors import DecodeError, UserError
from project.tasks.demos import build_once, uses_folder
from project.tasks.labels import MAX_LABEL_BYTES, NO_LABEL, ClassNames, label_index
from project.tasks.text.batch import TextBatch, TextExample, pad_examples
from project.tasks.text.frequencies import count_documents
from project.tasks.text.hashed import NAME as HASHED
from project.tasks.text.hashed import HashedNGrams
from project.tasks.text.tokenizer import (
    COMMAND,
    FILE_NAME,
    check_tokenizer,
    file_hash,
    load_tokenizer,
    recorded_tokenizer,
    text_prefix,
)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are the parallelism
DEMO_ROOT = Path("data/text-demo")
PAD_TOKENS = ("<pad>", "[PAD]", "<|pad|>")  # ours, BERT-style and GPT-style tokenizers' padding tokens
CHARS_PER_TOKEN = 32  # a BPE or WordPiece token spans a few characters; 32 leaves room for long merged runs


class TextShards(ClassNames, ShardDataModule):
    """Text classification samples from WebDataset shards: a `.txt` member (UTF-8 text) and a `.cls`
    member (an integer label or a class name), as `python -m project.data.prepare SOURCE --text` writes.

    Texts are tokenized in the DataLoader workers, truncated to `max_tokens`, and padded to the longest
    text of each batch (not to max_tokens). Only these two members are read.

    Args:
        tokenizer: the tokenizer.json to encode with, or a Hugging Face folder (its AutoTokenizer), or
            `hashed`: each text's word 1-2-grams and character 2-5-grams hashed into `hash_buckets` ids, with
            no tokenizer to train (project/tasks/text/hashed.py). By default a pretrained model's folder
            (model.pretrained), else the one beside the training split's shard index (`python -m
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

    extensions = frozenset({"txt", "cls"})
    label_extensions = frozenset({"cls"})
    thread_safe = True  # every draw of decode takes batch_generator() (decode_threads.py)
    predict_files = frozenset({"txt"})  # a plain folder of .txt files: one text each

    def __init__(
        self,
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
        self._tokenizer = None  # loaded where it is used: once in each DataLoader worker

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
        """The tokenizer file: the configured one, or the one the training split's index records."""
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
        if self._tokenizer is None:
            if self.hashed:
                tokenizer = HashedNGrams(self.hash_buckets, self.max_tokens)
            elif Path(self.tokenizer_path).is_dir():  # a pretrained model's folder: its AutoTokenizer
                from project.tasks.text.pretrained import folder_tokenizer

                tokenizer = folder_tokenizer(self.tokenizer_path)
                tokenizer.encode_special_tokens = True
            else:
                tokenizer = load_tokenizer(self.tokenizer_path)
            tokenizer.enable_truncation(self.max_tokens)  # keeps a BERT tokenizer's [CLS] ... [SEP]
            tokenizer.no_padding()  # collate pads, to each batch's longest text
            self._tokenizer = tokenizer
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

    def stream(self, split: str) -> ShardStream:
        # resolved here, once: the workers' copies get them without reading an index or hashing a file
        self.classes, self.tokenizer_hash, self.vocab_size, self.pad_id  # noqa: B018
        return super().stream(split)

    def read_texts(self, split: str) -> Iterator[tuple[str, int] | None]:
        """Each sample of a split's shards as training reads it (data.fraction, the text's start, label checks):
        its text and class index, or None for one that training would skip. The baseline and model.idf read
        through it. Close it (contextlib.closing) when stopping early: the open shard is closed with it."""
        for shard in self.shards(split):
            with contextlib.closing(
                read_samples(shard.url, stop=shard.nsamples, extensions=self.extensions)
            ) as samples:
                for sample in samples:
                    try:
                        yield self.text_and_label(sample, split)
                    except DecodeError:
                        yield None

    def document_frequencies(
        self, by_class: bool = False, part: tuple[int, int] = (0, 1), ngrams: bool = False
    ) -> tuple[np.ndarray, int]:
        """How many training texts hold each id, and how many texts were read: model.idf's weights, and with
        `by_class` model.nb's counts per class (frequencies.py). With `ngrams`, of the hashed n-grams beside the
        tokens (data.ngram_ids), which a model's n-gram branch weighs."""
        if ngrams and self.ngram_encoder is None:
            raise UserError("model.ngram_branch reads hashed n-grams beside the tokens: set data.ngram_ids (8192)")
        encoder, vocabulary = (self.ngram_encoder, self.hash_buckets) if ngrams else (self.tokenizer, self.vocab_size)
        return count_documents(self, encoder, vocabulary, by_class, part)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids (padding left out), for reports."""
        return self.tokenizer.decode([token for token in tokens if token != self.pad_id])

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_tokenizer"] = None
        state.pop("ngram_encoder", None)  # made again where it is used
        return state

    # -- in the DataLoader workers --------------------------------------------------------------------

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

    def text_and_label(self, sample: Sample, stage: str) -> tuple[str, int]:
        """The sample's text (its start, `text_prefix`) and class index; a `DecodeError` for one that cannot be
        used. Training and the linear baseline (tasks/text/linear.py) read samples through it alike."""
        try:
            text = self.text_prefix(sample["txt"])
            label = self.label_of(sample) if stage == "predict" else label_index(self.label_text(sample), self.classes)
        except KeyError as error:
            raise DecodeError.of(sample, f"no .{error.args[0]} member") from None
        except (UnicodeDecodeError, ValueError) as error:
            raise DecodeError.of(sample, error) from None
        if not text.strip():
            raise DecodeError.of(sample, "the text is empty")
        return text, label

    def text_prefix(self, data: bytes) -> str:
        """The start of a text that can hold `max_tokens` tokens (CHARS_PER_TOKEN characters each): a
        tokenizer's work is linear in what it is given, and a member may hold 512 MiB, so the rest is never
        decoded. Invalid UTF-8 within that start is a `UnicodeDecodeError`."""
        # hashed n-grams read at most 2 characters per id of the text's start (hashed.py)
        return text_prefix(data, max(self.max_tokens * CHARS_PER_TOKEN, self.ngram_ids))

    @staticmethod
    def label_text(sample: Sample) -> str:
        data = sample["cls"]
        if len(data) > MAX_LABEL_BYTES:
            raise ValueError(f"its .cls label member holds {len(data):,} bytes, over {MAX_LABEL_BYTES:,}")
        return data.decode("utf-8").strip()

    def label_of(self, sample: Sample) -> int:
        """For predict: the sample's label, or `NO_LABEL` when it has none that can be read."""
        try:
            return label_index(self.label_text(sample), self.classes)
        except (KeyError, ValueError, UnicodeDecodeError):
            return NO_LABEL

    def collate(self, examples: list[TextExample], stage: str) -> TextBatch:
        """Pad the examples' tokens to the longest of them."""
        return pad_examples(examples, self.pad_id)
