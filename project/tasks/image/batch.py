"""The image classification task's examples and batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from project.data.batch import Batch


class ImageExample(NamedTuple):
    """One decoded sample: its pixels (or, with decode_on=device, its JPEG bytes) and its label."""

    label: int
    pixels: torch.Tensor | None = None  # uint8 CHW, before the transform
    jpeg: bytes | None = None  # decoded on the training device after the batch reaches it
    url: str = ""  # the shard of a `jpeg`, for the report if the device cannot decode it


@dataclass(kw_only=True)
class ImageBatch(Batch):
    """Images as the model takes them, with their labels.

    Attributes:
        image: uint8 [B, 3, H, W]; the model normalizes it on the device.
        label: int64 [B] class indexes.
    """

    image: torch.Tensor
    label: torch.Tensor


@dataclass(kw_only=True)
class EncodedImageBatch(ImageBatch):
    """A batch on its way to `data.decode_on=device`: some rows still JPEG bytes, decoded after the
    transfer (`ImageShards.on_after_batch_transfer`) into an `ImageBatch`.

    Attributes:
        image: the rows the workers decoded (non-JPEG images), or None.
        image_rows: which rows of the batch those are.
        jpegs: the encoded JPEGs of the other rows, in row order.
        jpeg_rows: which rows of the batch those are.
        jpeg_urls: the shard of each JPEG, for the report of one that cannot be decoded.
        augment_seed: seeds the device's random crops and flips (None: evaluation's resize and crop).
    """

    image: torch.Tensor | None = None
    image_rows: list[int] = field(default_factory=list)
    jpegs: list[bytes] = field(default_factory=list)
    jpeg_rows: list[int] = field(default_factory=list)
    jpeg_urls: list[str] = field(default_factory=list)
    augment_seed: int | None = None
