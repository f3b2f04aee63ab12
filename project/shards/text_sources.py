"""Where `prepare` reads texts from: a CSV (with a header row) or JSONL listing with a text and a label column,
a folder tree SOURCE/<class>/.../<name>.txt, or existing tar shards whose samples hold a `.txt` text and a
`.cls` label (an integer, or a class name of the shard index's "classes").

`is_text` tells a text source from an image source by its content; `load_text` lists its `Record`s, and
`text_bytes` returns a record's text (UTF-8 bytes). Texts are checked when listed: a row or file whose text
is not valid UTF-8 or is empty (or only whitespace), or whose label is empty, is skipped, and one line saying
so ("skipped data.csv row 17: not valid UTF-8") is returned for the user. CSV rows are numbered from 1, the
first data row after the header; JSONL lines from 1, the file's first line.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from project.data.paths import class_folders, read_regular, source_files
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.errors import UserError
from project.shards.index import shard_spec
from project.shards.records import Record, csv_field_limit, sanitize_key, unique_keys
from project.shards.sources import CONVERTED_SUFFIXES, IMAGE_SUFFIXES, open_shard, read_record, source_kind
from project.shown import shown
from project.tasks.image.decode import ARRAY_EXTENSIONS, IMAGE_EXTENSIONS
from project.tasks.labels import UnknownLabel, index_classes, label_index, labels_to_classes

if TYPE_CHECKING:
    from project.shards.parts import Slice

TEXT, LABEL = "txt", "cls"  # the members of a text sample
KEY_COLUMNS = ("key", "id")  # a listing's column that names its samples, if it has one
TEXT_FIELD_LIMIT = 1 << 30  # characters of one CSV field (a text)
PEEK_SAMPLES = 16  # samples of the first shard that `is_text` looks at
Loaded = tuple[list[Record], list[str], list[str]]  # records, class names, lines about the skipped rows


def is_text(source: str, text_column: str = "text") -> bool:
    """Whether SOURCE holds texts: a listing with `text_column` and no `path` column, class folders with .txt
    files and no images, or shards whose first samples hold a .txt member and no image."""
    kind = source_kind(source)
    if kind == "listing":
        path = Path(source)
        columns = listing_columns(path)
        if columns and "path" not in columns and text_column not in columns:
            raise UserError(
                f"{path} has no 'path' column (images) and no {text_column!r} column (text) "
                f"(found: {shown(', '.join(columns))}); set --text_column"  # a stranger's header
            )
        return text_column in columns and "path" not in columns
    if kind == "folder":
        return _folder_holds_text(Path(source))
    return kind == "shards" and _shards_hold_text(source)


def load_text(
    source: str, text_column: str = "text", label_column: str = "label", *, part: Slice | None = None
) -> Loaded:
    """Records, class names and skipped-row lines of a text SOURCE given on the command line (with `part`, its
    slice: a listing's rows whose key it holds, a folder's files whose key it holds, every N-th shard)."""
    kind = source_kind(source)
    if kind == "torchvision":
        raise UserError(f"{source} is an image dataset, not text: drop --text")
    if kind == "listing":
        records, classes, skipped = text_listing(Path(source), text_column, label_column)
        records = records if part is None else [r for r in records if part.holds(r.key)]
    elif kind == "folder":
        records, classes, skipped = text_folder(Path(source), part)
    else:
        records, classes, skipped = text_shards(source, part)
    return unique_keys(records), classes, skipped


def text_bytes(record: Record) -> bytes:
    """The UTF-8 text of a record listed by `load_text`."""
    if record.kind == "inline":
        return record.where[0]
    if record.kind == "file":
        return read_regular(record.where[0])
    return read_record(record)[0]


def text_problem(data: bytes) -> str | None:
    """Why a text cannot be used (not UTF-8, empty), or None."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    return None if text.strip() else "empty text"


