"""Pictures of the image task for TensorBoard: a batch as a grid, and the test confusion matrix."""

from __future__ import annotations

import torch
from torchvision.utils import make_grid

from project.tasks.confusion import CONFUSION_IMAGE_UP_TO, render_confusion_matrix

__all__ = ["CONFUSION_IMAGE_UP_TO", "batch_grid", "render_confusion_matrix"]
GRID_IMAGES = 64


def batch_grid(images: torch.Tensor) -> torch.Tensor:
    """Up to 64 images of a batch as one CHW image, 8 a row; float (normalized) images are stretched to show."""
    images = images[:GRID_IMAGES].detach().cpu()
    if images.dtype != torch.uint8:
        images = images.float()
        low = images.amin(dim=(1, 2, 3), keepdim=True)
        high = images.amax(dim=(1, 2, 3), keepdim=True)
        images = (images - low) / (high - low).clamp(min=1e-6)
    return make_grid(images, nrow=8, padding=2)
