"""Backbones by name: each takes (num_classes, width) and returns a module mapping images to logits."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def _block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True)
    )


def small_cnn(num_classes: int, width: int = 32, in_channels: int = 3) -> nn.Module:
    """A 6-layer VGG-style CNN: three stages of two 3x3 convolutions, global average pooling, linear.

    Sized for the demo on a CPU: about 0.3 M parameters at width 32.
    """
    w = width
    return nn.Sequential(
        _block(in_channels, w),
        _block(w, w),
        nn.MaxPool2d(2),
        _block(w, 2 * w),
        _block(2 * w, 2 * w),
        nn.MaxPool2d(2),
        _block(2 * w, 4 * w),
        _block(4 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


BACKBONES: dict[str, Callable[..., nn.Module]] = {"small_cnn": small_cnn}


def build_backbone(name: str, num_classes: int, width: int = 32) -> nn.Module:
    """The backbone called `name`, with a head for `num_classes`."""
    if name not in BACKBONES:
        from project.errors import UserError

        raise UserError(f"unknown backbone {name!r}: expected one of {', '.join(sorted(BACKBONES))}")
    return BACKBONES[name](num_classes=num_classes, width=width)