def listing_columns(path: Path) -> list[str]:
    """The columns of a listing: a CSV's header, or the keys of a JSONL file's first JSON object."""
    if path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as stream:
            try:
                with csv_field_limit(TEXT_FIELD_LIMIT):
                    return next(csv.reader(stream), [])
            except csv.Error as error:
                raise UserError(f"{path}: its header is not CSV: {error}") from None
    for _, row, _ in _jsonl_rows(path):
        if row is not None:
            return list(row)
    return []


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, object, None) for each JSON object line, (line number, None, problem) for other lines;
    invalid UTF-8 bytes are kept as lone surrogates, for the caller to find in the values it uses."""
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, 1):
            line = (raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw).decode("utf-8", "surrogateescape")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: nested thousands deep
                yield number, None, "not JSON"
                continue
            yield (number, row, None) if isinstance(row, dict) else (number, None, "not a JSON object")


def _csv_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(row number, row, None) for each data row of a CSV, 1 for the first one after the header."""
    with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as stream:
        number = 0
        try:
            with csv_field_limit(TEXT_FIELD_LIMIT):  # a text may be longer than csv's default 128 KiB
                for number, row in enumerate(csv.DictReader(stream), 1):
                    yield number, row, None
        except csv.Error as error:
            raise UserError(f"{path} row {number + 1} is not CSV: {error}") from None


def _row_problem(values: dict[str, object]) -> str | None:
    """Why a listing row cannot be used: invalid UTF-8 or an empty value among the ones it needs."""
    for value in values.values():
        try:
            if isinstance(value, str):
                value.encode("utf-8")
        except UnicodeEncodeError:
            return "not valid UTF-8"
    for name, value in values.items():
        if value is None or (isinstance(value, str) and not value.strip()):
            return f"empty {name}"
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            return f"{name} is not a string"
    return None


def text_listing(path: Path, text_column: str = "text", label_column: str = "label") -> Loaded:
    """A CSV or JSONL listing of texts and labels (integers or class names). Keys come from a `key` or `id`
    column when there is one (they must be unique), else they are `<file stem>/<row number:08d>`."""
    columns = listing_columns(path)
    for column, option in ((text_column, "--text_column"), (label_column, "--label_column")):
        if column not in columns:
            found = shown(", ".join(columns)) if columns else "no columns"  # a stranger's header
            raise UserError(f"{path} has no {column!r} column (found: {found}); set {option}")
    csv_file = path.suffix.lower() == ".csv"
    unit = "row" if csv_file else "line"
    key_column = next((c for c in KEY_COLUMNS if c in columns), None)
    found_rows: list[tuple[str, bytes, str]] = []  # key, text, label text
    skipped: list[str] = []
    seen: dict[str, int] = {}
    for number, row, problem in _csv_rows(path) if csv_file else _jsonl_rows(path):
        if problem is None:
            values = {"text": row.get(text_column), "label": row.get(label_column)}
            if key_column is not None:
                values[key_column] = row.get(key_column)
            problem = _row_problem(values)
        if problem is not None:
            skipped.append(f"skipped {path} {unit} {number}: {problem}")
            continue
        if key_column is None:
            key = f"{sanitize_key(path.stem)}/{number:08d}"
        else:
            key = sanitize_key(str(values[key_column]).strip())
            if key in seen:
                raise UserError(
                    f"{path} {unit} {number}: key {key!r} (its {key_column!r}) is also the key of "
                    f"{unit} {seen[key]}; keys must be unique"
                )
            seen[key] = number
        found_rows.append((key, str(values["text"]).encode("utf-8"), str(values["label"]).strip()))
    labels, classes = labels_to_classes([label for *_, label in found_rows])
    records = [
        Record(key, label, "inline", (data,), len(data))
        for (key, data, _), label in zip(found_rows, labels, strict=True)
    ]
    return records, classes, skipped


def _folder_holds_text(root: Path) -> bool:
    """Whether the class folders of ROOT hold .txt files and no image (by name: nothing is read)."""
    images = tuple(IMAGE_SUFFIXES) + tuple(CONVERTED_SUFFIXES)
    texts = False
    for name in class_folders(root)[0]:
        for _, _, files in os.walk(root / name):
            for file in files:
                lower = file.lower()
                if lower.endswith(images):
                    return False
                texts = texts or lower.endswith(".txt")
    return texts


