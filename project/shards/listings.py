"""An image listing for `prepare`: a CSV (header with `path` and `label` columns) or JSONL ({"path": ...,
"label": ...} per line), its paths relative to the listing's folder.

A listing is a stranger's file, and names files as the user who runs `prepare` can read them: a row could
name `~/.ssh/id_rsa`, `/proc/self/environ` or a FIFO. So the listing's folder is its source root, as a folder
source's root is: a row whose path (its links followed) leads out of that folder, or names anything that is
not a regular file, is skipped with a line, and counted. A listing that keeps its files elsewhere is moved to a
folder above them. A copied image's header is checked as well (`project.shards.jobs`), whatever its path.
"""

from __future__ import annotations

import csv
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from project.data.paths import kind, within
from project.errors import UserError
from project.shards.records import Record, csv_field_limit, sanitize_key
from project.tasks.labels import labels_to_classes

if TYPE_CHECKING:
    from project.shards.parts import Slice

LISTING_FIELD_LIMIT = 128 << 10  # csv's default: a path or a label is short


def listing(path: Path, part: Slice | None = None) -> tuple[list[Record], list[str], list[str]]:
    """Records, class names and a line for each row skipped. A row that cannot be read stops the listing with
    one line naming it: a field over the CSV limit, a line that is not a JSON object, a path that is not a
    string, a file that is missing. With `part`, only the rows whose key it holds (no other file is looked at)."""
    rows = list(_listing_rows(path))
    _check_rows(path, rows)
    folder = os.path.realpath(path.parent)
    kept: list[ListedFile] = []
    skipped: list[str] = []
    for number, row in rows:
        if part is not None and not part.holds(sanitize_key(str(row["path"]))):
            continue
        found = _listed_file(path, number, row, folder)
        if isinstance(found, str):
            skipped.append(f"skipped {path} row {number}: {found}")
        else:
            kept.append(found)
    if not kept and part is None:
        raise UserError(f"{path}: every file it lists was skipped, the first as {skipped[0].partition(': ')[2]}")
    labels, classes = labels_to_classes([file.label for file in kept])
    records = [
        Record(sanitize_key(file.named), label, "file", (file.real,), file.size)
        for file, label in zip(kept, labels, strict=True)
    ]
    return records, classes, skipped


class ListedFile(NamedTuple):
    """A row's file: the path as listed, the file to read, its size, and the row's label."""

    named: str
    real: str
    size: int
    label: str


def _check_rows(path: Path, rows: list[tuple[int, dict]]) -> None:
    """The listing has `path` and `label` columns, and each row a string (or a number) in both and no more cells."""
    if not rows or not {"path", "label"} <= set(rows[0][1]):
        found = sorted(map(str, rows[0][1])) if rows else "no rows"
        raise UserError(f"{path} needs 'path' and 'label' columns (found {found})")
    for number, row in rows:
        if None in row:  # csv.DictReader keeps a row's cells past the header's under the key None
            raise UserError(f"{path} row {number} has more cells than the header has columns")
        for column in ("path", "label"):
            value = row.get(column)
            if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
                raise UserError(f"{path} row {number}: its {column} is {_shown(value)}, not a string")


def _listed_file(path: Path, number: int, row: dict, folder: str) -> ListedFile | str:
    """The file a row names, or why it is skipped (out of the listing's `folder`, or not a regular file)."""
    named = str(row["path"])
    try:
        real = os.path.realpath(path.parent / named)
        found = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path} lists a missing image: {_shown(named)}") from None
    except (OSError, ValueError) as error:  # a NUL byte, a name too long
        raise UserError(f"{path} row {number}: bad path {_shown(named)}: {error}") from None
    if not within(real, folder):
        return f"{_shown(named)} leads out of the listing's folder"
    if not stat.S_ISREG(found.st_mode):
        return f"{_shown(named)} is {kind(found.st_mode)}, not a file"
    return ListedFile(named, real, found.st_size, str(row["label"]).strip())


def _listing_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(row number, row) of a CSV listing (1: the first row after the header) or a JSONL one (its line)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as stream:  # -sig: the BOM a spreadsheet writes
            if path.suffix.lower() == ".csv":
                number = 0
                try:
                    with csv_field_limit(LISTING_FIELD_LIMIT):
                        for number, row in enumerate(csv.DictReader(stream), 1):
                            yield number, row
                except csv.Error as error:  # a field over the limit, a NUL byte
                    raise UserError(f"{path} row {number + 1} is not CSV: {error}") from None
                return
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError) as error:
                    raise UserError(f"{path}:{number} is not JSON: {type(error).__name__}: {error}") from None
                if not isinstance(row, dict):
                    raise UserError(f"{path}:{number} is a JSON {type(row).__name__}, not an object")
                yield number, row
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text: {error}") from None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
