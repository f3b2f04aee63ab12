"""Text classification: TextShards (data), TextClassifier (model), TextBatch (what flows between them);
tokenizer.py trains the byte-level BPE tokenizer on the training split's texts.

The three are imported when first asked for, so `python -m project.tasks.text.tokenizer` runs its module once
(an eager import here would load it before runpy does, and Python warns of the double import)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from project.tasks.text.batch import TextBatch
    from project.tasks.text.data import TextShards
    from project.tasks.text.model import TextClassifier

__all__ = ["TextBatch", "TextClassifier", "TextShards"]
_MODULES = {"TextBatch": "batch", "TextShards": "data", "TextClassifier": "model"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
