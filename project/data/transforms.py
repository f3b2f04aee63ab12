"""Augmentation presets (torchvision.transforms.v2), each with its matching evaluation transform.

Images stay uint8 from decode to collate: the model normalizes on the device, so 4x fewer bytes cross
pinned memory than with float32 images.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

Preset = Literal["none", "light", "standard", "strong"]


def to_uint8_tensor(image: Image.Image | np.ndarray) -> torch.Tensor:
    """A CHW uint8 tensor from a PIL image or an HWC/HW array."""
    if isinstance(image, np.ndarray):
        array = image if image.ndim == 3 else image[:, :, None]
        tensor = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
        tensor = tensor.expand(3, -1, -1) if tensor.shape[0] == 1 else tensor
        return tensor.to(torch.uint8).contiguous()
    return v2.functional.pil_to_tensor(image)


def build_transform(preset: Preset, image_size: int, train: bool) -> v2.Compose:
    """The per-sample transform: uint8 CHW in, uint8 CHW of `image_size`² out."""
    resize = [v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)]
    if not train or preset == "none":
        return v2.Compose(resize)
    if preset == "light":
        steps = [
            v2.RandomResizedCrop(image_size, scale=(0.7, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    elif preset == "standard":
        steps = [
            v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3),
        ]
    elif preset == "strong":
        steps = [
            v2.RandomResizedCrop(image_size, scale=(0.25, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.TrivialAugmentWide(),
            v2.RandomErasing(p=0.25),
        ]
    else:
        raise ValueError(f"unknown augmentation preset {preset!r}: expected none, light, standard or strong")
    return v2.Compose(steps)
