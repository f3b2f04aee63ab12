"""Class labels for any classification task: names from the shard index, and a label member's text as an
index."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from project.data.shards import ShardIndex
from project.errors import UserError

NO_LABEL = -1  # the label of a sample read for predict that has none (or none that names a known class)


def index_classes(index: ShardIndex) -> list[str] | None:
    """The class names a shard index records (under "classes", beside the shard list), if any."""
    names = index.extra.get("classes")
    return [str(name) for name in names] if isinstance(names, list) else None


def data_classes(data: Any, configured: Sequence[str] | None) -> list[str]:
    """Class names from the configuration, or else from the first split (train, val, test) of a data
    module whose shard index records them."""
    if configured:
        return list(configured)
    for split in ("train", "val", "test"):
        if data.specs[split] is not None and (names := index_classes(data.index(split))):
            return names
    raise UserError("no class names in the shard indexes: set data.classes (or rebuild the index)")


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
    """The class index of a label text: an integer, or the position of a class name in `classes`."""
    try:
        return int(text)
    except ValueError:
        if classes is not None and text in classes:
            return list(classes).index(text)
        raise UnknownLabel(f"label {text!r} is neither an integer nor a known class name") from None
