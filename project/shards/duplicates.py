"""What `prepare --dedup` does with the duplicates it finds, and what it reports.

Every sample is hashed first, in the same worker processes that then write the shards (project/shards/dedup.py
says how). Copies of one sample form a group. Within a group one copy is kept: the largest (pixels for images
hashed `near`, else bytes), then the smallest key. A group lives in a single split, so no val or test sample
has a duplicate in train: a group that holds a sample of a split fixed by the source (a torchvision test set)
goes to that split (test before val before train), and any other group is split as one sample. Choices
depend on the source alone, and the split on the seed, so they are the same on every run and every --part.

The report: a line per split, the largest groups, OUT/duplicates.csv (group, key, split, label, kept, match)
and a contact sheet of the first groups, OUT/duplicates.png (images; kept copies framed in green), or a
preview of them, OUT/duplicates.txt (text).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from project.data.atomic import replace_atomically, write_atomically, write_text_atomically
from project.data.parallel import Pool
from project.errors import UserError
from project.shards.dedup import FIELDS, MODES, Hasher, Hashes
from project.shards.matching import groups, match
from project.shards.records import Record
from project.shards.sources import read_record
from project.shards.text_sources import text_bytes
from project.shown import csv_cell

CHUNK = 256  # samples per hashing job
SPLIT_PRIORITY = ("test", "val", "train")  # a group with samples in fixed splits goes to the first of these
SHEET_GROUPS = 16  # groups on the contact sheet
SHEET_COPIES = 8  # copies shown per group
TILE = 96
MAX_NEAR_DISTANCE = 16  # beyond this the multi-index search tries too many masks, and unrelated images match


def check_dedup(mode: str, near_distance: int, near_jaccard: float) -> None:
    if mode not in MODES:
        raise UserError(f"--dedup must be one of {', '.join(MODES)}, not {mode!r}")
    if not 0 <= near_distance <= MAX_NEAR_DISTANCE:
        raise UserError(f"--near_distance must be in 0..{MAX_NEAR_DISTANCE} bits (of 64), not {near_distance}")
    if not 0 < near_jaccard <= 1:
        raise UserError(f"--near_jaccard must be in (0, 1], not {near_jaccard}")


@dataclass(frozen=True)
class HashJob:
    start: int
    records: tuple[Record, ...]
    mode: str
    text: bool


def hash_job(job: HashJob) -> tuple[int, Hashes]:
    hasher = Hasher(job.mode, job.text)
    for record in job.records:
        hasher.add(text_bytes(record) if job.text else read_record(record)[0])
    return job.start, hasher.result()


def hash_records(
    records: list[Record],
    mode: str,
    text: bool,
    pool: Pool,
    *,
    progress=None,  # noqa: ANN001
    cache: Path | None = None,
) -> Hashes:
    """The hashes of `records`, in their order, from the `pool`'s processes. With `cache`, they are read from
    there when it holds the hashes of these records, and saved there when computed (atomically): a prepare
    run started again, or another --part, does not hash again."""
    fingerprint = hashlib.blake2b(("\0".join(r.key for r in records) + f"\0{mode}\0{text}").encode()).hexdigest()
    if cache is not None and cache.exists():
        with np.load(cache) as saved:
            if str(saved["fingerprint"]) == fingerprint:
                return Hashes(**{name: saved[name] for name in FIELDS if name in saved})
    jobs = [HashJob(i, tuple(records[i : i + CHUNK]), mode, text) for i in range(0, len(records), CHUNK)]
    parts: dict[int, Hashes] = {}
    task = progress.add_task("hash", total=len(records)) if progress is not None else None
    for start, hashes in pool.imap_unordered(hash_job, jobs):
        parts[start] = hashes
        if progress is not None:
            progress.advance(task, len(hashes))
    result = Hashes.concat([parts[start] for start in sorted(parts)]) if parts else Hasher(mode, text).result()
    if cache is not None:
        write_atomically(cache, lambda stream: np.savez(stream, fingerprint=fingerprint, **result.arrays()))
    return result


@dataclass
class Dedup:
    """The outcome: the records kept (one per group, with a fixed split where the group's is fixed), and the
    groups of two or more, each a list of record indices with the kept copy first."""

    mode: str
    records: list[Record]
    hashes: Hashes
    kept: list[Record]
    groups: list[list[int]] = field(default_factory=list)

    @property
    def removed(self) -> int:
        return len(self.records) - len(self.kept)


def deduplicate(records: list[Record], hashes: Hashes, mode: str, near_distance: int, near_jaccard: float) -> Dedup:
    """Keep one copy of each group (see the module's docstring)."""
    labels = groups(hashes, near_distance, near_jaccard)  # each sample's group: its least member's index
    sizes = np.bincount(labels, minlength=len(labels))
    size = hashes.size
    chosen, found = {}, []
    for group in members_of(labels, sizes):
        fixed = {records[i].split for i in group} - {None}
        split = next((s for s in SPLIT_PRIORITY if s in fixed), None)
        eligible = [i for i in group if split is None or records[i].split == split]
        best = min(eligible, key=lambda i: (-int(size[i]), records[i].key))
        chosen[group[0]] = dataclasses.replace(records[best], split=split) if split else records[best]
        found.append([best, *sorted((i for i in group if i != best), key=lambda i: records[i].key)])
    # one record a group, in the order of the groups' least members
    kept = [chosen.get(root, records[root]) for root in np.flatnonzero(sizes).tolist()]
    found.sort(key=lambda g: (-len(g), records[g[0]].key))
    return Dedup(mode, records, hashes, kept, found)


def members_of(labels: np.ndarray, sizes: np.ndarray) -> list[list[int]]:
    """The groups of two or more (`labels` as `groups` gives them, `sizes` their counts), each its members' indices
    in ascending order, the groups in the order of their least members."""
    joined = np.flatnonzero(sizes[labels] > 1)
    joined = joined[np.argsort(labels[joined], kind="stable")]
    ends = np.flatnonzero(np.diff(labels[joined])) + 1
    return [group.tolist() for group in np.split(joined, ends)] if len(joined) else []


def report(
    dedup: Dedup, split_of: dict[str, str], classes: list[str], out: Path, text: bool, *, sheet: bool = True
) -> list[str]:
    """Write duplicates.csv and the contact sheet (or text preview) into `out`; return the lines to print. Without
    `sheet` (the matching step of --part I/N, which reads no sample), duplicates.csv alone."""
    name = {i: c for i, c in enumerate(classes)}
    rows, removed, mixed = [], Counter(), 0
    for number, group in enumerate(dedup.groups):
        split = split_of[dedup.records[group[0]].key]
        removed[split] += len(group) - 1
        mixed += len({dedup.records[i].label for i in group}) > 1
        for position, i in enumerate(group):
            record = dedup.records[i]
            how = "" if position == 0 else match(dedup.hashes, group[0], i)
            rows.append((number, record.key, split, name.get(record.label, str(record.label)), position == 0, how))
    csv_path = out / "duplicates.csv"

    def write_csv(temporary: Path) -> None:
        with open(temporary, "w", newline="") as stream:
            writer = csv.writer(stream)
            writer.writerow(["group", "key", "split", "label", "kept", "match"])
            writer.writerows([csv_cell(cell) for cell in row] for row in rows)  # a key may start a formula

    replace_atomically(csv_path, write_csv)
    per_split = ", ".join(f"{split} {removed[split]}" for split in ("train", "val", "test"))
    lines = [
        f"dedup {dedup.mode}: removed {dedup.removed} duplicates of {len(dedup.groups)} samples ({per_split})"
        if dedup.groups
        else f"dedup {dedup.mode}: no duplicates"
    ]
    if mixed:
        lines.append(f"  {mixed} groups hold copies with different labels; the kept copy's label is used")
    if dedup.groups:
        largest = ", ".join(f"{dedup.records[g[0]].key} ({len(g)} copies)" for g in dedup.groups[:3])
        lines.append(f"  largest groups: {largest}")
        drawn = [(text_preview if text else contact_sheet)(dedup, out)] if sheet else []
        lines.append(f"  duplicates: {', '.join(map(str, [csv_path, *drawn]))}")
    return lines


def contact_sheet(dedup: Dedup, out: Path) -> Path:
    """A row per group (the first SHEET_GROUPS), up to SHEET_COPIES copies each; the kept one framed green."""
    from PIL import Image, ImageDraw

    from project.tasks.image.decode import open_image

    shown = dedup.groups[:SHEET_GROUPS]
    sheet = Image.new("RGB", (SHEET_COPIES * TILE, len(shown) * (TILE + 14)), "white")
    draw = ImageDraw.Draw(sheet)
    for row, group in enumerate(shown):
        for column, i in enumerate(group[:SHEET_COPIES]):
            x, y = column * TILE, row * (TILE + 14)
            draw.rectangle((x, y, x + TILE - 1, y + TILE - 1), outline="green" if column == 0 else "red", width=2)
            try:
                with open_image(read_record(dedup.records[i])[0]) as image:  # the pixel bound, from the header
                    image.thumbnail((TILE - 6, TILE - 6))
                    sheet.paste(image.convert("RGB"), (x + 3, y + 3))
            except Exception:  # noqa: BLE001, S112 - an unreadable copy keeps its empty frame
                pass
            label = "kept" if column == 0 else match(dedup.hashes, group[0], i)
            draw.text((x + 2, y + TILE), label[:15], fill="black")
    path = out / "duplicates.png"
    replace_atomically(path, sheet.save)
    return path


def text_preview(dedup: Dedup, out: Path) -> Path:
    """The first SHEET_GROUPS groups' texts, 100 characters each, the kept one first."""
    lines = []
    for number, group in enumerate(dedup.groups[:SHEET_GROUPS]):
        lines.append(f"group {number} ({len(group)} copies)")
        for position, i in enumerate(group[:SHEET_COPIES]):
            text = " ".join(text_bytes(dedup.records[i]).decode("utf-8", errors="replace").split())[:100]
            how = "kept" if position == 0 else match(dedup.hashes, group[0], i)
            lines.append(f"  [{how}] {dedup.records[i].key}: {text}")
    path = out / "duplicates.txt"
    write_text_atomically(path, "\n".join(lines) + "\n")
    return path
