"""Counting ids in the training texts: the document frequencies behind the IDF weights and naive-Bayes ratios of
the Bag and Linear encoders (idf, nb) and of the n-gram branch, one pass over the training split before a fit."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from project.errors import UserError, is_interrupt


def count_documents(
    data: Any, encoder: Any, vocabulary: int, by_class: bool = False, part: tuple[int, int] = (0, 1)
) -> tuple[np.ndarray, int]:
    """How many training texts of `data` (a TextShards) hold each id, as `encoder` encodes them (truncated,
    without token dropout), and how many texts were read. With `by_class`, the counts per class, [ids, classes]
    (their sum over classes is the total). A sample training would skip is skipped. `part` (index, parts): count
    every parts-th sample from the index-th only, so that DDP ranks share the tokenizing and sum their counts
    (TextClassifier.setup); its progress shows on part 0."""
    index, parts = part
    shape = (vocabulary, data.num_classes) if by_class else (vocabulary,)
    frequencies, texts = np.zeros(shape, np.int32 if by_class else np.int64), 0  # ids x classes: halved
    columns = (TextColumn("idf: counting ids in the training texts"), BarColumn(), MofNCompleteColumn())
    progress = Progress(*columns, console=Console(stderr=True), transient=True, disable=index != 0)
    with progress:
        task = progress.add_task("idf", total=sum(shard.nsamples for shard in data.shards("train")))
        for number, read in enumerate(data.read_texts("train")):
            progress.advance(task)
            if read is not None and number % parts == index:
                try:
                    ids = np.unique(encoder.encode(read[0]).ids)
                except BaseException as error:  # noqa: BLE001 - a text that breaks the tokenizer (a Rust panic)
                    if is_interrupt(error):
                        raise
                    continue  # training skips it too (stream.py): it is not counted
                if not ids.size or ids[-1] >= vocabulary:  # no ids, or ids past the table: skipped in training too
                    continue
                frequencies[(ids, read[1]) if by_class else ids] += 1
                texts += 1
    return frequencies, texts


def set_counts(model: Any, encoder: Any, size: int, ngrams: bool = False) -> None:
    """Set a bag's IDF weights (if it has them) and naive-Bayes ratios (if it has them: counted per class) from the
    training split of the data `model` (a TextClassifier) is fitted on; `ngrams`: of the hashed n-grams beside the
    tokens, which an n-gram branch reads."""
    data, strategy, world = model.trainer.datamodule, model.trainer.strategy, model.trainer.world_size
    if not hasattr(data, "document_frequencies"):
        raise UserError("idf, nb and model.ngram_branch count ids in the training split: fit with TextShards")
    if ngrams and not getattr(data, "ngram_buckets", 0):
        raise UserError("model.ngram_branch reads hashed n-grams beside the tokens: set data.ngram_ids (8192)")
    by_class, idf = encoder.ratios is not None, encoder.idf is not None
    # each rank counts its share of the training texts, and the sums are every rank's: the same weights
    frequencies, texts = data.document_frequencies(by_class=by_class, part=(model.global_rank, world), ngrams=ngrams)
    if world > 1:
        device = strategy.root_device
        frequencies = strategy.reduce(torch.from_numpy(frequencies).to(device), reduce_op="sum").cpu().numpy()
        texts = int(strategy.reduce(torch.tensor(texts, device=device), reduce_op="sum"))
    if len(frequencies) != size:
        raise UserError(f"the data has {len(frequencies):,} ids and the model {size:,}")
    if by_class:
        encoder.set_ratios(torch.from_numpy(frequencies))
        frequencies = frequencies.sum(1)
    if idf:
        encoder.set_idf(torch.from_numpy(frequencies), texts)
