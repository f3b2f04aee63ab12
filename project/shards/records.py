"""What `prepare` writes, one `Record` a sample, whatever the source: its key (from the source's path), its
integer label (from the source's label texts), and where its bytes are."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from project.errors import UserError
from project.tasks.labels import MAX_CLASSES


@dataclass(frozen=True)
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


def labels_to_classes(labels: list[str]) -> tuple[list[int], list[str]]:
    """Integer labels and class names from label texts: all integers keep their values, else names sort.
    An integer label is a class count too (0 to the largest), so it must stay under MAX_CLASSES; so must the
    number of names."""
    if all(re.fullmatch(r"-?\d+", label) for label in labels):
        too_large = next((label for label in labels if len(label) > 9 or int(label) >= MAX_CLASSES), None)
        if too_large is not None:
            shown = too_large if len(too_large) <= 20 else too_large[:17] + "..."
            raise UserError(f"label {shown} would make {MAX_CLASSES:,} classes or more: labels are 0, 1, 2, ...")
        values = [int(label) for label in labels]
        if min(values, default=0) < 0:
            raise UserError("labels must not be negative")
        return values, [str(i) for i in range(max(values, default=-1) + 1)]
    classes = sorted(set(labels))
    if len(classes) > MAX_CLASSES:
        raise UserError(f"{len(classes):,} different labels, more than {MAX_CLASSES:,} classes")
    lookup = {name: i for i, name in enumerate(classes)}
    return [lookup[label] for label in labels], classes
