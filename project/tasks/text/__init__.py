"""Text classification: TextShards (data), TextClassifier (model), TextBatch (what flows between them);
tokenizer.py trains the byte-level BPE tokenizer on the training split's texts."""

from project.tasks.text.batch import TextBatch
from project.tasks.text.data import TextShards
from project.tasks.text.model import TextClassifier

__all__ = ["TextBatch", "TextClassifier", "TextShards"]
