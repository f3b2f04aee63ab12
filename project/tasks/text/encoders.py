"""The text task's built-in encoders, each picked by `class_path` in `model.encoder` with its own settings (base.py):
`Linear` and `Bag` (pooled id embeddings, their weights in frequencies.py), `NGrams`, `Conv` and `Transformer`;
`Pretrained` (a Hugging Face folder) is in pretrained.py. Each ignores padded positions, so a batch padded to its
longest text gives each text the features it has alone."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from project.errors import UserError
from project.tasks.text.base import Bias, FromData, TextEncoder, masked_mean

LARGE_LINEAR = 1 << 26  # weights of Linear's table past which a run is told what it costs (256 MiB in float32)
MIN_DF = 2  # training texts an id must be in to weigh anything (idf)
NB_ALPHA = 0.25  # nb's smoothing: counts added to each id's in each class (0.25 to 1 tried; 0.25 the best)


class Bag(TextEncoder):
    """The pooled token embeddings (padding left out) and a linear head: fast, and blind to word order. With `root`
    pooling and `data.tokenizer: hashed` it is fastText on word and character n-grams: a low-rank linear model of
    the features the linear baseline reads, so it starts near zero as a linear model does.

    With `idf`, each id's embedding is weighed by its inverse document frequency in the training split (counted in
    one pass over it when a fit starts, `set_idf`, then kept in the checkpoint as a buffer), and root pooling divides
    by the root of the weights' squares: the TF-IDF vector, L2-normalised, that the baseline reads.

    Args:
        data: what the data module says (given by the classifier).
        dim: width of the embeddings.
        pooling: mean, or root (their sum over the square root of their count: the scale of a TF-IDF vector; with
            data.tokenizer hashed, the strongest on real texts).
        idf: weigh the ids by their inverse document frequency in the training split: with root pooling, TF-IDF as
            the baseline's.
        dropout: dropout before the head.
    """

    def __init__(
        self,
        *,
        data: FromData,
        dim: int = 128,
        pooling: Literal["mean", "root"] = "mean",
        idf: bool = False,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.dim, self.root, self.head_dropout = dim, pooling == "root", dropout
        self.embedding = nn.Embedding(data.vocab_size, dim, padding_idx=data.pad_id)
        if self.root:
            nn.init.normal_(self.embedding.weight, 0, 0.01)
            with torch.no_grad():
                self.embedding.weight[data.pad_id].zero_()
        self.register_buffer("idf", torch.ones(data.vocab_size) if idf else None)  # None: not in the state dict
        if idf:
            self.register_buffer("idf_texts", torch.zeros((), dtype=torch.long))  # texts it was counted on
        self.register_buffer("ratios", None)  # Linear's nb

    @property
    def counted(self) -> bool:
        """Whether a fit counts the training split's ids for it first (idf, nb)."""
        return self.idf is not None or self.ratios is not None

    def set_idf(self, frequencies: torch.Tensor, texts: int) -> None:
        """Weights from the training texts that hold each id: ln((1 + texts) / (1 + frequency)) + 1, as
        scikit-learn's smoothed IDF, and 0 for an id in fewer than MIN_DF texts, as the baseline's min_df: an id
        seen once cannot generalise, and one never seen (a test text's new words) would dilute the rest."""
        if self.idf is None:
            raise UserError("this bag was built without idf")
        frequencies = frequencies.to(self.idf)
        self.idf.copy_((torch.log((1 + texts) / (1 + frequencies)) + 1) * (frequencies >= MIN_DF))
        self.idf_texts.fill_(texts)

    def set_ratios(self, class_frequencies: torch.Tensor) -> None:
        """Each id's log-count ratio per class, from the training texts of each class that hold it [vocab, dim]:
        r = ln((p / |p|) / (q / |q|)), p the id's texts in the class and q in the others, each plus NB_ALPHA
        (Wang and Manning's, with their binarized counts). An id as common in the class as outside it gets about
        0: the class's score ignores it unless the data insists; a telling one is cheap to weigh."""
        if self.ratios is None:
            raise UserError("this bag was built without nb")
        if class_frequencies.shape != self.ratios.shape:
            raise UserError(
                f"nb needs [ids, classes] counts {tuple(self.ratios.shape)}, got {tuple(class_frequencies.shape)}"
            )
        inside = class_frequencies.to(torch.float64) + NB_ALPHA
        outside = class_frequencies.sum(1, keepdim=True).to(torch.float64) + 2 * NB_ALPHA - inside
        ratios = (inside / inside.sum(0)).log() - (outside / outside.sum(0)).log()
        self.ratios.copy_(ratios.to(self.ratios))

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = None if self.idf is None else self.idf[tokens]
        embeddings = self.embedding(tokens)
        if self.ratios is not None:
            embeddings = embeddings * self.ratios[tokens]
        return masked_mean(embeddings, mask, self.root, weights)


