"""Train a byte-level BPE tokenizer on a text dataset's training split and record it in the split's index.

    python -m project.tasks.text.tokenizer DIR [--vocab_size 8000] [--max_chars N] [--seed S]

(`shards-tokenizer` is the same command.)

DIR: a prepared dataset (DIR/train/shardindex.json), its train/ folder, or the training shard index. Only the
training split is read (never val or test, so no evaluation text leaks into the vocabulary), only its `.txt`
members, in a seeded order of shards, until --max_chars characters are read. The tokenizer is written to
DIR/train/tokenizer.json and its sha256 is recorded in the training index (`"tokenizer"`), so a model can
check that it tokenizes with the tokenizer its data was meant for (`check_tokenizer`).
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from project.commands import run_command
from project.data.atomic import write_atomically
from project.data.samples import read_samples
from project.data.shard_index import INDEX_NAME, ShardIndex, read_index, write_index
from project.errors import UserError, is_interrupt, run_main

# the DataLoader's workers encode with the tokenizer: a Rust thread pool started before they fork would
# make tokenizers disable itself with a warning in every worker, so encoding stays single-threaded
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PAD = "<pad>"
PAD_ID = 0  # the text task pads with 0 and masks it: the first special token gets id 0
UNK = "<unk>"
SPECIALS = [PAD, UNK]
FILE_NAME = "tokenizer.json"
MIN_VOCAB = 256 + len(SPECIALS)  # every byte, and the special tokens
TEXT = "txt"
STATS_TEXTS = 10_000  # texts the report's ratios are measured on, at most
COMMAND = "python -m project.tasks.text.tokenizer"


@dataclass(frozen=True)
class TokenizerReport:
    """What `train_tokenizer` wrote and read, and how long its encodings are."""

    path: Path
    sha256: str
    vocab_size: int
    texts: int  # texts read (and trained on)
    chars: int  # their characters
    tokens_per_text: float  # mean tokens of a text
    tokens_per_word: float  # mean tokens / mean whitespace-separated words
    tokens_per_byte: float  # mean tokens / mean UTF-8 bytes
    skipped: int  # samples without a UTF-8 .txt member
    asked: int = 0  # the vocab_size asked for; the texts may offer fewer merges

    def line(self) -> str:
        skipped = f" (skipped {self.skipped:,} samples without UTF-8 text)" if self.skipped else ""
        fewer = f" (all these texts offer; {self.asked} asked)" if self.asked > self.vocab_size else ""
        return (
            f"wrote {self.path}: {self.vocab_size} tokens{fewer} from {self.chars:,} characters of "
            f"{self.texts:,} training texts{skipped}; {self.tokens_per_text:.1f} tokens a text = "
            f"{self.tokens_per_word:.2f} per word, {self.tokens_per_byte:.2f} per byte"
        )


def text_prefix(data: bytes, chars: int) -> str:
    """The first `chars` characters of UTF-8 `data`, decoding no more than they can take (4 bytes each): a
    tokenizer's work, and a decoded string's memory, follow what it is given, not the member's size.
    Invalid UTF-8 within that start is a `UnicodeDecodeError`; a character cut at the byte limit is left out."""
    head = data[: 4 * chars]
    decoder = codecs.getincrementaldecoder("utf-8")()
    return decoder.decode(head, final=len(head) == len(data))[:chars]


def file_hash(path: str | Path) -> str:
    """The sha256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json, as a `tokenizers.Tokenizer`; a literal "<pad>" in a text is encoded as text, not as 0."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except FileNotFoundError:
        raise UserError(f"tokenizer not found: {path}: train it with {COMMAND} DATA") from None
    except BaseException as error:  # noqa: BLE001 - a bare Exception for a file it cannot parse, a Rust panic
        problem = UserError(f"{path} is not a tokenizer.json: {(str(error).splitlines() or [''])[0]}")
        raise error if is_interrupt(error) else problem from None  # (a BaseException) for a part it cannot build
    tokenizer.encode_special_tokens = True
    return tokenizer


def recorded_tokenizer(index: ShardIndex) -> dict | None:
    """The tokenizer a shard index records (`{"file", "sha256", "vocab_size"}`), if any."""
    entry = index.extra.get("tokenizer")
    return entry if isinstance(entry, dict) else None


def check_tokenizer(path: str | Path, index: ShardIndex, index_path: str | Path | None = None) -> str:
    """The hash of the tokenizer file at `path`; a `UserError` when it is missing or differs from the one
    `index` records (an index that records none accepts any)."""
    path = Path(path)
    where = index_path or path.parent / INDEX_NAME
    if not path.is_file():
        raise UserError(f"tokenizer not found: {path}: train it with {COMMAND} {_dataset_of(path)}")
    found = file_hash(path)
    expected = (recorded_tokenizer(index) or {}).get("sha256")
    if expected and expected != found:
        raise UserError(
            f"{path} does not match the one the shards were tokenized for (sha256 {found[:12]}… vs {expected[:12]}… "
            f"in {where}): train it again with {COMMAND} {_dataset_of(path)}"
        )
    return found


def _dataset_of(path: Path) -> Path:
    """The dataset folder to name in a hint: the parent of train/, else the tokenizer's own folder."""
    folder = path.parent
    return folder.parent if folder.name == "train" else folder


def training_index(data: str | Path) -> Path:
    """The training split's shard index of `data` (dataset root, its train/ folder, or the index itself)."""
    data = Path(data).expanduser()
    if not data.exists():
        raise UserError(f"data path not found: {data}")
    if data.is_file():
        path = data
    elif (data / "train" / INDEX_NAME).is_file():
        path = data / "train" / INDEX_NAME
    elif (data / INDEX_NAME).is_file():
        path = data / INDEX_NAME
    else:
        raise UserError(f"no training split in {data}: expected {data / 'train' / INDEX_NAME} (prepare the shards)")
    if path.parent.name in ("val", "test"):
        raise UserError(f"{path} is the {path.parent.name} split: a tokenizer learns from the training split only")
    return path


