"""Hashed word and character n-grams: a text's features as ids, with no tokenizer to train.

`data.tokenizer: hashed` encodes each text as its word 1- and 2-grams and its character 2- to 5-grams within words
(what the linear baseline's TF-IDF reads), each hashed into one of `buckets` ids (the hashing trick of Vowpal Wabbit
and fastText). A feature that occurs `n` times is repeated round(1 + ln n) times: TF-IDF's sublinear term
frequency, which a bag with root pooling then weighs as TF-IDF does (3 points over distinct features on the tuning
set, benchmarks/README.md). On a few thousand texts these features carry what BPE tokens lose: spelling,
morphology and the words the tokenizer split (benchmarks/README.md, "Text on real data").

The hash is fixed (CRC-32 for words, a polynomial of the UTF-8 bytes for characters, then a multiplicative mix),
never Python's per-process `hash`, so every worker, run and machine gives a text the same ids.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

NAME = "hashed"  # data.tokenizer's value that selects these features
WORD = re.compile(r"\w\w+")  # scikit-learn's default token pattern: words of two or more characters
CHARS = (2, 5)  # character n-grams, within word boundaries (scikit-learn's char_wb)
MULTIPLIER = np.uint64(1_000_003)  # the characters' polynomial hash
MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads the polynomial's low bits over the high ones
WORD_SALT, PAIR_SALT = np.uint64(1 << 40), 7  # word ids never meet character ids before the mix
SPACE = np.uint64(ord(" "))
IDS_PER_CHARACTER = 5  # a character starts at most 4 character n-grams, and a word 2 ids: a text's start that fits


@dataclass
class Encoding:
    """What `HashedNGrams.encode` returns: the ids, as a `tokenizers.Encoding` names them."""

    ids: list[int]

    @property
    def special_tokens_mask(self) -> list[int]:
        return [0] * len(self.ids)  # no special tokens: token dropout may drop any id


class HashedNGrams:
    """A text's word 1-2-grams and character 2-5-grams, as ids in 1 .. buckets-1 (0 is padding), each repeated
    round(1 + ln n) times for its n occurrences.

    It answers the calls the data module makes of a `tokenizers.Tokenizer`, so the rest of the pipeline (dynamic
    padding, bucketing by length, token dropout, resume) is the same for both.
    """

    def __init__(self, buckets: int, max_ids: int) -> None:
        if buckets < 2 or max_ids < 1:
            raise ValueError(f"buckets must be 2 or more and max_ids positive, got {buckets}, {max_ids}")
        self.buckets, self.max_ids = buckets, max_ids

    @staticmethod
    def spec(buckets: int) -> str:
        """What the ids mean, as one line: its sha256 stands for a tokenizer file's in checkpoints and indexes."""
        return (
            f"hashed n-grams v2: words 1-2 (crc32), chars {CHARS[0]}-{CHARS[1]} within words, "
            f"each round(1 + ln count) times, buckets {buckets}"
        )

    @classmethod
    def fingerprint(cls, buckets: int) -> str:
        return hashlib.sha256(cls.spec(buckets).encode()).hexdigest()

    def encode(self, text: str) -> Encoding:
        return Encoding(self.ids(text).tolist())

    def ids(self, text: str) -> np.ndarray:
        """The sorted feature ids of the start of `text`, each repeated by its sublinear count: at most `max_ids`."""
        budget = max(8, self.max_ids // IDS_PER_CHARACTER)  # characters of the text, spaces collapsed
        spaced = self.spaced(text[: 2 * budget])  # the start only: a member's text may be 100x longer
        if len(spaced) <= budget and len(text) > 2 * budget:  # runs of spaces: the start fell short
            spaced = self.spaced(text)
        spaced = spaced[:budget]
        data = np.frombuffer(spaced.encode("utf-8", "replace"), np.uint8).astype(np.uint64)
        hashes = [self.word_hashes(WORD.findall(spaced))]
        for n in range(CHARS[0], min(CHARS[1], len(data)) + 1):
            windows = sliding_window_view(data, n)
            hashed = np.full(len(windows), n, np.uint64)
            for column in range(n):
                hashed = hashed * MULTIPLIER + windows[:, column]
            hashes.append(hashed[(windows[:, 1:-1] != SPACE).all(1)])  # no space inside: within one word
        mixed = np.concatenate(hashes) * MIX
        ids, counts = np.unique(
            ((mixed >> np.uint64(32)) % np.uint64(self.buckets - 1) + 1).astype(np.int64), return_counts=True
        )
        # round(1 + ln n) <= n: the repeats never outnumber the occurrences, so the character budget still holds
        return np.repeat(ids, np.rint(1 + np.log(counts)).astype(np.int64))[: self.max_ids]

    def spaced(self, text: str) -> str:
        """The text lower-cased, its words joined by single spaces, with a space at each end (word boundaries)."""
        return " " + " ".join(text.lower().split()[: self.max_ids]) + " "

    @staticmethod
    def word_hashes(words: list[str]) -> np.ndarray:
        hashes = [zlib.crc32(word.encode()) for word in words]
        hashes += [
            zlib.crc32(f"{first} {second}".encode(), PAIR_SALT) for first, second in zip(words, words[1:], strict=False)
        ]
        return np.array(hashes, np.uint64) + WORD_SALT

    # -- the calls the data module makes of a tokenizers.Tokenizer ------------------------------------------

    def get_vocab_size(self) -> int:
        return self.buckets

    def token_to_id(self, token: str) -> int | None:
        return None  # no named tokens: padding is id 0

    def enable_truncation(self, max_length: int) -> None:
        self.max_ids = max_length

    def no_padding(self) -> None:
        pass  # collate pads

    def decode(self, ids: list[int]) -> str:
        return f"({len(ids)} hashed n-grams)"
