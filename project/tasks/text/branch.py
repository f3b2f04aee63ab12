"""The n-gram branch (model.ngram_branch): an NBSVM on hashed word and character n-grams beside a text model, each
trained on its own loss, their class scores standardised and added. A fine-tuned pretrained encoder and the NBSVM err
on different texts, so the sum beats both and the linear baseline (benchmarks/README.md, "Text on real data")."""

from __future__ import annotations

import torch
from torch import nn

from project.errors import UserError
from project.tasks.text.encoders import BagEncoder
from project.tasks.text.hashed import HashedNGrams


class Bias(nn.Module):
    """linear's head: a bias per class added to the pooled embeddings, which are already the class scores."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features + self.bias


class NGramBranch(nn.Module):
    """configs/text/nbsvm.yaml's model: a root-pooled, IDF-weighted bag of hashed n-grams, one column per class
    scaled by naive Bayes's ratios (set by TextClassifier.setup from the training split), and a bias per class."""

    def __init__(self, buckets: int, num_classes: int) -> None:
        super().__init__()
        self.encoder = BagEncoder(buckets, num_classes, 0, root=True, idf=True, nb=True)  # hashed.py pads with 0
        self.head = Bias(num_classes)

    def forward(self, ngrams: torch.Tensor | None) -> torch.Tensor:
        """The class scores (an SVM's) of a batch of n-gram ids [B, M], padded with 0."""
        if ngrams is None:
            raise UserError("model.ngram_branch reads hashed n-grams beside the tokens: set data.ngram_ids (8192)")
        return self.head(self.encoder(ngrams, ngrams != 0))

    def penalty(self, scale: float) -> torch.Tensor:
        """The L2 penalty `scale` * ||w||^2 on every weight (1 / (2 C N), scikit-learn's C): AdamW, which steps the
        pretrained encoder, decouples its decay, so the branch's penalty is in the loss, as Adam's would be."""
        return scale * sum(weight.float().square().sum() for weight in self.parameters())


def standardised(scores: torch.Tensor) -> torch.Tensor:
    """Each row's scores less their mean over the classes, over their standard deviation: two models' scores on
    one scale (an SVM's hinge scores and a softmax's logits differ by 5x), so that their sum weighs both."""
    scores = scores.float()
    return (scores - scores.mean(1, keepdim=True)) / scores.std(1, keepdim=True).clamp(min=1e-6)


def check_branch(branch: bool, buckets: int, lr: float, l2_c: float, main_l2_c: float | None, tokenizer: str | None):
    """model.ngram_branch's settings, checked before anything is built."""
    if not branch:
        return
    if buckets < 2:
        hint = "set data.ngram_ids (8192)" if tokenizer is not None else "set model.ngram_buckets"
        raise UserError(f"model.ngram_branch reads hashed n-grams beside the tokens, and there are none: {hint}")
    if tokenizer is not None and tokenizer == HashedNGrams.fingerprint(buckets):
        raise UserError("model.ngram_branch adds hashed n-grams to a tokenizer's tokens, and data.tokenizer is hashed")
    if not lr > 0 or not l2_c > 0:
        raise UserError(f"model.ngram_lr and model.ngram_l2_c must be positive, got {lr} and {l2_c}")
    if main_l2_c is not None:
        raise UserError("model.l2_c penalises a linear model; with model.ngram_branch set model.ngram_l2_c instead")
