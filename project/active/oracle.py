"""The human oracle's round trip: a CSV of keys to label (plus a contact sheet), and reading it back filled.

`write_request` writes FOLDER/to_label.csv (`key,label[,text]`), FOLDER/classes.txt (the allowed names, one a
line) and, for image samples, FOLDER/to_label.png (a tile per sample captioned `<row>: <key>`). A person fills
the `label` column with class names or indices; `read_answers` takes back the good rows and says, one line per
bad row, what is wrong with the others.

Keys and texts are a stranger's, and the file is opened in a spreadsheet: a cell that would start a formula
(`=`, `+`, `-`, `@`, ...) is written with a leading `'` (project/shown.py), which reading takes off again.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from project.active import labeled as labeled_set
from project.data.atomic import replace_atomically
from project.errors import UserError
from project.shards.inspect import TILE, contact_sheet
from project.shown import csv_cell, csv_value, shown
from project.tasks.image.decode import decode_image

REQUEST = "to_label.csv"
SHEET = "to_label.png"
CLASSES = "classes.txt"
IMAGES = ("jpg", "jpeg", "png", "webp")
PREVIEW = 200  # characters of text shown in the CSV's `text` column
SHOWN_CLASSES = 10  # classes named in an "unknown class" problem


def _image_of(sample: dict) -> bytes | None:
    return next((sample[ext] for ext in IMAGES if ext in sample), None)


def _preview(sample: dict) -> str:
    data = sample.get("txt")
    if data is None:
        return ""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)
    return text[:PREVIEW].replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def _tile(data: bytes | None) -> Image.Image:
    try:
        if data is None:
            raise ValueError("no image")
        return decode_image(data, size=TILE)  # the pixel bound, from the header; JPEGs at a reduced scale
    except Exception:  # noqa: BLE001 - undecodable (or no) image: a grey tile keeps the row numbers in step
        return Image.new("RGB", (64, 64), (128, 128, 128))


def write_request(folder: Path, samples: list[dict], classes: list[str]) -> list[Path]:
    """Write FOLDER/to_label.csv (`key,label`, plus `text` when some sample is text only), FOLDER/classes.txt
    and, when samples have images, FOLDER/to_label.png; each atomically. Returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with_text = any("txt" in s and _image_of(s) is None for s in samples)
    with_images = any(_image_of(s) is not None for s in samples)
    request, names, sheet = folder / REQUEST, folder / CLASSES, folder / SHEET

    def write_csv(temporary: Path) -> None:
        with open(temporary, "w", encoding="utf-8", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["key", "label", "text"] if with_text else ["key", "label"])
            for sample in samples:
                row = [sample["__key__"], "", _preview(sample)] if with_text else [sample["__key__"], ""]
                writer.writerow([csv_cell(cell) for cell in row])

    replace_atomically(request, write_csv)
    replace_atomically(
        names, lambda temporary: temporary.write_text("".join(f"{c}\n" for c in classes), encoding="utf-8")
    )
    if not with_images:
        sheet.unlink(missing_ok=True)  # an earlier round's sheet would show other keys
        return [request, names]
    tiles = [(_tile(_image_of(s)), f"{row}: {s['__key__']}") for row, s in enumerate(samples, start=1)]
    replace_atomically(sheet, lambda temporary: contact_sheet(tiles, temporary))
    return [request, names, sheet]


@dataclass
class Answers:
    labels: dict[str, int] = field(default_factory=dict)  # key -> class index, for the good rows, in file order
    problems: list[str] = field(default_factory=list)  # one line per bad row: "to_label.csv line N: <what>"
    unanswered: list[str] = field(default_factory=list)  # keys asked for with an empty label cell, or no row


def _label(text: str, classes: list[str]) -> int | str:
    """The class index a label cell means, or what is wrong with it."""
    if text in classes:
        return classes.index(text)
    folded = [i for i, name in enumerate(classes) if name.casefold() == text.casefold()]
    if len(folded) == 1:
        return folded[0]
    if folded:
        return f"label {text!r} matches several classes ignoring case: {shown(', '.join(classes[i] for i in folded))}"
    try:
        index = int(text)
    except ValueError:
        more = f", ... ({len(classes)} classes)" if len(classes) > SHOWN_CLASSES else ""
        names = shown(", ".join(classes[:SHOWN_CLASSES])) + more
        return f"unknown class {text!r}, expected one of {names}"
    if 0 <= index < len(classes):
        return index
    return f"class index {index} out of range, expected 0..{len(classes) - 1}"


