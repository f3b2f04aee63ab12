"""What `prepare` writes, one `Record` a sample, whatever the source: its key (from the source's path), its
integer label (from the source's label texts), and where its bytes are."""

from __future__ import annotations

import contextlib
import csv
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)  # millions are held at once: no __dict__ each (80 bytes, not 350)
class Record:
    """One sample to write: its key, integer label, where its image is, and a split it must go to."""

    key: str
    label: int
    kind: str  # "file", "tar", "torchvision" or "inline" (a text listing's row)
    where: tuple  # file: (path,); tar: (url, key, ext); torchvision: (name, root, train, index); inline: (data,)
    size: int = 0  # bytes, when known before reading
    split: str | None = None  # a split fixed by the source (torchvision's official test set)


def sanitize_key(relative: str) -> str:
    """A stable, unique sample key from a relative path: webdataset splits keys at the first dot."""
    return re.sub(r"[^A-Za-z0-9_/-]", "_", relative.replace(os.sep, "/"))


@contextlib.contextmanager
def csv_field_limit(limit: int) -> Iterator[None]:
    """csv's field size limit set to `limit` while a listing is read, and put back after: the limit is the
    whole process's (a text listing allows 1 GiB fields, an image listing's paths 128 KiB)."""
    previous = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def unique_keys(records: list[Record]) -> list[Record]:
    """The records with the keys that repeat (`a.jpg` and `a_jpg` both sanitize to `a_jpg`; a listing that
    names a file twice) made unique in listing order, `a_jpg`, `a_jpg-2`, ...: two samples of one key would be
    one sample in a shard, which its index would count twice."""
    seen: dict[str, int] = {}
    taken = {record.key for record in records}
    unique = []
    for record in records:
        count = seen.get(record.key, 0) + 1
        seen[record.key] = count
        if count == 1:
            unique.append(record)
            continue
        key = f"{record.key}-{count}"
        while key in taken:
            count += 1
            key = f"{record.key}-{count}"
        taken.add(key)
        unique.append(replace(record, key=key))
    return unique