class Linear(Bag):
    """One embedding column per class and a bias for a head, no hidden layer: with data.tokenizer hashed, root
    pooling, idf and the squared hinge loss, a linear SVM on TF-IDF n-grams, the strongest on a few thousand to
    tens of thousands of real texts. Its table holds vocab_size x num_classes weights; a run is warned past 2^26.

    With `nb`, each id's weight in each class's column is scaled by the id's naive-Bayes log-count ratio for that
    class (counted with idf's pass over the training split, `set_ratios`, kept as a buffer): NBSVM (Wang and
    Manning, "Baselines and Bigrams", 2012), an SVM whose penalty spares the ids naive Bayes finds telling; 0.8-3
    points over the plain linear SVM on the tuning sets (benchmarks/README.md).

    Args:
        data: what the data module says (given by the classifier).
        pooling: mean, or root (an L2-normalised TF-IDF vector with idf).
        idf: weigh the ids by their inverse document frequency in the training split.
        nb: scale each class's column by the ids' naive-Bayes log-count ratios for the class.
    """

    def __init__(
        self, *, data: FromData, pooling: Literal["mean", "root"] = "mean", idf: bool = False, nb: bool = False
    ) -> None:
        super().__init__(data=data, dim=data.num_classes, pooling=pooling, idf=idf, dropout=0.0)
        if nb:
            self.register_buffer("ratios", torch.ones(data.vocab_size, data.num_classes))
        if data.vocab_size * data.num_classes > LARGE_LINEAR:
            copies = (
                "x5 with the gradient, Adam's moments and nb's ratios"
                if nb
                else "x4 with the gradient and Adam's moments"
            )
            rank_zero_warn(
                f"a Linear encoder holds {data.vocab_size:,} ids x {data.num_classes:,} classes = "
                f"{data.vocab_size * data.num_classes:,} weights ({copies}): "
                "fewer data.hash_buckets, or a Bag encoder (model.encoder.dim wide), would be smaller"
            )

    def make_head(self, num_classes: int) -> nn.Module:
        """A bias per class: the pooled embeddings are the class scores."""
        return Bias(num_classes)


