"""The text task's linear baseline: TF-IDF of word and character n-grams and a linear classifier (scikit-learn),
its regularisation picked on the val split. What a deep model on a few thousand texts has to beat.

`read_split` reads a split's texts and labels as the data module would (the same shards, `fraction`, classes
and label checks; a sample it cannot use is skipped and counted); `fit_linear` fits and scores.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from project.errors import UserError
from project.tasks.text.data import TextShards

MAX_TEXT_CHARS = 20_000  # characters of a text the baseline reads: a long document's start decides its class
MAX_TRAIN_TEXTS = 500_000  # texts of the training split fitted on, at most (TF-IDF holds them in memory)
WORDS = (1, 2)  # word n-grams
CHARS = (2, 5)  # character n-grams, within word boundaries
INSTALL = "pip install -e '.[baseline]'"


@dataclass
class Split:
    """The texts and labels read of one split, and the samples skipped."""

    texts: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    skipped: int = 0


@dataclass(frozen=True)
class LinearResult:
    """What `fit_linear` chose and measured."""

    C: float  # the chosen inverse regularisation
    val_acc: float
    test_acc: float
    val_by_C: dict[float, float]  # the val accuracy of every C tried
    features: int
    seconds: float

    def description(self) -> str:
        return f"TF-IDF word {WORDS[0]}-{WORDS[1]} + char {CHARS[0]}-{CHARS[1]} grams, linear SVM"


def read_split(data: TextShards, split: str, limit: int | None = None, quiet: bool = False) -> Split:
    """Texts (their first MAX_TEXT_CHARS characters) and class indexes of a split, at most `limit` of them."""
    read = Split()
    total = sum(shard.nsamples for shard in data.shards(split))
    columns = (TextColumn(f"baseline: reading {split}"), BarColumn(), MofNCompleteColumn())
    progress = Progress(*columns, console=Console(stderr=True), disable=quiet, transient=True)
    with progress, contextlib.closing(data.read_texts(split)) as texts:
        task = progress.add_task(split, total=min(total, limit or total))
        for item in texts:
            if limit is not None and len(read.texts) >= limit:
                break
            if item is None:
                read.skipped += 1
                continue
            read.texts.append(item[0][:MAX_TEXT_CHARS])
            read.labels.append(item[1])
            progress.advance(task)
    return read


def fit_linear(train: Split, val: Split, test: Split, grid: Sequence[float], seed: int = 0) -> LinearResult:
    """Fit TF-IDF + a linear SVM on `train` for each C of `grid`, keep the one best on `val`, score `test`."""
    try:
        from scipy.sparse import hstack
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.svm import LinearSVC
    except ImportError:
        raise UserError(f"the baseline needs scikit-learn: {INSTALL}") from None
    for name, split in (("train", train), ("val", val), ("test", test)):
        if not split.texts:
            raise UserError(f"the {name} split has no readable texts: the baseline needs train, val and test")
    if len(set(train.labels)) < 2:
        raise UserError("the training split holds one class only: nothing to classify")
    start = time.perf_counter()
    vectorizers = [
        TfidfVectorizer(ngram_range=WORDS, sublinear_tf=True, min_df=2, max_features=500_000),
        TfidfVectorizer(analyzer="char_wb", ngram_range=CHARS, sublinear_tf=True, min_df=2, max_features=500_000),
    ]
    x_train = hstack([vectorizer.fit_transform(train.texts) for vectorizer in vectorizers]).tocsr()

    def features(split: Split):  # noqa: ANN202 - a scipy sparse matrix
        return hstack([vectorizer.transform(split.texts) for vectorizer in vectorizers]).tocsr()

    x_val, x_test = features(val), features(test)
    by_C, models = {}, {}
    for C in grid:
        with warnings.catch_warnings():  # a large C may stop short of convergence: its val score says so
            warnings.simplefilter("ignore", category=UserWarning)
            model = LinearSVC(C=C, random_state=seed, max_iter=5000).fit(x_train, train.labels)
        by_C[C] = float((model.predict(x_val) == val.labels).mean())
        models[C] = model
    best = max(grid, key=lambda C: (by_C[C], -abs(C - 1)))  # ties: the C nearest 1
    test_acc = float((models[best].predict(x_test) == test.labels).mean())
    return LinearResult(best, by_C[best], test_acc, by_C, x_train.shape[1], time.perf_counter() - start)
