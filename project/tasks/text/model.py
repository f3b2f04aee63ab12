"""TextClassifier: token ids in, class logits out; padding is masked, so a batch padded to its own longest
text gives the same logits as each text alone."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from project.callbacks.checkpoint_shape import quoted
from project.callbacks.media import log_text, media_loggers
from project.errors import UserError
from project.tasks.classifier import Classifier, decay_groups, squared_hinge, training_samples
from project.tasks.text.batch import TextBatch
from project.tasks.text.branch import Bias, NGramBranch, check_branch, standardised
from project.tasks.text.encoders import BagEncoder, ConvEncoder, NGramEncoder, TransformerEncoder
from project.tasks.text.frequencies import set_counts
from project.tasks.text.hashed import HashedNGrams
from project.tasks.text.pretrained import PretrainedEncoder

TABLE_ROWS = 16  # texts of the first training batch shown in TensorBoard
BAGS = ("bag", "linear")  # the encoders that pool their ids' embeddings, and so can weigh them by IDF
LARGE_LINEAR = 1 << 26  # weights of linear's table past which a run is told what it costs (256 MiB in float32)


class TextClassifier(Classifier):
    """A text classifier trained with cross-entropy: an encoder, masked mean pooling and a linear head.

    Args:
        num_classes: number of classes (linked from the data's shard index; never set it by hand).
        class_names: names of the classes (linked from the data), kept in checkpoints for reports.
        vocab_size: the tokenizer's vocabulary size (linked from the data).
        pad_id: the tokenizer's padding id (linked from the data); padded positions are masked.
        max_tokens: the longest input (linked from the data): the positional table's length.
        tokenizer_hash: the sha256 of the tokenizer the model is trained with (linked from the data); a
            checkpoint loaded with data tokenized otherwise is refused.
        encoder: linear (one embedding column per class and no hidden layer: with data.tokenizer hashed,
            pooling root, idf and squared_hinge, a linear SVM on TF-IDF n-grams, the strongest on a few thousand
            to tens of thousands of real texts; its table holds vocab_size x num_classes weights, and a run
            is warned past 2^26), bag (the pooled token embeddings, dim wide, and a linear head: fastText, a
            low-rank linear model), ngrams (the mean of BPE token and hashed token n-gram embeddings), cnn
            (convolutions over neighbouring tokens and a max over positions: sees local word order such as
            negation), or transformer (a small pre-norm encoder with mean pooling: sees the whole text's order,
            slow to train from scratch).
        pretrained: a local folder holding a Hugging Face encoder (config.json and weights, e.g. a
            DistilBERT saved with save_pretrained) to fine-tune instead; the data is tokenized with the
            folder's own tokenizer unless data.tokenizer names another. Nothing is downloaded.
        dim: width of the embeddings and of the encoder (linear's is num_classes).
        layers: convolution or transformer layers.
        heads: attention heads of each transformer layer.
        kernel: tokens each convolution spans (cnn).
        pooling: how bag and linear pool their embeddings: mean, or root (their sum over the square root of
            their count: the scale of a TF-IDF vector; with data.tokenizer hashed, the strongest on real texts).
        idf: weigh the ids of bag or linear by their inverse document frequency in the training split, counted
            in one pass over it when a fit starts and kept in the checkpoint: with root pooling, TF-IDF as the
            baseline's.
        nb: scale each id's weight in each class's column by its naive-Bayes log-count ratio for the class, counted
            with idf's pass over the training split and kept in the checkpoint (encoder linear only): NBSVM, Wang
            and Manning 2012. 0.8-3 points over the plain linear SVM on the tuning sets (benchmarks/README.md).
        ngrams: the longest run of tokens embedded as one (ngrams; 1 is a bag of tokens).
        buckets: rows the token runs are hashed into (ngrams): more means fewer runs share a row.
        dropout: dropout in the encoder and before the head (linear has neither).
        optimizer: adamw, or sgd with Nesterov momentum.
        lr: peak learning rate (of the head).
        encoder_lr_factor: the encoder's learning rate relative to the head's; by default 1, and 0.1 for
            a pretrained encoder (fine-tuning moves its weights less than the new head's).
        momentum: SGD momentum.
        weight_decay: AdamW's (decoupled) weight decay of weights; norms, biases and embeddings get none.
            Ignored when l2_c is set.
        schedule: learning-rate schedule after `warmup_fraction` of linear warmup: cosine, onecycle or
            constant (see project/tasks/classifier.py).
        warmup_fraction: share of the steps spent warming up.
        label_smoothing: cross-entropy label smoothing.
        loss: cross_entropy, or squared_hinge (one-vs-rest, the loss of a linear SVM: scikit-learn's LinearSVC).
            On a few thousand real texts the hinge's margin generalises where cross-entropy keeps pushing
            confident examples (benchmarks/README.md, "Text on real data"). Its scores are not probabilities:
            predict's softmax of them ranks classes, but is not calibrated.
        l2_c: an L2 penalty on every parameter (embeddings and biases included) with scikit-learn's C: the
            loss gets ||w||^2 / (2 * l2_c * N), N the training texts, so one value suits 2,000 texts and
            50,000. Smaller is stronger. It replaces weight_decay; Adam (not AdamW) then takes the steps.
        ngram_branch: beside the encoder, an NBSVM on the hashed word and character n-grams the data adds
            (data.ngram_ids): configs/text/nbsvm.yaml's model (root-pooled TF-IDF, naive-Bayes ratios, squared
            hinge, L2 penalty), trained on its own loss in the same steps. The two models' class scores are each
            standardised over the classes, per text, and added: the logits. They err on different texts, so the
            sum beats both (benchmarks/README.md, "Text on real data"); configs/text/default.yaml.
        ngram_buckets: the n-grams' ids (linked from data.hash_buckets when data.ngram_ids is set; never by hand).
        ngram_lr: the n-gram branch's peak learning rate (Adam's steps; it has no weight decay but its penalty).
        ngram_l2_c: the n-gram branch's L2 penalty, as scikit-learn's C (model.l2_c for the branch alone).
    """

    def __init__(
        self,
        num_classes: int = 2,
        class_names: list[str] | None = None,
        vocab_size: int = 8000,
        pad_id: int = 0,
        max_tokens: int = 128,
        tokenizer_hash: str | None = None,
        encoder: Literal["ngrams", "cnn", "transformer", "bag", "linear"] = "cnn",
        pretrained: str | None = None,
        dim: int = 128,
        layers: int = 2,
        heads: int = 4,
        kernel: int = 3,
        pooling: Literal["mean", "root"] = "mean",
        ngrams: int = 2,
        buckets: int = 1 << 17,
        dropout: float = 0.1,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        lr: float = 1e-3,
        encoder_lr_factor: float | None = None,
        momentum: float = 0.9,
        weight_decay: float = 0.01,
        schedule: Literal["cosine", "onecycle", "constant"] = "cosine",
        warmup_fraction: float = 0.1,
        label_smoothing: float = 0.0,
        loss: Literal["cross_entropy", "squared_hinge"] = "cross_entropy",
        l2_c: float | None = None,
        idf: bool = False,
        nb: bool = False,
        ngram_branch: bool = False,
        ngram_buckets: int = 0,
        ngram_lr: float = 0.1,
        ngram_l2_c: float = 1.0,
    ) -> None:
        super().__init__()
        if l2_c is not None and not l2_c > 0:
            raise UserError(f"model.l2_c must be positive (smaller is a stronger penalty), got {l2_c}")
        check_branch(ngram_branch, ngram_buckets, ngram_lr, ngram_l2_c, l2_c, tokenizer_hash)
        if loss == "squared_hinge" and label_smoothing:
            raise UserError("model.label_smoothing applies to cross_entropy, not squared_hinge: set one of them")
        if idf and pretrained is not None:
            raise UserError(
                "model.idf weighs the ids of bag or linear, not a pretrained encoder's: add --model.idf=false "
                "--data.tokenizer=null (configs/text/nbsvm.yaml sets model.idf: true and data.tokenizer: hashed)"
            )
        if idf and encoder not in BAGS:
            raise UserError(f"model.idf weighs the ids of bag or linear, not {encoder}'s: add --model.idf=false")
        if nb and (encoder != "linear" or pretrained is not None):
            what = "a pretrained encoder's" if pretrained is not None else f"{encoder}'s"
            raise UserError(
                f"model.nb scales the column of each class of encoder linear, not {what}: add --model.nb=false"
            )
        self.save_hyperparameters()
        linear = encoder == "linear" and pretrained is None  # a pretrained encoder keeps its own width and a head
        if pretrained is not None:
            if tokenizer_hash is not None and tokenizer_hash == HashedNGrams.fingerprint(vocab_size):
                raise UserError(
                    "model.pretrained reads its own tokenizer's ids, not hashed n-grams: add --data.tokenizer=null "
                    "(configs/text/nbsvm.yaml sets data.tokenizer: hashed)"
                )
            self.encoder = PretrainedEncoder(pretrained)
            if tokenizer_hash is not None:  # linked from the data (not a model built on its own)
                self.encoder.check_tokenizer(tokenizer_hash, vocab_size)
                self.encoder.check_length(max_tokens)
        elif encoder == "ngrams":
            self.encoder = NGramEncoder(vocab_size, dim, ngrams, buckets, pad_id)
        elif encoder in BAGS:
            width = num_classes if linear else dim
            if linear and vocab_size * num_classes > LARGE_LINEAR:
                copies = (
                    "x5 with the gradient, Adam's moments and model.nb's ratios"
                    if nb
                    else "x4 with the gradient and Adam's moments"
                )
                rank_zero_warn(
                    f"model.encoder linear holds {vocab_size:,} ids x {num_classes:,} classes = "
                    f"{vocab_size * num_classes:,} weights ({copies}): "
                    "fewer data.hash_buckets, or encoder bag (model.dim wide), would be smaller"
                )
            self.encoder = BagEncoder(vocab_size, width, pad_id, root=pooling == "root", idf=idf, nb=nb)
        elif encoder == "cnn":
            self.encoder = ConvEncoder(vocab_size, dim, layers, kernel, dropout, pad_id)
        else:
            self.encoder = TransformerEncoder(vocab_size, dim, layers, heads, dropout, max_tokens, pad_id)
        if linear:  # the pooled embeddings are the class scores
            self.head = Bias(num_classes)
        else:
            self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.encoder.dim, num_classes))
        if ngram_branch:
            self.ngrams = NGramBranch(ngram_buckets, num_classes)
        self.setup_metrics(num_classes)
        self.example_input_array = torch.full((2, 8), pad_id + 1 if pad_id == 0 else 0, dtype=torch.long)
        if ngram_branch:
            self.example_input_array = (self.example_input_array, torch.ones(2, 8, dtype=torch.long))
        self._penalty_scale = 0.0  # the n-gram branch's 1 / (2 C N), set when a fit starts
        self._batch_logged = False

    def setup(self, stage: str) -> None:
        """Before a fit with model.idf or model.nb: the ids' document frequencies (per class for nb), from the data
        module's training split, in one pass."""
        nb = self.hparams.get("nb", False)
        if stage != "fit" or not (self.hparams.idf or nb or self.branch):
            return
        if not hasattr(self.trainer.datamodule, "document_frequencies"):
            raise UserError("model.idf, nb and ngram_branch count ids in the training split: fit with TextShards")
        if self.hparams.idf or nb:
            set_counts(self, self.encoder, by_class=nb, idf=self.hparams.idf, size=self.hparams.vocab_size)
        if self.branch:
            set_counts(self, self.ngrams.encoder, by_class=True, idf=True, size=self.hparams.ngram_buckets, ngrams=True)
            self._penalty_scale = 1.0 / (2 * self.hparams.ngram_l2_c * training_samples(self.trainer))

    def forward(self, tokens: torch.Tensor, ngrams: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for a batch of token ids [B, L], padded with `pad_id`; with model.ngram_branch, also of its
        hashed n-gram ids [B, M], padded with 0."""
        return self.with_ngrams(self.head(self.encoder(tokens, tokens != self.hparams.pad_id)), ngrams)

    @property
    def branch(self) -> bool:
        """Whether the model has an n-gram branch (model.ngram_branch; checkpoints from before it have none)."""
        return self.hparams.get("ngram_branch", False)

    def with_ngrams(self, logits: torch.Tensor, ngrams: torch.Tensor | None) -> torch.Tensor:
        """The encoder's logits, or with an n-gram branch, they and its scores standardised and added."""
        return standardised(logits) + standardised(self.ngrams(ngrams)) if self.branch else logits

    def features(self, batch: TextBatch) -> torch.Tensor:
        return self.encoder(batch.tokens, batch.tokens != self.hparams.pad_id)

    def logits_and_features(self, batch: TextBatch) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features(batch)
        return self.with_ngrams(self.head(features), batch.ngrams), features

    def inputs_and_targets(self, batch: TextBatch) -> tuple[Any, torch.Tensor]:
        """What `forward` takes from a batch (a tuple of its arguments with model.ngram_branch), and what its
        output is scored against (export, bench)."""
        if self.branch:
            return (batch.tokens, batch.ngrams), batch.label
        return batch.tokens, batch.label

    def training_step(self, batch: TextBatch, batch_idx: int) -> torch.Tensor:
        with self.step_randomness():  # dropout: the same when a run resumes
            if not self.branch:
                return self.score("train", self(batch.tokens), batch.label)
            # each model on its own loss, as if trained alone; the metrics read their sum
            logits = self.head(self.features(batch))
            scores = self.ngrams(batch.ngrams)
        loss = (
            self.loss(logits, batch.label)
            + squared_hinge(scores, batch.label)
            + self.ngrams.penalty(self._penalty_scale)
        )
        return self.score("train", standardised(logits) + standardised(scores), batch.label, loss)

    def validation_step(self, batch: TextBatch, batch_idx: int) -> None:
        self.score("val", self(batch.tokens, batch.ngrams), batch.label)

    def test_step(self, batch: TextBatch, batch_idx: int) -> None:
        self.score("test", self(batch.tokens, batch.ngrams), batch.label)

    def on_train_batch_start(self, batch: TextBatch, batch_idx: int) -> None:
        """The first training batch of a fit, as texts (after truncation and augmentation), for the loggers."""
        detokenize = getattr(self._trainer and self.trainer.datamodule, "detokenize", None)
        if not self._batch_logged and detokenize is not None and (loggers := media_loggers(self)):
            names = self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)]
            rows = ["| label | tokens | text |", "|---|---|---|"]
            for tokens, length, label in list(zip(batch.tokens, batch.lengths, batch.label, strict=True))[:TABLE_ROWS]:
                text = detokenize(tokens[: int(length)].tolist()).replace("|", "\\|").replace("\n", " ")
                rows.append(f"| {names[int(label)]} | {int(length)} | {text} |")
            log_text(loggers, "train/first_batch", "\n".join(rows), self.global_step)
        self._batch_logged = True

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Head and encoder, each split into decayed weights and undecayed norms, biases and embeddings."""
        factor = self.hparams.encoder_lr_factor
        if factor is None:
            factor = 0.1 if self.hparams.pretrained is not None else 1.0
        lr, decay = self.hparams.lr, self.hparams.weight_decay
        groups = decay_groups("head", self.head, lr, decay) + decay_groups("encoder", self.encoder, lr * factor, decay)
        if self.branch:  # penalised in its loss, not decayed: Adam's steps
            branch = list(self.ngrams.parameters())
            groups.append({"name": "ngrams", "params": branch, "lr": self.hparams.ngram_lr, "weight_decay": 0.0})
        return groups

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint trained with another tokenizer than the data's (its ids would mean other words), or
        whose tensors do not fit the model."""
        theirs = checkpoint.get("hyper_parameters", {}).get("tokenizer_hash")
        ours = self.hparams.tokenizer_hash
        if theirs and ours and theirs != ours:
            theirs = theirs if isinstance(theirs, str) else quoted(theirs)  # a damaged file's: a number, a list
            raise UserError(
                f"the checkpoint was trained with another tokenizer (sha256 {theirs[:12]}…) than "
                f"the data's ({ours[:12]}…): use the tokenizer.json it was trained with"
            )
        super().on_load_checkpoint(checkpoint)  # and tensors of this model's shapes