def read_answers(path: Path, asked: list[str], classes: list[str]) -> Answers:
    """Read a filled to_label.csv: labels are class names (exact, or a unique case-insensitive match) or
    indices. Bad rows each get one line in `problems` and no label; both rows of a repeated key are bad."""
    path, wanted = Path(path), set(asked)
    rows = _read_rows(path, wanted)
    lines_of: dict[str, list[int]] = {}
    for line, key, _ in rows:
        lines_of.setdefault(key, []).append(line)
    bad: set[str] = set()
    answers = Answers()
    for line, key, label in rows:
        answer = _answer(key, label, wanted, lines_of.get(key, []), classes)
        if isinstance(answer, str):
            answers.problems.append(shown(f"{path.name} line {line}: {answer}"))  # printed: keys and labels
            bad.add(key)
        elif answer is not None:
            answers.labels[key] = answer
    answers.unanswered = [key for key in asked if key not in answers.labels and key not in bad]
    return answers


def _read_rows(path: Path, wanted: set[str]) -> list[tuple[int, str, str]]:
    """(line, key, label) of the answers file's non-blank rows; a file that cannot be read is one line."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as file:
            return list(_rows(csv.reader(file), path, wanted))
    except FileNotFoundError:
        raise UserError(f"no answers file {path}: fill in the label column of the request and save it there") from None
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserError(f"cannot read answers file {path}: {shown(error)}") from None


def _rows(reader: Any, path: Path, wanted: set[str]) -> Iterator[tuple[int, str, str]]:
    """The rows of `reader` (a csv.reader) by the columns its first line names."""
    names = [cell.strip().lower() for cell in next(reader, [])]
    if "key" not in names or "label" not in names:
        raise UserError(f"answers file {path} has no 'key' and 'label' columns in its first line")
    key_at, label_at = names.index("key"), names.index("label")
    last = reader.line_num
    for cells in reader:
        line, last = last + 1, reader.line_num  # the line a (possibly multi-line) row starts on
        if any(cell.strip() for cell in cells):  # the quote write_request put before a formula, off
            key = csv_value(cells[key_at]) if key_at < len(cells) else ""
            key = key if key in wanted else csv_value(key.strip())  # a key may start or end with a space
            yield line, key, csv_value(cells[label_at].strip()) if label_at < len(cells) else ""


def _answer(key: str, label: str, wanted: set[str], lines: list[int], classes: list[str]) -> int | str | None:
    """A row's class index, None where its label is empty, or what is wrong with it (`lines`: the key's rows)."""
    if not key:
        return f"no key (label {label!r})"
    if key not in wanted:
        return f"key {key!r} was not asked for"
    if len(lines) > 1:
        where = ", ".join(str(n) for n in lines)
        return f"key {key!r} appears {len(lines)} times (lines {where}): its answer is ambiguous"
    return _label(label, classes) if label else None


def get_labels(
    folder: Path, pairs: list[tuple[str, str]], settings: Any, label_members: frozenset[str], what: str
) -> list[dict] | None:
    """The labeled samples of the (key, shard) pairs, from the oracle; None while a human has not answered.

    simulated: the pool's samples as they are, label members included. human: the first call writes
    folder/to_label.csv and returns None; once it is filled in, the samples without their own label
    members and with a `.cls` holding the answer. Bad rows are printed, one line each, and left out.
    """
    if settings.oracle == "simulated":
        samples = labeled_set.fetch(pairs)
        unlabeled = next((key for key, sample in samples.items() if not label_members & sample.keys()), None)
        if unlabeled is not None:
            raise UserError(
                f"the simulated oracle needs the pool's labels, and sample {unlabeled!r} has none: use --oracle human"
            )
        return [samples[key] for key, _ in pairs]
    request = folder / REQUEST
    if not request.exists():
        folder.mkdir(parents=True, exist_ok=True)
        samples = labeled_set.fetch(pairs, drop=label_members)
        written = write_request(folder, [samples[key] for key, _ in pairs], settings.classes)
        sheet = next((path.name for path in written if path.suffix == ".png"), "its text column")
        print(
            shown(
                f"{what}: label the {len(pairs)} samples of {request} (see {sheet}), then run the same command again"
            ),
            file=sys.stderr,
        )
        return None
    answers = read_answers(request, [key for key, _ in pairs], settings.classes)
    for problem in answers.problems:
        print(problem, file=sys.stderr)
    if not answers.labels:
        print(shown(f"{what}: {request} has no usable label yet; fill in its label column"), file=sys.stderr)
        return None
    if answers.unanswered:
        print(f"{what}: {len(answers.unanswered)} samples left without a label go back to the pool", file=sys.stderr)
    samples = labeled_set.fetch([(key, url) for key, url in pairs if key in answers.labels], drop=label_members)
    return [{**samples[key], "cls": str(label).encode()} for key, label in answers.labels.items()]
