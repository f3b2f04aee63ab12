"""Image classification: ImageShards (data), ImageClassifier (model), ImageBatch (what flows between them).

The three are imported when first asked for: a DataLoader worker's forkserver preloads `task.py`, and an eager
import here would load the data module, and Lightning with it, into that server (seconds at every start)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from project.tasks.image.batch import ImageBatch
    from project.tasks.image.data import ImageShards
    from project.tasks.image.model import ImageClassifier

__all__ = ["ImageBatch", "ImageClassifier", "ImageShards"]
_MODULES = {"ImageBatch": "batch", "ImageShards": "data", "ImageClassifier": "model"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
