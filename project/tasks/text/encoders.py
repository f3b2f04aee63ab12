"""The text task's encoders: token ids [B, L] and their mask in, one feature vector [B, D] a text out. Each
ignores padded positions, so a batch padded to its longest text gives each text the features it has alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from project.errors import UserError

MIN_DF = 2  # training texts an id must be in to weigh anything (model.idf)
NB_ALPHA = 0.25  # model.nb's smoothing: counts added to each id's in each class (0.25 to 1 tried; 0.25 the best)


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


class BagEncoder(nn.Module):
    """The pooled token embeddings (padding left out): fast, and blind to word order. With `root` pooling and
    `data.tokenizer: hashed` it is fastText on word and character n-grams: a low-rank linear model of the
    features the linear baseline reads, so it starts near zero as a linear model does.

    With `idf`, each id's embedding is weighed by its inverse document frequency in the training split (set by
    `set_idf` before training, then kept in the checkpoint as a buffer), and root pooling divides by the root
    of the weights' squares: the TF-IDF vector, L2-normalised, that the baseline reads.

    With `nb` (one column per class: encoder linear), each id's weight in each class's column is scaled by the
    id's naive-Bayes log-count ratio for that class (set by `set_ratios`, kept as a buffer): NBSVM (Wang and
    Manning, "Baselines and Bigrams", 2012), an SVM whose penalty spares the ids naive Bayes finds telling."""

    def __init__(
        self, vocab_size: int, dim: int, pad_id: int, root: bool = False, idf: bool = False, nb: bool = False
    ) -> None:
        super().__init__()
        self.dim, self.root = dim, root
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        if root:
            nn.init.normal_(self.embedding.weight, 0, 0.01)
            with torch.no_grad():
                self.embedding.weight[pad_id].zero_()
        self.register_buffer("idf", torch.ones(vocab_size) if idf else None)  # None: not in the state dict
        if idf:
            self.register_buffer("idf_texts", torch.zeros((), dtype=torch.long))  # texts it was counted on
        self.register_buffer("ratios", torch.ones(vocab_size, dim) if nb else None)

    def set_idf(self, frequencies: torch.Tensor, texts: int) -> None:
        """Weights from the training texts that hold each id: ln((1 + texts) / (1 + frequency)) + 1, as
        scikit-learn's smoothed IDF, and 0 for an id in fewer than MIN_DF texts, as the baseline's min_df: an id
        seen once cannot generalise, and one never seen (a test text's new words) would dilute the rest."""
        if self.idf is None:
            raise UserError("this bag was built without model.idf")
        frequencies = frequencies.to(self.idf)
        self.idf.copy_((torch.log((1 + texts) / (1 + frequencies)) + 1) * (frequencies >= MIN_DF))
        self.idf_texts.fill_(texts)

    def set_ratios(self, class_frequencies: torch.Tensor) -> None:
        """Each id's log-count ratio per class, from the training texts of each class that hold it [vocab, dim]:
        r = ln((p / |p|) / (q / |q|)), p the id's texts in the class and q in the others, each plus NB_ALPHA
        (Wang and Manning's, with their binarized counts). An id as common in the class as outside it gets about
        0: the class's score ignores it unless the data insists; a telling one is cheap to weigh."""
        if self.ratios is None:
            raise UserError("this bag was built without model.nb")
        if class_frequencies.shape != self.ratios.shape:
            raise UserError(
                f"model.nb needs [ids, classes] counts {tuple(self.ratios.shape)}, got {tuple(class_frequencies.shape)}"
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


class NGramEncoder(nn.Module):
    """fastText's text classifier (Joulin et al., "Bag of Tricks for Efficient Text Classification", 2016):
    the mean of the embeddings of a text's tokens and of its runs of 2 to `ngrams` tokens, each run hashed
    into one of `buckets` shared rows. It sees word order only within a run, at the speed of a bag of words. On
    real texts a bag of hashed word and character n-grams (data.tokenizer hashed) does as well or better
    (benchmarks/README.md, "Text on real data")."""

    PRIME = 1_000_003  # the rolling hash's multiplier: runs that differ in any token land apart

    def __init__(self, vocab_size: int, dim: int, ngrams: int, buckets: int, pad_id: int) -> None:
        super().__init__()
        if ngrams < 1 or (ngrams > 1 and buckets < 1):
            raise UserError(f"model.ngrams must be 1 or more and model.buckets positive, got {ngrams}, {buckets}")
        self.dim, self.vocab_size, self.ngrams, self.buckets = dim, vocab_size, ngrams, buckets
        self.embedding = nn.Embedding(vocab_size + (buckets if ngrams > 1 else 0), dim, padding_idx=pad_id)
        nn.init.uniform_(self.embedding.weight, -1 / dim, 1 / dim)  # fastText's start: near zero, all alike
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ids, keep = [tokens], [mask]
        hashed, kept = tokens, mask
        for n in range(2, self.ngrams + 1):  # hashed[:, i] stands for tokens i .. i+n-1
            hashed = (hashed[:, :-1] * self.PRIME + tokens[:, n - 1 :]) % 2**31
            kept = kept[:, :-1] & mask[:, n - 1 :]
            ids.append(self.vocab_size + hashed % self.buckets)
            keep.append(kept)
        return masked_mean(self.embedding(torch.cat(ids, 1)), torch.cat(keep, 1))


class ConvEncoder(nn.Module):
    """Token embeddings, 1-D convolutions over neighbouring tokens (each layer sees two more), and the
    masked max over positions: n-gram detectors ("not great") that train fast on a CPU.

    Padded positions are zeroed after every layer, so a text's logits do not depend on its padding.
    """

    def __init__(self, vocab_size: int, dim: int, layers: int, kernel: int, dropout: float, pad_id: int) -> None:
        super().__init__()
        self.dim = dim
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.convolutions = nn.ModuleList(nn.Conv1d(dim, dim, kernel, padding=kernel // 2) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.unsqueeze(1).to(self.embedding.weight.dtype)  # [B, 1, L]
        states = self.embedding(tokens).transpose(1, 2) * keep  # [B, D, L]
        for convolution in self.convolutions:
            states = states + self.dropout(F.gelu(convolution(states))) * keep
        states = states.masked_fill(~mask.unsqueeze(1), torch.finfo(states.dtype).min)
        return states.amax(dim=2)


class TransformerEncoder(nn.Module):
    """Token and learned position embeddings, pre-norm transformer layers that ignore padding, and the
    masked mean of the last layer."""

    def __init__(
        self, vocab_size: int, dim: int, layers: int, heads: int, dropout: float, max_tokens: int, pad_id: int
    ) -> None:
        super().__init__()
        if dim % heads:
            raise UserError(f"model.dim ({dim}) must be a multiple of model.heads ({heads})")
        self.dim = dim
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.position_embedding = nn.Embedding(max_tokens, dim)
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
