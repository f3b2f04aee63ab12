"""The text classification task's examples and batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from project.data.batch import Batch


class TextExample(NamedTuple):
    """One decoded sample: its token ids (truncated, augmented), its label, and its hashed n-gram ids when the
    data module adds them (data.ngram_ids)."""

    tokens: list[int]
    label: int
    ngrams: list[int] | None = None


@dataclass(kw_only=True)
class TextBatch(Batch):
    """Token ids padded to the batch's longest text, with their lengths and labels.

    Attributes:
        tokens: int64 [B, L], padded with the tokenizer's pad id; L is the longest text of this batch
            (dynamic padding), not `max_tokens`.
        lengths: int64 [B], the real tokens of each row.
        label: int64 [B] class indexes.
        ngrams: int64 [B, M] or None: each text's hashed word and character n-gram ids (data.ngram_ids), padded
            with 0 to the batch's longest, for a model's n-gram branch (model.ngram_branch).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    label: torch.Tensor
    ngrams: torch.Tensor | None = None

    def padding_share(self) -> float:
        """The share of `tokens` that is padding."""
        return 1 - float(self.lengths.sum()) / max(1, self.tokens.numel())


def pad_examples(examples: list[TextExample], pad_id: int) -> TextBatch:
    """A `TextBatch` of the examples, each padded at the end to the longest of them."""
    lengths = [len(example.tokens) for example in examples]
    ngrams = None
    if examples and examples[0].ngrams is not None:  # hashed n-grams' padding is id 0 (hashed.py)
        ngrams = torch.from_numpy(padded([example.ngrams for example in examples], 0))
    return TextBatch(
        tokens=torch.from_numpy(padded([example.tokens for example in examples], pad_id)),
        lengths=torch.tensor(lengths, dtype=torch.long),
        label=torch.tensor([example.label for example in examples], dtype=torch.long),
        ngrams=ngrams,
    )


def padded(rows: list[list[int]], pad_id: int) -> np.ndarray:
    """The rows as one int64 array [len(rows), longest], each padded at the end with `pad_id`."""
    array = np.full((len(rows), max((len(row) for row in rows), default=0)), pad_id, dtype=np.int64)
    for number, row in enumerate(rows):
        array[number, : len(row)] = row
    return array
