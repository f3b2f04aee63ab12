"""Augmentation presets (torchvision.transforms.v2), each with its matching evaluation transform.

Images stay uint8 from decode to collate: the model normalizes on the device, so 4x fewer bytes cross
pinned memory than with float32 images.
"""

from __future__ import annotations

from collections.abc import Callable
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


def training_transform(augment: Preset | v2.Transform, image_size: int) -> v2.Compose:
    """The training transform: a preset's, or a torchvision v2 pipeline given in the config (by class_path),
    which must turn a uint8 CHW image into a uint8 CHW image of `image_size`² (as the presets do)."""
    if isinstance(augment, str):
        return build_transform(augment, image_size, train=True)
    return augment if isinstance(augment, v2.Compose) else v2.Compose([augment])


def described(transform: v2.Compose) -> str:
    """The steps of a transform by name: `RandomResizedCrop, RandomHorizontalFlip, ColorJitter`."""
    return ", ".join(type(step).__name__ for step in transform.transforms) or "nothing"


def pixels(image: Image.Image | np.ndarray | torch.Tensor) -> torch.Tensor:
    """A decoded image as a uint8 CHW tensor (a view of an HWC array: the batch copy makes it contiguous)."""
    if isinstance(image, torch.Tensor):
        return image  # already CHW uint8 (decode_jpeg_pixels)
    if isinstance(image, Image.Image) and image.mode == "RGB":
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)  # 3x less than pil_to_tensor for small images
    return to_uint8_tensor(image)


def transform_all(transform: Callable[[torch.Tensor], torch.Tensor], images: list[torch.Tensor]) -> torch.Tensor:
    """The batch of transformed images: `transform` applied to each image, or once to the stacked batch
    when it is deterministic (resize and center crop) and the images share a size."""
    steps = transform.transforms if isinstance(transform, v2.Compose) else [transform]
    deterministic = all(isinstance(step, (v2.Resize, v2.CenterCrop)) for step in steps)
    if len(images) > 1 and deterministic and len({image.shape for image in images}) == 1:
        return transform(torch.stack(images)).contiguous()
    return torch.stack([transform(image) for image in images])
