"""The inputs' rows, joined by key on disk: each sample's running sum of log-probabilities, its label, and each
input's predicted class live in a SQLite table (Python's sqlite3), so an ensemble of predictions of a pool far
larger than memory holds a batch of rows in memory, not a sum per sample.

SQLite rather than a dict: a dict costs about 0.5 KB a sample (its key, a sum, a list), 5 GB for ten million;
the table's keys are on disk and its page cache is bounded."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.errors import UserError
from project.shown import shown

BATCH = 2048  # rows read before they are merged into the table in one transaction
SCHEMA = "CREATE TABLE samples (key TEXT PRIMARY KEY, label TEXT, sums BLOB NOT NULL, predicted BLOB NOT NULL)"
MISSING = -1  # an input's predicted class where it did not hold the sample
MAX_ROW_BYTES = 16 << 20  # a JSONL row longer is skipped unread: 100,000 classes' log-probabilities take 2.5 MB
TOO_LONG = object()  # read_rows' stand-in for such a row


def read_rows(path: Path, advance: Callable[[int], Any] = lambda done: None) -> Iterator[tuple[int, Any]]:
    """(line number, row) of a JSONL or Parquet file; a JSONL line that is not JSON gives None, and one over
    MAX_ROW_BYTES gives TOO_LONG. `advance` is told the bytes (JSONL) or rows (Parquet) read."""
    if path.suffix == ".parquet":
        yield from parquet_rows(path, advance)
        return
    with open(path, "rb") as lines:
        number = 0
        while line := lines.readline(MAX_ROW_BYTES + 1):
            number += 1
            advance(len(line))
            if len(line) > MAX_ROW_BYTES:  # a stranger's line could hold gigabytes: passed over, never held
                while not line.endswith(b"\n") and (rest := lines.readline(MAX_ROW_BYTES)):
                    advance(len(rest))
                    line = rest
                yield number, TOO_LONG
                continue
            try:
                yield number, json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past the parser
                yield number, None


def parquet_rows(path: Path, advance: Callable[[int], Any]) -> Iterator[tuple[int, Any]]:
    """(row number, row) of a Parquet file. Its footer is read when it opens, its pages only as its batches
    are: a page that a damaged (or hostile) file holds is found here, and is one line naming the file."""
    import pyarrow as pa

    batches, number = parquet_file(path).iter_batches(columns=["key", "label", "log_probs"]), 0
    while True:
        try:
            batch = next(batches, None)
            rows = [] if batch is None else batch.to_pylist()
        except (pa.ArrowException, OSError, ValueError) as error:  # a page that does not decompress or decode,
            # or a string that is no UTF-8 (UnicodeDecodeError)
            reason = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
            raise UserError(f"{path} is damaged: a page after row {number} cannot be read: {shown(reason)}") from None
        if batch is None:
            return
        for row in rows:
            number += 1
            advance(1)
            if isinstance(row.get("log_probs"), list):  # Parquet's map reads back as (key, value) pairs
                row["log_probs"] = pairs(row["log_probs"])
            yield number, row


def pairs(items: list) -> dict | None:
    """A map column's (key, value) pairs as a dict; None (no log_probs) for a list of anything else, which a
    stranger's file may hold in that column."""
    try:
        return dict(items)
    except (TypeError, ValueError):
        return None


def row_values(row: Any, classes: list[str] | None) -> tuple[str, list[str], np.ndarray, str | None] | str:
    """(key, class names, log-probabilities, label) of a row, or why it cannot be used."""
    if row is TOO_LONG:
        return f"a row over {MAX_ROW_BYTES >> 20} MiB"
    if not isinstance(row, dict) or not is_text(row.get("key")):
        return "not a row with a key"
    given = row.get("log_probs")
    if not isinstance(given, dict) or not given:
        return "no log_probs"
    if not all(map(is_text, given)):  # a Parquet map's keys may be numbers, bytes or times
        return "log_probs whose classes are not names"
    names = list(given) if classes is None else classes
    if classes is not None and (len(given) != len(classes) or any(name not in given for name in classes)):
        return "classes " + ", ".join(sorted(set(given) ^ set(classes))[:3])
    try:
        values = np.array([float(given[name]) for name in names], dtype=np.float64)
    except (TypeError, ValueError):
        return "log_probs that are not numbers"
    if not np.isfinite(values).all() or values.max() > 1e-3 or not 0.99 < np.exp(values).sum() < 1.01:
        return "log_probs that are not a distribution's"
    label = row.get("label")
    if isinstance(label, str) and not is_text(label):
        return "a label that is not UTF-8"
    return row["key"], names, values, label if isinstance(label, str) else None


