"""Hugging Face folders, for fine-tuning: a pretrained encoder (transformers' AutoModel) and its own tokenizer
(AutoTokenizer), both read from a local folder with `local_files_only`: nothing is downloaded, no code the
folder names is run, and weights load as tensors only."""

from __future__ import annotations

import contextlib
import hashlib
import zipfile
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from project.callbacks.checkpoint_pickle import pickle_problem
from project.errors import UserError, is_interrupt
from project.tasks.text.base import FromData, TextEncoder, masked_mean
from project.tasks.text.hashed import HashedNGrams
from project.tasks.weights import check_finite

INSTALL = "pip install -e '.[text]'"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def folder_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a Hugging Face folder (AutoTokenizer: tokenizer.json, or a vocabulary it converts),
    as the `tokenizers.Tokenizer` the text task encodes with; its [CLS] ... [SEP] template is kept."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(f"a tokenizer folder ({folder}) needs transformers: {INSTALL}") from None
    try:
        auto = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except BaseException as error:  # noqa: BLE001 - transformers raises many kinds for a folder it cannot use, and
        if is_interrupt(error):  # tokenizers a Rust panic (a BaseException) for a part it cannot build
            raise
        raise UserError(f"no usable Hugging Face tokenizer in {folder} ({_first_line(error)})") from None
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:
        raise UserError(f"the tokenizer in {folder} has no fast (Rust) form: save it with a tokenizer.json")
    return Tokenizer.from_str(backend.to_str())


def folder_fingerprint(folder: str | Path) -> str:
    """The sha256 of a folder's tokenizer as it encodes (its serialized form): what a checkpoint records."""
    return hashlib.sha256(folder_tokenizer(folder).to_str().encode("utf-8")).hexdigest()


def check_pickles(folder: str | Path) -> None:
    """A `UserError` for a pickled weights file of the folder (`*.bin`, which transformers unpickles with
    weights_only=True when there is no safetensors file) whose plain data would cost without bound to unpickle: 1 kB
    of memo references made a dict key that torch hashed for ever (checkpoint_pickle.py)."""
    for path in sorted(Path(folder).glob("*.bin")):
        try:
            problem = pickle_problem(path)
        except (OSError, zipfile.BadZipFile):  # transformers says what is wrong with it, if it reads it
            continue
        if problem:
            raise UserError(f"model.encoder.folder: {path}: refused: {problem} (a bomb, or a damaged file)")


def load_model(folder: str) -> nn.Module:
    """The folder's AutoModel, in training mode, its weights checked (none NaN, no pickle bomb)."""
    try:
        from transformers import AutoModel
    except ImportError:
        raise UserError(f"model.encoder.folder needs transformers: {INSTALL}") from None
    check_pickles(folder)
    try:  # a folder from a stranger: its weights load as tensors only, and code it names is never run
        model = AutoModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False, weights_only=True)
    except Exception as error:  # noqa: BLE001 - transformers raises many kinds for a folder it cannot use
        raise UserError(
            f"model.encoder.folder: no usable Hugging Face model in {folder} ({_first_line(error)})"
        ) from None
    parameters = dict(model.named_parameters())
    check_finite([*parameters.items(), *model.named_buffers()], parameters, f"model.encoder.folder {folder}: ")
    return model.train()  # from_pretrained returns it in eval mode, which Lightning keeps: no dropout in training


class Pretrained(TextEncoder):
    """A Hugging Face encoder from a local folder (transformers' AutoModel; never downloads), fine-tuned, with the
    masked mean of its last layer as the features. It learns at 0.1 x the head's rate unless
    model.encoder_lr_factor says otherwise: fine-tuning moves its weights less than the new head's.

    Args:
        data: what the data module says (given by the classifier): the data must be tokenized with the folder's
            own tokenizer, in texts no longer than its positions.
        folder: a local folder holding a Hugging Face encoder (config.json and weights, e.g. a DistilBERT saved
            with save_pretrained); the data is tokenized with the folder's own tokenizer unless data.tokenizer
            names another. Nothing is downloaded.
        dropout: dropout before the new head.
    """

    lr_factor = 0.1

    def __init__(self, *, data: FromData, folder: str, dropout: float = 0.1) -> None:
        super().__init__()
        if data.tokenizer_hash is not None and data.tokenizer_hash == HashedNGrams.fingerprint(data.vocab_size):
            raise UserError(
                "a Pretrained encoder reads its own tokenizer's ids, not hashed n-grams: add --data.tokenizer=null "
                "(configs/text/nbsvm.yaml sets data.tokenizer: hashed)"
            )
        self.model = load_model(folder)
        self.dim, self.head_dropout, self.folder = self.model.config.hidden_size, dropout, folder
        if data.tokenizer_hash is not None:  # linked from the data (not a model built on its own)
            self.check_tokenizer(data.tokenizer_hash, data.vocab_size)
            self.check_length(data.max_tokens)

    def own_tokenizer_hashes(self) -> set[str]:
        """The hashes the data's tokenizer may have to be this model's own: of its folder's tokenizer.json
        file (data.tokenizer names that file), and of the tokenizer AutoTokenizer makes of the folder."""
        from project.tasks.text.tokenizer import file_hash

        hashes = set()
        if (own := Path(self.folder) / "tokenizer.json").is_file():
            hashes.add(file_hash(own))
        with contextlib.suppress(UserError):  # weights without a tokenizer: the vocabulary sizes still tell
            hashes.add(folder_fingerprint(self.folder))
        return hashes

    def check_tokenizer(self, data_hash: str, data_vocab: int) -> None:
        """The data must be tokenized with the model's own tokenizer: another one's ids would still fit the
        embedding table and train, silently, on nonsense."""
        own = self.own_tokenizer_hashes()
        hint = "leave data.tokenizer unset to use the model's own" if own else "set data.tokenizer to the model's"
        if own and data_hash not in own:
            raise UserError(f"the data is tokenized with another tokenizer than the Pretrained encoder's: {hint}")
        if data_vocab > self.model.config.vocab_size:
            raise UserError(
                f"the data's tokenizer has {data_vocab} tokens, the Pretrained encoder's embeddings "
                f"{self.model.config.vocab_size}: {hint}"
            )

    def check_length(self, max_tokens: int) -> None:
        """A text longer than the model's position table would fail in its first long batch, deep in the model."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        offset = getattr(getattr(self.model, "embeddings", None), "padding_idx", None)
        if isinstance(positions, int) and isinstance(offset, int):
            positions -= offset + 1  # RoBERTa's position ids start after its padding id: 514 rows hold 512 tokens
        if isinstance(positions, int) and max_tokens > positions:
            raise UserError(
                f"data.max_tokens is {max_tokens}, but the Pretrained encoder has {positions} positions: "
                f"set --data.max_tokens {positions} or less"
            )

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        states = self.model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        return masked_mean(states, mask)
