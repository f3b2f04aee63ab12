"""What a text encoder is: token ids [B, L] and their mask in, one feature vector [B, D] a text out, padding ignored.

A config picks an encoder by `class_path` (`model.encoder`) and gives it only its own settings; what the data says
(the vocabulary, the padding id, the classes, the tokenizer) reaches it as `FromData` when `TextClassifier` builds
it. jsonargparse reads the `model.encoder` argument, typed `EncoderFactory`, as the class with its settings bound,
to be called with `data=` (its "callable protocol" dependency injection): an encoder is a plain `nn.Module` built in
one step, and a setting that belongs to another encoder (a Transformer's `heads` given to a Conv) is a parse error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


@dataclass(frozen=True)
class FromData:
    """What the data module tells a text encoder (linked from it by the CLI; `TextClassifier` passes it on).

    Attributes:
        vocab_size: the tokenizer's vocabulary: the embedding table's rows.
        pad_id: the padding id: its positions are masked.
        max_tokens: the longest input: a positional table's length.
        num_classes: the classes: the width of an encoder whose features are class scores.
        tokenizer_hash: the sha256 of the data's tokenizer (None for a model built without data).
        ngram_buckets: the ids of the hashed n-grams beside the tokens (0 without them).
    """

    vocab_size: int = 8000
    pad_id: int = 0
    max_tokens: int = 128
    num_classes: int = 2
    tokenizer_hash: str | None = None
    ngram_buckets: int = 0


class TextEncoder(nn.Module):
    """The base of the text encoders: `forward(tokens, mask)` gives [B, dim] features, the same for a text
    whatever its padding. `make_head` makes the module that maps them to class scores; `lr_factor` is the
    encoder's learning rate relative to the head's (model.encoder_lr_factor overrides it)."""

    dim: int
    head_dropout: float = 0.0
    lr_factor: float = 1.0

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define forward(tokens, mask)")

    def make_head(self, num_classes: int) -> nn.Module:
        """Dropout and a linear layer from the features to the class scores."""
        return nn.Sequential(nn.Dropout(self.head_dropout), nn.Linear(self.dim, num_classes))


class Bias(nn.Module):
    """The head of an encoder whose features are the class scores already (Linear): a bias per class."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features + self.bias


class EncoderFactory(Protocol):
    """A `model.encoder` class_path with its settings, built by the classifier with the data's `FromData`."""

    def __call__(self, *, data: FromData) -> TextEncoder: ...


def masked_mean(
    states: torch.Tensor, mask: torch.Tensor, root: bool = False, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """The mean of `states` [B, L, D] over the positions where `mask` [B, L] is true; with `root`, their sum
    divided by the square root of their count (a bag of features scaled to about unit L2 norm, as TF-IDF is).
    With `weights` [B, L], the weighted mean, or with `root` the weighted sum over the root of the weights'
    squares (the count is the case of weights 1)."""
    weights = mask if weights is None else weights * mask
    weights = weights.unsqueeze(-1).to(states.dtype)
    total = weights.square().sum(1).sqrt() if root else weights.sum(1)
    return (states * weights).sum(1) / total.clamp(min=1e-6)  # a text with no weight pools to zeros