def is_text(value: object) -> bool:
    """A string that SQLite and the output can hold: JSON's `\\udcff` escapes make strings with lone
    surrogates, which no UTF-8 file or table can."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Joined:
    """Each key's sum of log-probabilities, label, and each input's predicted class, over the inputs added so far,
    in a SQLite file in `folder` (deleted with the folder); rows keep the order their keys were first seen."""

    def __init__(self, folder: Path) -> None:
        self.classes: list[str] | None = None
        self.skipped: dict[str, int] = {}  # per input, rows that could not be used
        self.database = sqlite3.connect(folder / "joined.sqlite", isolation_level=None)
        self.database.execute("PRAGMA journal_mode = OFF")  # a scratch table: a crash loses nothing kept
        self.database.execute("PRAGMA synchronous = OFF")
        self.database.execute(SCHEMA)

    def close(self) -> None:
        self.database.close()

    def add(self, index: int, path: Path, quiet: bool) -> None:
        """Merges input `index`'s rows; one that cannot be used is skipped and counted (the first reasons printed)."""
        skipped, reasons, pending = 0, [], []
        with Progress(*progress_columns(path), disable=quiet, transient=True) as progress:
            task = progress.add_task(shown(path.name, markup=True), total=size(path))  # rich renders it
            for number, row in read_rows(path, lambda done: progress.advance(task, done)):
                values = row_values(row, self.classes)
                if isinstance(values, str) and self.classes is not None and values.startswith("classes "):
                    raise UserError(
                        f"{path} has other classes than the first input ({shown(values[8:])}, ...): "
                        "are these models of the same task?"
                    )
                if isinstance(values, str):
                    skipped += 1
                    note(reasons, number, values)
                    continue
                self.classes = self.classes or values[1]
                pending.append((number, values))
                if len(pending) >= BATCH:
                    skipped += self.merge(index, path, pending, reasons)
                    pending = []
            skipped += self.merge(index, path, pending, reasons)
        self.skipped[str(path)] = skipped
        if skipped and not quiet:
            told = "; ".join(f"line {number}: {reason}" for number, reason in sorted(reasons))
            print(shown(f"{path}: {skipped} rows skipped ({told})"), file=sys.stderr)  # class names in reasons

    def merge(self, index: int, path: Path, pending: list[tuple[int, tuple]], reasons: list) -> int:
        """Adds a batch of input `index`'s usable rows in one transaction; the count of keys it gave twice."""
        if not pending:
            return 0
        keys = list({values[0]: None for _, values in pending})
        found: dict[str, list] = {}
        for start in range(0, len(keys), 500):  # under SQLite's limit of bound variables
            part = keys[start : start + 500]
            query = f"SELECT key, label, sums, predicted FROM samples WHERE key IN ({','.join('?' * len(part))})"
            for key, label, sums, predicted in self.database.execute(query, part):
                found[key] = [label, np.frombuffer(sums).copy(), np.frombuffer(predicted, np.int32).tolist()]
        twice = 0
        for number, (key, _, log_probs, label) in pending:
            sample = found.setdefault(key, [None, np.zeros(len(log_probs)), []])
            if len(sample[2]) > index:  # this input gave the key before
                twice += 1
                note(reasons, number, "a key given twice")
                continue
            if label is not None and sample[0] is not None and label != sample[0]:
                raise UserError(
                    f"{path} labels {key!r} {label!r} where an input before labels it {sample[0]!r}: "
                    "are these predictions of the same samples?"
                )
            sample[0] = sample[0] or label
            sample[1] += log_probs
            sample[2] += [MISSING] * (index - len(sample[2])) + [int(log_probs.argmax())]
        rows = [(key, s[0], s[1].tobytes(), np.array(s[2], np.int32).tobytes()) for key, s in found.items()]
        self.database.execute("BEGIN")
        self.database.executemany(
            "INSERT INTO samples VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
            "label = excluded.label, sums = excluded.sums, predicted = excluded.predicted",
            rows,
        )
        self.database.execute("COMMIT")
        return twice

    def samples(self, count: int) -> Iterator[tuple[str, str | None, np.ndarray, np.ndarray | None]]:
        """(key, label, sum, each input's predicted class) of every sample, in the order first seen; the
        predicted classes are None for a sample some of the `count` inputs did not hold."""
        for key, label, sums, predicted in self.database.execute("SELECT * FROM samples ORDER BY rowid"):
            each = np.frombuffer(predicted, np.int32)
            complete = len(each) == count and not (each == MISSING).any()
            yield key, label, np.frombuffer(sums), each if complete else None