class NGrams(TextEncoder):
    """fastText's text classifier (Joulin et al., "Bag of Tricks for Efficient Text Classification", 2016):
    the mean of the embeddings of a text's tokens and of its runs of 2 to `ngrams` tokens, each run hashed
    into one of `buckets` shared rows. It sees word order only within a run, at the speed of a bag of words. On
    real texts a bag of hashed word and character n-grams (data.tokenizer hashed) does as well or better
    (benchmarks/README.md, "Text on real data").

    Args:
        data: what the data module says (given by the classifier).
        dim: width of the embeddings.
        ngrams: the longest run of tokens embedded as one (1 is a bag of tokens).
        buckets: rows the token runs are hashed into: more means fewer runs share a row.
        dropout: dropout before the head.
    """

    PRIME = 1_000_003  # the rolling hash's multiplier: runs that differ in any token land apart

    def __init__(
        self, *, data: FromData, dim: int = 128, ngrams: int = 2, buckets: int = 1 << 17, dropout: float = 0.1
    ) -> None:
        super().__init__()
        if ngrams < 1 or (ngrams > 1 and buckets < 1):
            raise UserError(
                f"model.encoder.ngrams must be 1 or more and model.encoder.buckets positive, got {ngrams}, {buckets}"
            )
        self.dim, self.vocab_size, self.ngrams, self.buckets = dim, data.vocab_size, ngrams, buckets
        self.head_dropout = dropout
        self.embedding = nn.Embedding(data.vocab_size + (buckets if ngrams > 1 else 0), dim, padding_idx=data.pad_id)
        nn.init.uniform_(self.embedding.weight, -1 / dim, 1 / dim)  # fastText's start: near zero, all alike
        with torch.no_grad():
            self.embedding.weight[data.pad_id].zero_()

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ids, keep = [tokens], [mask]
        hashed, kept = tokens, mask
        for n in range(2, self.ngrams + 1):  # hashed[:, i] stands for tokens i .. i+n-1
            hashed = (hashed[:, :-1] * self.PRIME + tokens[:, n - 1 :]) % 2**31
            kept = kept[:, :-1] & mask[:, n - 1 :]
            ids.append(self.vocab_size + hashed % self.buckets)
            keep.append(kept)
        return masked_mean(self.embedding(torch.cat(ids, 1)), torch.cat(keep, 1))


class Conv(TextEncoder):
    """Token embeddings, 1-D convolutions over neighbouring tokens (each layer sees two more), and the
    masked max over positions: n-gram detectors ("not great") that train fast on a CPU. Sees local word order
    such as negation.

    Padded positions are zeroed after every layer, so a text's logits do not depend on its padding.

    Args:
        data: what the data module says (given by the classifier).
        dim: width of the embeddings and of the convolutions.
        layers: convolution layers.
        kernel: tokens each convolution spans.
        dropout: dropout after each convolution and before the head.
    """

    def __init__(
        self, *, data: FromData, dim: int = 128, layers: int = 2, kernel: int = 3, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.dim, self.head_dropout = dim, dropout
        self.embedding = nn.Embedding(data.vocab_size, dim, padding_idx=data.pad_id)
        self.convolutions = nn.ModuleList(nn.Conv1d(dim, dim, kernel, padding=kernel // 2) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.unsqueeze(1).to(self.embedding.weight.dtype)  # [B, 1, L]
        states = self.embedding(tokens).transpose(1, 2) * keep  # [B, D, L]
        for convolution in self.convolutions:
            states = states + self.dropout(F.gelu(convolution(states))) * keep
        states = states.masked_fill(~mask.unsqueeze(1), torch.finfo(states.dtype).min)
        return states.amax(dim=2)


class Transformer(TextEncoder):
    """Token and learned position embeddings (data.max_tokens of them), pre-norm transformer layers that ignore
    padding, and the masked mean of the last layer: sees the whole text's order, slow to train from scratch.

    Args:
        data: what the data module says (given by the classifier).
        dim: width of the embeddings and of the layers: a multiple of `heads`.
        layers: transformer layers.
        heads: attention heads of each layer.
        dropout: dropout in the layers and before the head.
    """

    def __init__(
        self, *, data: FromData, dim: int = 128, layers: int = 2, heads: int = 4, dropout: float = 0.1
    ) -> None:
        super().__init__()
        if dim % heads:
            raise UserError(f"model.encoder.dim ({dim}) must be a multiple of model.encoder.heads ({heads})")
        self.dim, self.head_dropout = dim, dropout
        self.embedding = nn.Embedding(data.vocab_size, dim, padding_idx=data.pad_id)
        self.position_embedding = nn.Embedding(data.max_tokens, dim)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        # no nested-tensor fast path: it would return zeros, not states, at padded positions (masked anyway)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        states = self.embedding(tokens) + self.position_embedding(positions)
        states = self.layers(states, src_key_padding_mask=~mask)
        return masked_mean(self.norm(states), mask)
