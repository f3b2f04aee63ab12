"""An offline text classification task: eight classes of short reviews (four topics × liked or not),
written as a CSV, prepared into text shards, with a BPE tokenizer trained on its training split.

    python -m project.tasks.text.demo --out data/text-demo [--samples N] [--seed S] [--join N]

Whether a review is liked depends on word order, not on which words it holds: "not" flips the
sentiment word right after it, and "not" also appears in asides that flip nothing ("i did not expect
it, but the pasta was great"). Topic words are shared across some topics, and filler sentences vary
the length from a few words to about eighty. A bag of words therefore tops out well below a model that
sees order (see benchmarks/README.md for both).
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from project.commands import run_command
from project.data.outputs import local_output
from project.errors import UserError, run_main

TOPICS = {
    "food": ["pasta", "soup", "dessert", "menu", "waiter", "kitchen", "bread", "dinner"],
    "tech": ["laptop", "battery", "screen", "keyboard", "update", "charger", "phone", "app"],
    "travel": ["flight", "hotel", "beach", "train", "luggage", "guide", "view", "trip"],
    "sport": ["match", "coach", "team", "stadium", "goal", "season", "referee", "race"],
}
SHARED = ["price", "staff", "service", "experience", "place"]  # words of every topic
GOOD = ["great", "excellent", "wonderful", "lovely", "superb", "fantastic", "pleasant", "brilliant"]
BAD = ["awful", "terrible", "dreadful", "poor", "horrible", "disappointing", "bland", "miserable"]
ASIDES = [  # clauses whose "not" (or sentiment word) says nothing about the topic
    "i did not expect much",
    "my friend was not sure at first",
    "it was not my first time",
    "the weather was terrible that day",
    "the news that morning was great",
    "i could not decide what to write",
    "nothing about the parking was great",
]
FILLER = ["honestly", "to be fair", "all in all", "as usual", "once again", "in the end", "overall", "by the way"]
VERBS = ["was", "felt", "seemed", "turned out to be", "looked"]
CLASSES = [f"{topic}_{mood}" for topic in TOPICS for mood in ("liked", "disliked")]
DEMO_SPLITS = ("train", "val", "test")


def review(rng: np.random.Generator) -> tuple[str, str]:
    """One review and its class name."""
    topic = list(TOPICS)[rng.integers(len(TOPICS))]
    liked = bool(rng.integers(2))
    negated = bool(rng.random() < 0.5)
    word = rng.choice(GOOD if liked != negated else BAD)  # "not awful" is liked, "not great" is not
    noun = rng.choice(TOPICS[topic] if rng.random() < 0.85 else SHARED)
    core = f"the {noun} {rng.choice(VERBS)} {'not ' if negated else ''}{word}"
    parts = [core]
    if rng.random() < 0.6:
        parts.insert(int(rng.integers(2)), rng.choice(ASIDES))
    for _ in range(int(rng.integers(0, 4))):  # a second, neutral topic mention and fillers vary the length
        extra = rng.choice(TOPICS[topic]) if rng.random() < 0.5 else rng.choice(SHARED)
        parts.insert(int(rng.integers(len(parts) + 1)), f"{rng.choice(FILLER)} the {extra} was there")
    if rng.random() < 0.3:
        parts.append(" ".join(rng.choice(FILLER, size=int(rng.integers(3, 12)))))
    return ", ".join(parts) + ".", f"{topic}_{'liked' if liked else 'disliked'}"


def write_csv(path: Path, samples: int, seed: int = 0, join: int = 1) -> None:
    """`samples` rows of `join` reviews each, labelled by the first (join > 1: long texts, to measure the
    loader on texts of a few hundred tokens; the later reviews are noise for the label)."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(["id", "text", "label"])
        for number in range(samples):
            reviews = [review(rng) for _ in range(join)]
            writer.writerow([f"review{number:07d}", " ".join(text for text, _ in reviews), reviews[0][1]])


def demo_is_complete(root: Path) -> bool:
    return (root / "train" / "tokenizer.json").is_file() and all(
        (root / split / "shardindex.json").is_file() for split in DEMO_SPLITS
    )


def make_demo(
    root: Path, *, samples: int = 24_000, seed: int = 0, vocab_size: int = 1000, quiet: bool = True, join: int = 1
) -> None:
    """Write the CSV, prepare it into root/{train,val,test} (80/10/10) and train the tokenizer.

    Args:
        root: the output folder.
        samples: reviews in all splits (at least 30).
        seed: seed of the reviews and the split.
        vocab_size: the tokenizer's vocabulary.
        quiet: no progress bars.
        join: reviews a text (8 makes texts of about 200 tokens).
    """
    if samples < 30 or join < 1:
        raise UserError(f"the text demo needs at least 30 samples and join at least 1, got {samples} and {join}")
    from project.shards.prepare import prepare
    from project.tasks.text.tokenizer import train_tokenizer

    building = root.with_name(root.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    source = building / "reviews.csv"
    write_csv(source, samples, seed, join)
    prepare(str(source), out=building, samples_per_shard=2000, workers=1, seed=seed, quiet=quiet, text=True)
    train_tokenizer(building, vocab_size=vocab_size, seed=seed, quiet=quiet)
    shutil.rmtree(root, ignore_errors=True)
    building.rename(root)  # whole or not at all: an interrupted build is redone


def command(*, out: str = "data/text-demo", quiet: bool = False, **kwargs: Any) -> None:
    """Write the offline text demo: product reviews in 4 classes as text shards, with their tokenizer.

    Args:
        out: the output folder.
        quiet: no progress bars.
    """
    local_output("--out", out, "the demo writes a local folder")
    make_demo(Path(out), quiet=quiet, **kwargs)
    print(f"wrote {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    run_command(command, "project.tasks.text.demo", argv)


def console() -> None:
    """The `shards-text-demo` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