def note(reasons: list[tuple[int, str]], number: int, reason: str) -> None:
    """Keeps the reasons of the first three skipped lines (rows merge in batches, so not in line order)."""
    reasons.append((number, reason))
    if len(reasons) > 3:
        reasons.sort()
        del reasons[3:]


def ensemble_rows(joined: Joined, count: int, top_k: int) -> Iterator[bytes]:
    """The combined rows of the samples every input holds, as JSON lines."""
    names = joined.classes or []
    for key, label, sums, predicted in joined.samples(count):
        if predicted is None:
            continue
        log_probs = sums / count
        probs = np.exp(log_probs - log_probs.max())
        probs /= probs.sum()
        order = np.argsort(-sums, kind="stable")[: min(top_k, len(names))]
        row = {
            "key": key,
            "pred": names[order[0]],
            "pred_index": int(order[0]),
            "prob": round(float(probs[order[0]]), 6),
            "top_classes": [names[i] for i in order],
            "top_probs": [round(float(probs[i]), 6) for i in order],
        }
        if label is not None:
            row["label"] = label
        yield (json.dumps(row) + "\n").encode()


def summary(joined: Joined, paths: list[Path]) -> dict[str, Any]:
    """Accuracy of each input and of the sum on the labelled samples every input holds, and the counts."""
    index = {name: i for i, name in enumerate(joined.classes or [])}
    complete = left_out = labelled = right = 0
    members = np.zeros(len(paths), np.int64)
    for _, label, sums, predicted in joined.samples(len(paths)):
        if predicted is None:
            left_out += 1
            continue
        complete += 1
        if label in index:
            labelled += 1
            right += int(sums.argmax() == index[label])
            members += predicted == index[label]
    result: dict[str, Any] = {
        "samples": complete,
        "left_out": left_out,
        "skipped_rows": joined.skipped,
        "labelled": labelled,
    }
    if labelled:
        result["members"] = {str(path): float(members[i] / labelled) for i, path in enumerate(paths)}
        result["acc"] = float(right / labelled)
    return result


def parquet_file(path: Path) -> Any:
    """The Parquet file, once it opens and has predict's columns with log_probs."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # there: check() asked for it

    try:
        opened = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as error:  # ValueError: a column's name that is no UTF-8
        reason = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise UserError(f"{path} cannot be read as Parquet: {shown(reason)}") from None
    missing = {"key", "label", "log_probs"} - set(opened.schema_arrow.names)
    if missing:
        raise UserError(f"{path} has no {', '.join(sorted(missing))} column: predict with --log_probs true")
    return opened


def size(path: Path) -> int:
    """What the progress bar counts to: a JSONL file's bytes, a Parquet file's rows."""
    return path.stat().st_size if path.suffix != ".parquet" else parquet_file(path).metadata.num_rows


def progress_columns(path: Path) -> tuple:
    counted = DownloadColumn() if path.suffix != ".parquet" else MofNCompleteColumn()
    return TextColumn("{task.description}"), BarColumn(), counted, TimeRemainingColumn()
