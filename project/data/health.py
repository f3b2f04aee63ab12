"""Accounting for unreadable samples: counted per shard, warned about at a bounded rate, and fatal past
a fraction of the epoch. Nothing sleeps per error (webdataset's `warn_and_continue` sleeps 0.5 s)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from project.data.batch import Skipped
from project.errors import ShardError
from project.redact import redact, redact_text
from project.shown import shown

log = logging.getLogger("project.data")


class SkipLedger:
    """Skipped samples of one pass (a stage's epoch) on one rank.

    Args:
        stage: "train", "val", "test" or "predict", for messages.
        epoch: the epoch of the pass: a new epoch needs a new ledger.
        planned: samples this rank reads in the pass, skipped ones included.
        max_fraction: the pass stops with a `ShardError` once more than this share of `planned` is skipped.
        warn_every: seconds between two warnings; skips in between are summed into the next one.
    """

    def __init__(self, stage: str, epoch: int, planned: int, max_fraction: float, warn_every: float = 10.0) -> None:
        self.stage, self.epoch, self.planned = stage, epoch, planned
        self.max_fraction, self.warn_every = max_fraction, warn_every
        self.by_shard: Counter[str] = Counter()
        self.unwarned = 0
        self.last_warning = float("-inf")

    @property
    def skipped(self) -> int:
        return sum(self.by_shard.values())

    def record(self, skipped: Sequence[Skipped]) -> None:
        """Count one batch's skipped samples (shard url, key, reason); warn or stop as needed."""
        if not skipped:
            return
        self.by_shard.update(url for url, _, _ in skipped)
        self.unwarned += len(skipped)
        now = time.monotonic()
        if now - self.last_warning >= self.warn_every:
            url, key, reason = skipped[-1]
            more = f" ({self.unwarned - 1} more skipped since the last warning)" if self.unwarned > 1 else ""
            # a stranger's key, shard name and decoder's message: shown, so no escape code reaches the terminal
            reason, url, key = shown(redact_text(reason)), shown(redact(url)), shown(key)
            log.warning("skipped unreadable %s sample %s in %s: %s%s", self.stage, key, url, reason, more)
            self.last_warning, self.unwarned = now, 0
        if self.skipped > self.max_fraction * self.planned:
            worst = ", ".join(f"{redact(url)} ({count})" for url, count in self.by_shard.most_common(3))
            raise ShardError(
                f"{self.skipped} of the {self.planned} {self.stage} samples of this epoch are unreadable, "
                f"more than data.max_skipped_fraction={self.max_fraction:g}; worst shards: {worst}"
            )


class SkipCount:
    """The one count of the samples a data module's stream skipped: a `SkipLedger` per stage and pass, each
    stopping its pass past `max_fraction` of the samples the rank reads in it."""

    def __init__(self, max_fraction: float) -> None:
        self.max_fraction = max_fraction
        self.ledgers: dict[str, SkipLedger] = {}  # the current pass's, by stage

    def record(self, skipped: Sequence[Skipped], trainer: Any, samples: Callable[[str], int]) -> None:
        """Count skipped samples in the ledger of the pass `trainer` runs now; `samples(stage)`: the samples of
        a stage's split over all ranks, read for a new pass's ledger."""
        stage = "train" if trainer.training else "val" if (trainer.validating or trainer.sanity_checking) else "test"
        stage = "predict" if trainer.predicting else stage
        # the sanity check's batches are read again by the first validation pass: a ledger of its own, or a
        # sample skipped there would count twice against data.max_skipped_fraction
        key = "sanity" if trainer.sanity_checking else stage
        ledger = self.ledgers.get(key)
        if ledger is None or ledger.epoch != trainer.current_epoch:
            planned = samples(stage) // trainer.world_size
            ledger = SkipLedger(stage, trainer.current_epoch, planned, self.max_fraction)
            self.ledgers[key] = ledger
        ledger.record(skipped)
