"""The text classification task's examples and batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from project.data.batch import Batch


class TextExample(NamedTuple):
    """One decoded sample: its token ids (truncated, augmented) and its label."""

    tokens: list[int]
    label: int


@dataclass(kw_only=True)
class TextBatch(Batch):
    """Token ids padded to the batch's longest text, with their lengths and labels.

    Attributes:
        tokens: int64 [B, L], padded with the tokenizer's pad id; L is the longest text of this batch
            (dynamic padding), not `max_tokens`.
        lengths: int64 [B], the real tokens of each row.
        label: int64 [B] class indexes.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    label: torch.Tensor

    def padding_share(self) -> float:
        """The share of `tokens` that is padding."""
        return 1 - float(self.lengths.sum()) / max(1, self.tokens.numel())


def pad_examples(examples: list[TextExample], pad_id: int) -> TextBatch:
    """A `TextBatch` of the examples, each padded at the end to the longest of them."""
    lengths = [len(example.tokens) for example in examples]
    tokens = np.full((len(examples), max(lengths)), pad_id, dtype=np.int64)
    for row, example in enumerate(examples):
        tokens[row, : lengths[row]] = example.tokens
    return TextBatch(
        tokens=torch.from_numpy(tokens),
        lengths=torch.tensor(lengths, dtype=torch.long),
        label=torch.tensor([example.label for example in examples], dtype=torch.long),
    )