def text_folder(root: Path, part: Slice | None = None) -> Loaded:
    """ROOT/<class>/<...>/<name>.txt: one class per top-level folder, texts at any depth below it. A link out
    of ROOT, a FIFO and the like are skipped with a line (`project.data.paths.source_files`), as a bad text is."""
    classes, skipped = class_folders(root)
    if not classes:
        raise UserError(f"{root} has no class folders: expected ROOT/<class>/<text>.txt")
    records = []
    for label, name in enumerate(classes):
        listed = source_files(root / name, (".txt",), base=root)
        skipped += listed.skipped
        for file in listed.files:
            key = sanitize_key(os.path.relpath(file.path, root))
            if part is not None and not part.holds(key):
                continue  # another part's: not read
            data = read_regular(file.real)
            problem = text_problem(data)
            if problem is not None:
                skipped.append(f"skipped {file.path}: {problem}")
                continue
            records.append(Record(key, label, "file", (file.real,), len(data)))
    if not records and not skipped and part is None:
        raise UserError(f"no .txt files in the class folders of {root}")
    return records, classes, skipped


def _shards_hold_text(spec: str) -> bool:
    """Whether the first samples of the first shard hold .txt members and no image."""
    try:
        index = resolve_shards(shard_spec(spec)[0], count=lambda url: 0)  # only the first shard's url is needed
    except UserError:
        return False  # the image source says what is wrong
    wanted = frozenset((TEXT, *IMAGE_EXTENSIONS, *ARRAY_EXTENSIONS))
    texts = False
    for sample in read_samples(index.shards[0].url, stop=PEEK_SAMPLES, extensions=wanted, open_stream=open_shard):
        if any(extension in sample for extension in IMAGE_EXTENSIONS + ARRAY_EXTENSIONS):
            return False
        texts = texts or TEXT in sample
    return texts


def _sample_label(sample: dict, classes: list[str] | None) -> tuple[str | None, str | None]:
    """(label text, None) of a text sample, or (None, why it has no usable label)."""
    if LABEL not in sample:
        return None, "no .cls label"
    try:
        text = sample[LABEL].decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, "label not valid UTF-8"
    if not text:
        return None, "empty label"
    if classes is not None:
        try:
            value = label_index(text, classes)
        except UnknownLabel as error:
            return None, str(error)
        if value < 0:
            return None, f"negative label {value}"
        text = str(value)
    return text, None


def text_shards(spec: str, part: Slice | None = None) -> Loaded:
    """Samples of existing text shards (re-shard or re-split them): `.txt` texts, `.cls` labels (integers, or
    names resolved with the shard index's classes when it records them)."""
    kept, skipped = shard_spec(spec)  # a link out of a shard folder, a FIFO: skipped rows too
    index = resolve_shards(kept)
    classes = index_classes(index)
    found: list[tuple[str, str, str, int]] = []  # url, key, label text, size
    for shard in index.shards if part is None else part.of(index.shards):
        for sample in read_samples(shard.url, extensions=frozenset({TEXT, LABEL}), open_stream=open_shard):
            where = f"{shard.url} sample {sample['__key__']}"
            problem = text_problem(sample[TEXT]) if TEXT in sample else "no .txt member"
            label, label_problem = _sample_label(sample, classes)
            if problem or label_problem:
                skipped.append(f"skipped {where}: {problem or label_problem}")
                continue
            found.append((shard.url, sample["__key__"], label, len(sample[TEXT])))
    labels, found_classes = labels_to_classes([label for _, _, label, _ in found])
    records = [
        Record(sanitize_key(key), label, "tar", (url, key, TEXT), size)
        for (url, key, _, size), label in zip(found, labels, strict=True)
    ]
    return records, classes or found_classes, skipped
