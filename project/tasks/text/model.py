"""TextClassifier: token ids in, class logits out; padding is masked, so a batch padded to its own longest
text gives the same logits as each text alone."""

from __future__ import annotations

from typing import Any, Literal

import torch

from project.callbacks.checkpoint_shape import quoted
from project.callbacks.media import log_text, media_loggers
from project.errors import UserError
from project.tasks.classifier import Classifier, decay_groups, squared_hinge, training_samples
from project.tasks.factories import LOADER, described
from project.tasks.text.base import EncoderFactory, FromData
from project.tasks.text.batch import TextBatch
from project.tasks.text.branch import BranchFactory, standardised
from project.tasks.text.frequencies import set_counts

TABLE_ROWS = 16  # texts of the first training batch shown in TensorBoard


class TextClassifier(Classifier):
    """A text classifier: an encoder (`model.encoder`, a class_path), its head, and optionally an n-gram branch
    beside it, trained with one optimizer, schedule and loss. What the data says (classes, vocabulary, padding,
    tokenizer) is linked from the data module and passed to the encoder as it is built (base.py's `FromData`).

    Args:
        encoder: the encoder's class_path and its own settings (init_args): project.tasks.text.encoders.Linear
            (a linear model of the ids: with data.tokenizer hashed, root pooling, idf, nb and the squared hinge,
            NBSVM; configs/text/nbsvm.yaml), Bag (fastText: pooled embeddings and a linear head), NGrams (BPE token
            and hashed token n-gram embeddings), Conv (sees local word order such as negation;
            configs/text/demo.yaml), Transformer (the whole text's order, slow to train from scratch), or
            project.tasks.text.pretrained.Pretrained (a local Hugging Face folder, fine-tuned;
            configs/text/pretrained.yaml). `--model.encoder.help Linear` lists a class's settings.
        ngram_branch: beside the encoder, project.tasks.text.branch.NGramBranch: an NBSVM on the hashed word and
            character n-grams the data adds (data.ngram_ids), trained on its own loss in the same steps. The two
            models' class scores are each standardised over the classes, per text, and added: the logits. They err
            on different texts, so the sum beats both (benchmarks/README.md, "Text on real data");
            configs/text/default.yaml. None (the default): no branch.
        num_classes: number of classes (linked from the data's shard index; never set it by hand).
        class_names: names of the classes (linked from the data), kept in checkpoints for reports.
        vocab_size: the tokenizer's vocabulary size (linked from the data).
        pad_id: the tokenizer's padding id (linked from the data); padded positions are masked.
        max_tokens: the longest input (linked from the data).
        tokenizer_hash: the sha256 of the tokenizer the model is trained with (linked from the data); a
            checkpoint loaded with data tokenized otherwise is refused.
        ngram_buckets: the n-grams' ids (linked from data.hash_buckets when data.ngram_ids is set; never by hand).
        optimizer: adamw, or sgd with Nesterov momentum.
        lr: peak learning rate (of the head).
        encoder_lr_factor: the encoder's learning rate relative to the head's; by default the encoder's own
            (1, and 0.1 for a Pretrained one: fine-tuning moves its weights less than the new head's).
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
    """

    def __init__(
        self,
        *,
        encoder: EncoderFactory,
        ngram_branch: BranchFactory | None = None,
        num_classes: int = 2,
        class_names: list[str] | None = None,
        vocab_size: int = 8000,
        pad_id: int = 0,
        max_tokens: int = 128,
        tokenizer_hash: str | None = None,
        ngram_buckets: int = 0,
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
    ) -> None:
        super().__init__()
        check_settings(loss, label_smoothing, l2_c, branch=ngram_branch is not None)
        self.save_hyperparameters()
        # what checkpoints and loggers keep: the modules as a config names them, rebuilt by load_from_checkpoint
        modules = {"encoder": described(encoder, "model.encoder")}
        modules["ngram_branch"] = described(ngram_branch, "model.ngram_branch")
        for hyperparameters in (self.hparams, self._hparams_initial):
            hyperparameters.update(modules, _instantiator=hyperparameters.get("_instantiator", LOADER))
        data = FromData(vocab_size, pad_id, max_tokens, num_classes, tokenizer_hash, ngram_buckets)
        self.encoder = encoder(data=data)
        self.head = self.encoder.make_head(num_classes)
        self.ngrams = None if ngram_branch is None else ngram_branch(data=data)
        self.setup_metrics(num_classes)
        self.example_input_array = torch.full((2, 8), pad_id + 1 if pad_id == 0 else 0, dtype=torch.long)
        if self.branch:
            self.example_input_array = (self.example_input_array, torch.ones(2, 8, dtype=torch.long))
        self._penalty_scale = 0.0  # the n-gram branch's 1 / (2 C N), set when a fit starts
        self._batch_logged = False

    def setup(self, stage: str) -> None:
        """Before a fit with an encoder that weighs ids by their counts (idf, nb) or an n-gram branch: the ids'
        document frequencies (per class for nb), from the data module's training split, in one pass."""
        bags = [(self.encoder, self.hparams.vocab_size, False)] if getattr(self.encoder, "counted", False) else []
        if self.branch:
            bags.append((self.ngrams.encoder, self.hparams.ngram_buckets, True))
        if stage != "fit" or not bags:
            return
        for bag, size, ngrams in bags:
            set_counts(self, bag, size=size, ngrams=ngrams)
        if self.branch:
            self._penalty_scale = 1.0 / (2 * self.ngrams.l2_c * training_samples(self.trainer))

    def forward(self, tokens: torch.Tensor, ngrams: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for a batch of token ids [B, L], padded with `pad_id`; with model.ngram_branch, also of its
        hashed n-gram ids [B, M], padded with 0."""
        return self.with_ngrams(self.head(self.encoder(tokens, tokens != self.hparams.pad_id)), ngrams)

    @property
    def branch(self) -> bool:
        """Whether the model has an n-gram branch (model.ngram_branch)."""
        return self.ngrams is not None

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
            factor = self.encoder.lr_factor
        lr, decay = self.hparams.lr, self.hparams.weight_decay
        groups = decay_groups("head", self.head, lr, decay) + decay_groups("encoder", self.encoder, lr * factor, decay)
        if self.branch:  # penalised in its loss, not decayed: Adam's steps
            branch = list(self.ngrams.parameters())
            groups.append({"name": "ngrams", "params": branch, "lr": self.ngrams.lr, "weight_decay": 0.0})
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


def check_settings(loss: str, label_smoothing: float, l2_c: float | None, branch: bool) -> None:
    """The classifier's own settings, checked before anything is built (each encoder checks its own)."""
    if l2_c is not None and not l2_c > 0:
        raise UserError(f"model.l2_c must be positive (smaller is a stronger penalty), got {l2_c}")
    if l2_c is not None and branch:
        raise UserError("model.l2_c penalises a linear model; with model.ngram_branch set its l2_c instead")
    if loss == "squared_hinge" and label_smoothing:
        raise UserError("model.label_smoothing applies to cross_entropy, not squared_hinge: set one of them")
