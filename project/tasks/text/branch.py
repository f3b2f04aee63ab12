"""The n-gram branch (model.ngram_branch): an NBSVM on hashed word and character n-grams beside a text model, each
trained on its own loss, their class scores standardised and added. A fine-tuned pretrained encoder and the NBSVM err
on different texts, so the sum beats both and the linear baseline (benchmarks/README.md, "Text on real data")."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from project.errors import UserError
from project.tasks.text.base import Bias, FromData
from project.tasks.text.encoders import Linear
from project.tasks.text.hashed import HashedNGrams


class NGramBranch(nn.Module):
    """configs/text/nbsvm.yaml's model on the hashed n-grams `data.ngram_ids` adds beside the tokens: a Linear
    encoder (root pooling, IDF, one column per class scaled by naive Bayes's ratios, counted by
    TextClassifier.setup from the training split) and a bias per class, trained on the squared hinge with an L2
    penalty, at its own learning rate.

    Args:
        data: what the data module says (given by the classifier): its n-grams' ids (data.ngram_ids and
            data.hash_buckets) and its classes.
        lr: the branch's peak learning rate (Adam's steps; it has no weight decay but its penalty).
        l2_c: its L2 penalty, as scikit-learn's C (as model.l2_c is for a Linear encoder alone).
    """

    def __init__(self, *, data: FromData, lr: float = 0.1, l2_c: float = 1.0) -> None:
        super().__init__()
        if data.tokenizer_hash is not None and data.tokenizer_hash == HashedNGrams.fingerprint(data.vocab_size):
            raise UserError(
                "model.ngram_branch adds hashed n-grams to a tokenizer's tokens, and data.tokenizer is hashed"
            )
        if data.ngram_buckets < 2:
            hint = "set data.ngram_ids (8192)" if data.tokenizer_hash is not None else "set model.ngram_buckets"
            raise UserError(f"model.ngram_branch reads hashed n-grams beside the tokens, and there are none: {hint}")
        if not lr > 0 or not l2_c > 0:
            raise UserError(f"model.ngram_branch's lr and l2_c must be positive, got {lr} and {l2_c}")
        self.lr, self.l2_c = lr, l2_c
        ngrams = FromData(vocab_size=data.ngram_buckets, pad_id=0, num_classes=data.num_classes)  # hashed.py pads 0
        self.encoder = Linear(data=ngrams, pooling="root", idf=True, nb=True)
        self.head = Bias(data.num_classes)

    def forward(self, ngrams: torch.Tensor | None) -> torch.Tensor:
        """The class scores (an SVM's) of a batch of n-gram ids [B, M], padded with 0."""
        if ngrams is None:
            raise UserError("model.ngram_branch reads hashed n-grams beside the tokens: set data.ngram_ids (8192)")
        return self.head(self.encoder(ngrams, ngrams != 0))

    def penalty(self, scale: float) -> torch.Tensor:
        """The L2 penalty `scale` * ||w||^2 on every weight (1 / (2 C N), scikit-learn's C): AdamW, which steps the
        pretrained encoder, decouples its decay, so the branch's penalty is in the loss, as Adam's would be."""
        return scale * sum(weight.float().square().sum() for weight in self.parameters())


class BranchFactory(Protocol):
    """A `model.ngram_branch` class_path with its settings, built by the classifier with the data's `FromData`."""

    def __call__(self, *, data: FromData) -> NGramBranch: ...


def standardised(scores: torch.Tensor) -> torch.Tensor:
    """Each row's scores less their mean over the classes, over their standard deviation: two models' scores on
    one scale (an SVM's hinge scores and a softmax's logits differ by 5x), so that their sum weighs both."""
    scores = scores.float()
    return (scores - scores.mean(1, keepdim=True)) / scores.std(1, keepdim=True).clamp(min=1e-6)