def _check_arguments(vocab_size: int, max_chars: int) -> None:
    if vocab_size < MIN_VOCAB:
        raise UserError(f"--vocab_size {vocab_size} is too small: byte-level BPE needs at least {MIN_VOCAB}")
    if max_chars <= 0:
        raise UserError(f"--max_chars must be positive, got {max_chars}")


class _Reader:
    """The training texts, in a seeded order of shards, until `max_chars` characters are read; keeps a
    seeded sample of up to STATS_TEXTS of them for the report."""

    def __init__(self, index: ShardIndex, max_chars: int, seed: int, progress: Progress) -> None:
        self.shards = list(index.shards)
        random.Random(seed).shuffle(self.shards)
        self.max_chars, self.progress = max_chars, progress
        self.task = progress.add_task("tokenizer", total=index.nsamples, chars="0")
        self.sampler = random.Random(seed + 1)
        self.sample: list[str] = []
        self.texts = self.chars = self.skipped = 0

    def __iter__(self) -> Iterator[str]:
        for shard in self.shards:
            with contextlib.closing(read_samples(shard.url, extensions=frozenset([TEXT]))) as samples:
                for sample in samples:
                    self.progress.advance(self.task)
                    try:  # at most the characters still wanted: one text of 512 MiB is read only as far
                        text = text_prefix(sample[TEXT], self.max_chars - self.chars)
                    except (KeyError, UnicodeDecodeError):
                        self.skipped += 1
                        continue
                    self._keep(text)
                    self.texts += 1
                    self.chars += len(text)
                    self.progress.update(self.task, chars=f"{self.chars:,}")
                    yield text
                    if self.chars >= self.max_chars:  # the cap: no more shards opened, this one closed
                        return

    def _keep(self, text: str) -> None:
        """Reservoir sampling: every text read is in the sample with the same chance."""
        if len(self.sample) < STATS_TEXTS:
            self.sample.append(text)
        elif (slot := self.sampler.randrange(self.texts + 1)) < STATS_TEXTS:
            self.sample[slot] = text


def new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _write_atomically(path: Path, text: str) -> bytes:
    data = text.encode("utf-8")
    write_atomically(path, lambda stream: stream.write(data))  # a worker never reads half a tokenizer
    return data


def _ratios(tokenizer: Tokenizer, texts: list[str]) -> tuple[float, float, float]:
    """Mean tokens of a text, and that over the mean words and over the mean UTF-8 bytes of a text."""
    if not texts:
        return 0.0, 0.0, 0.0
    tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch(texts))
    words = sum(len(text.split()) for text in texts)
    size = sum(len(text.encode("utf-8")) for text in texts)
    return tokens / len(texts), tokens / max(words, 1), tokens / max(size, 1)


def train_tokenizer(
    data: str | Path,
    vocab_size: int = 8000,
    max_chars: int = 50_000_000,
    seed: int = 0,
    quiet: bool = False,
) -> TokenizerReport:
    """Train the tokenizer on the training split of `data`, write it beside the training index and record
    its hash there; returns what was written and read.

    Args:
        data: a prepared dataset (with train/), its train/ folder, or the training shard index.
        vocab_size: tokens, special ones included.
        max_chars: characters of training text to read, at most.
        seed: seed of the shard order.
        quiet: no progress bar.
    """
    _check_arguments(vocab_size, max_chars)
    index_path = training_index(data)
    index = read_index(str(index_path))
    # No seeding is needed: the BPE trainer counts in threads but merges the counts and breaks ties by the pair's ids,
    # so a run is deterministic for its input, which the seed's shard order fixes (checked with 1 and 8 threads).
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer = new_tokenizer()
    columns = (
        TextColumn("tokenizer"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples, {task.fields[chars]} chars"),
    )
    with Progress(*columns, disable=quiet) as progress:
        reader = _Reader(index, max_chars, seed, progress)
        tokenizer.train_from_iterator(iter(reader), trainer)
    if reader.texts == 0:
        raise UserError(f"no texts in the training split {index_path}: expected .{TEXT} members of UTF-8 text")
    if tokenizer.token_to_id(PAD) != PAD_ID:  # the text task pads with PAD_ID and masks it
        raise RuntimeError(f"{PAD} has id {tokenizer.token_to_id(PAD)}, expected {PAD_ID}")
    path = index_path.parent / FILE_NAME
    written = _write_atomically(path, tokenizer.to_str())
    sha256 = hashlib.sha256(written).hexdigest()
    size = tokenizer.get_vocab_size()
    entry = {"file": FILE_NAME, "sha256": sha256, "vocab_size": size}
    write_index(index_path, index.shards, index.name, {**index.extra, "tokenizer": entry})
    tokenizer.encode_special_tokens = True  # measure as load_tokenizer encodes
    per_text, per_word, per_byte = _ratios(tokenizer, reader.sample)
    return TokenizerReport(
        path, sha256, size, reader.texts, reader.chars, per_text, per_word, per_byte, reader.skipped, asked=vocab_size
    )


def command(data: str, **kwargs: Any) -> TokenizerReport:
    """Train a byte-level BPE tokenizer on a text dataset's training split and record it in the split's index.

    Args:
        data: a prepared dataset (with train/), its train/ folder, or the training shard index.
    """
    report = train_tokenizer(data, **kwargs)
    print(report.line())
    return report


def main(argv: list[str] | None = None) -> TokenizerReport:
    return run_command(command, "project.tasks.text.tokenizer", argv)


def console() -> None:
    """The `shards-tokenizer` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
