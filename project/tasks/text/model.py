"""TextClassifier: token ids in, class logits out; padding is masked, so a batch padded to its own longest
text gives the same logits as each text alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from project.callbacks.media import log_text, media_loggers
from project.errors import UserError
from project.tasks.classifier import Classifier
from project.tasks.text.batch import TextBatch
from project.tasks.text.tokenizer import file_hash

TABLE_ROWS = 16  # texts of the first training batch shown in TensorBoard


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
        encoder: cnn (convolutions over neighbouring tokens and a max over positions: the fastest to
            train on a CPU, and it sees local word order such as negation), transformer (a small pre-norm
            encoder with mean pooling: sees the whole text's order, slower to train from scratch), or bag
            (the mean of token embeddings: a baseline blind to word order).
        pretrained: a local folder holding a Hugging Face encoder (config.json and weights, e.g. a
            DistilBERT saved with save_pretrained) to fine-tune instead; set data.tokenizer to its
            tokenizer.json. Nothing is downloaded.
        dim: width of the embeddings and of the encoder.
        layers: convolution or transformer layers.
        heads: attention heads of each transformer layer.
        kernel: tokens each convolution spans (cnn).
        dropout: dropout in the encoder and before the head.
        optimizer: adamw, or sgd with Nesterov momentum.
        lr: peak learning rate.
        momentum: SGD momentum.
        weight_decay: weight decay of weights; norms, biases and embeddings get none.
        schedule: learning-rate schedule after `warmup_fraction` of linear warmup: cosine, onecycle or
            constant (see project/tasks/classifier.py).
        warmup_fraction: share of the steps spent warming up.
        label_smoothing: cross-entropy label smoothing.
    """

    def __init__(
        self,
        num_classes: int = 2,
        class_names: list[str] | None = None,
        vocab_size: int = 8000,
        pad_id: int = 0,
        max_tokens: int = 128,
        tokenizer_hash: str | None = None,
        encoder: Literal["cnn", "transformer", "bag"] = "cnn",
        pretrained: str | None = None,
        dim: int = 128,
        layers: int = 2,
        heads: int = 4,
        kernel: int = 3,
        dropout: float = 0.1,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        lr: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.01,
        schedule: Literal["cosine", "onecycle", "constant"] = "cosine",
        warmup_fraction: float = 0.1,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if pretrained is not None:
            self.encoder = PretrainedEncoder(pretrained)
            if tokenizer_hash is not None:  # linked from the data (not a model built on its own)
                self.encoder.check_tokenizer(tokenizer_hash, vocab_size)
        elif encoder == "bag":
            self.encoder = BagEncoder(vocab_size, dim, pad_id)
        elif encoder == "cnn":
            self.encoder = ConvEncoder(vocab_size, dim, layers, kernel, dropout, pad_id)
        else:
            self.encoder = TransformerEncoder(vocab_size, dim, layers, heads, dropout, max_tokens, pad_id)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.encoder.dim, num_classes))
        self.setup_metrics(num_classes)
        self.example_input_array = torch.full((2, 8), pad_id + 1 if pad_id == 0 else 0, dtype=torch.long)
        self._batch_logged = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of token ids [B, L], padded with `pad_id`."""
        mask = tokens != self.hparams.pad_id
        return self.head(self.encoder(tokens, mask))

    def features(self, batch: TextBatch) -> torch.Tensor:
        return self.encoder(batch.tokens, batch.tokens != self.hparams.pad_id)

    def inputs_and_targets(self, batch: TextBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """What `forward` takes from a batch, and what its output is scored against (export, bench)."""
        return batch.tokens, batch.label

    def training_step(self, batch: TextBatch, batch_idx: int) -> torch.Tensor:
        with self.step_randomness():  # dropout: the same when a run resumes
            logits = self(batch.tokens)
        return self.score("train", logits, batch.label)

    def validation_step(self, batch: TextBatch, batch_idx: int) -> None:
        self.score("val", self(batch.tokens), batch.label)

    def test_step(self, batch: TextBatch, batch_idx: int) -> None:
        self.score("test", self(batch.tokens), batch.label)

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

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint trained with another tokenizer than the data's: its ids would mean other words."""
        theirs = checkpoint.get("hyper_parameters", {}).get("tokenizer_hash")
        ours = self.hparams.tokenizer_hash
        if theirs and ours and theirs != ours:
            raise UserError(
                f"the checkpoint was trained with another tokenizer (sha256 {theirs[:12]}…) than "
                f"the data's ({ours[:12]}…): use the tokenizer.json it was trained with"
            )


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of `states` [B, L, D] over the positions where `mask` [B, L] is true."""
    weights = mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1)


class BagEncoder(nn.Module):
    """The mean of the token embeddings (padding left out): fast, and blind to word order."""

    def __init__(self, vocab_size: int, dim: int, pad_id: int) -> None:
        super().__init__()
        self.dim = dim
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(self.embedding(tokens), mask)


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


class PretrainedEncoder(nn.Module):
    """A Hugging Face encoder from a local folder (transformers' AutoModel; never downloads)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        try:
            from transformers import AutoModel
        except ImportError:
            raise UserError("model.pretrained needs transformers: pip install -e '.[text]'") from None
        try:  # a folder from a stranger: its weights load as tensors only, and code it names is never run
            self.model = AutoModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        except Exception as error:  # noqa: BLE001 - transformers raises many kinds for a folder it cannot use
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(f"model.pretrained: no usable Hugging Face model in {folder} ({first})") from None
        self.model.train()  # from_pretrained returns it in eval mode, which Lightning keeps: no dropout in training
        self.dim = self.model.config.hidden_size
        self.folder = folder

    def check_tokenizer(self, data_hash: str, data_vocab: int) -> None:
        """The data must be tokenized with the model's own tokenizer: another one's ids would still fit the
        embedding table and train, silently, on nonsense."""
        own = Path(self.folder) / "tokenizer.json"
        hint = f"set data.tokenizer {own}" if own.is_file() else "set data.tokenizer to the model's tokenizer.json"
        if own.is_file() and file_hash(own) != data_hash:
            raise UserError(f"the data is tokenized with another tokenizer than model.pretrained's: {hint}")
        if data_vocab > self.model.config.vocab_size:
            raise UserError(
                f"the data's tokenizer has {data_vocab} tokens, model.pretrained's embeddings "
                f"{self.model.config.vocab_size}: {hint}"
            )

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        states = self.model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        return masked_mean(states, mask)
