"""Image classification: ImageShards (data), ImageClassifier (model), ImageBatch (what flows between them)."""

from project.tasks.image.batch import ImageBatch
from project.tasks.image.data import ImageShards
from project.tasks.image.model import ImageClassifier

__all__ = ["ImageBatch", "ImageClassifier", "ImageShards"]
