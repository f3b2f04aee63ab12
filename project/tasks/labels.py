"""Class labels for any classification task: names from the shard index, and a label member's text as an
index."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from project.data.shard_index import ShardIndex
from project.errors import UserError

MAX_CLASSES = 100_000  # a head of this many outputs; ImageNet-21k has 21,841 classes
MAX_CLASS_NAME = 200  # characters of a class name kept
MAX_LABEL_BYTES = 64 << 10  # a label member larger than this is no label (a caption, a document): refused unparsed
NO_LABEL = -1  # the label of a sample read for predict that has none (or none that names a known class)


def index_classes(index: ShardIndex) -> list[str] | None:
    """The class names a shard index records (under "classes", beside the shard list), if any. The index is a
    stranger's: the model gets a head of this many outputs, so the count is bounded, and names are strings."""
    names = index.extra.get("classes")
    if not isinstance(names, list):
        return None
    if len(names) > MAX_CLASSES:
        raise UserError(f"the shard index {index.name or ''} records {len(names):,} classes, more than {MAX_CLASSES:,}")
    if not all(isinstance(name, str | int) and not isinstance(name, bool) for name in names):
        raise UserError(f"the shard index {index.name or ''} records class names that are not strings")
    return [str(name)[:MAX_CLASS_NAME] for name in names]


def data_classes(data: Any, configured: Sequence[str] | None) -> list[str]:
    """Class names from the configuration, or else from the first split (train, val, test) of a data
    module whose shard index records them."""
    if configured:
        return list(configured)
    for split in ("train", "val", "test"):
        if data.specs[split] is not None and (names := index_classes(data.index(split))):
            return names
    raise UserError("no class names in the shard indexes: set data.classes (or rebuild the index)")


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


class ClassNames:
    """For a classification data module: `classes` and `num_classes`, from its `_classes` setting (None:
    from the shard indexes), resolved once."""

    _classes: Sequence[str] | None = None

    @cached_property
    def classes(self) -> list[str]:
        """Class names, from the configuration or else from the first split whose index records them."""
        return data_classes(self, self._classes)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


class UnknownLabel(ValueError):
    """A label that is neither an integer nor one of the known class names."""


def label_index(text: str, classes: Sequence[str] | None = None) -> int:
    """The class index of a label text: an integer, or the position of a class name in `classes`. With
    `classes`, an integer outside [0, len(classes)) is an `UnknownLabel` too: caught here, in the worker, a
    bad label is a skipped sample, never an index error in the loss (on a GPU, a device-side assert that
    kills the process)."""
    try:
        value = int(text)
    except ValueError:
        if classes is not None and text in classes:
            return list(classes).index(text)
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise UnknownLabel(f"label {shown!r} is neither an integer nor a known class name") from None
    if classes is not None and not 0 <= value < len(classes):
        shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
        raise UnknownLabel(f"label {shown} is outside the {len(classes)} classes (0 to {len(classes) - 1})")
    return value
