"""Image backbones, each a class picked by `class_path` in the config with its own settings:

    model:
      class_path: project.tasks.image.ImageClassifier
      init_args:
        backbone:
          class_path: project.tasks.image.backbones.TorchvisionBackbone
          init_args: {name: resnet18, weights: DEFAULT}

The config gives a backbone's own settings; the classifier calls the class with what the data says (`num_classes`,
`image_size`: `BackboneClass`) and takes the two parts it builds: `features`, a module from normalized NCHW images
to (N, F) vectors, and `head`, a linear layer from those to the classes' logits. Your own backbone is a subclass of
`Backbone` whose `__init__` takes `num_classes` and `image_size` by keyword, beside its own settings.

Pretrained weights come by published name (downloaded once) or from a local file, read with `weights_only=True`
(`weights_file.py`): a weights file can never run code. Evaluate, predict and export build a backbone from a
checkpoint's run with no weights (the checkpoint holds them all): a run folder's weights are never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torch import nn

from project.errors import UserError
from project.tasks.image.published import timm_parts, torchvision_names, torchvision_parts, torchvision_weights
from project.tasks.image.weights_file import is_weights_file, load_weights_file


class Backbone:
    """What a backbone class builds for a classifier.

    Args:
        features: a module from normalized NCHW float images to (N, F) feature vectors.
        head: a module from those vectors to (N, num_classes) logits.
    """

    def __init__(self, *, features: nn.Module, head: nn.Module) -> None:
        self.features = features
        self.head = head


class BackboneClass(Protocol):
    """A backbone class with its settings from the config: the classifier calls it with the data's values."""

    def __call__(self, *, num_classes: int, image_size: int) -> Backbone: ...


class SmallCNN(Backbone):
    """A 6-layer VGG-style CNN: three stages of two 3x3 convolutions, then global average pooling, and a linear
    head. Sized for the demo on a CPU: about 0.3 M parameters at width 32.

    Args:
        num_classes: the data's classes (given by the classifier).
        image_size: the data's image side (given by the classifier; the global pooling takes any).
        width: channels of the first stage (x2 and x4 in the later ones).
        weights: the path of a weights file (this project's checkpoint of the same width, or a state dict);
            None trains from random weights.
    """

    def __init__(self, *, num_classes: int, image_size: int, width: int = 32, weights: str | None = None) -> None:
        w = width
        features = nn.Sequential(
            conv_block(3, w),
            conv_block(w, w),
            nn.MaxPool2d(2),
            conv_block(w, 2 * w),
            conv_block(2 * w, 2 * w),
            nn.MaxPool2d(2),
            conv_block(2 * w, 4 * w),
            conv_block(4 * w, 4 * w),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        head = nn.Linear(4 * width, num_classes)
        if weights is not None:
            load_weights_file(features, head, Path(weights))
        super().__init__(features=features, head=head)


def conv_block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True)
    )


class TorchvisionBackbone(Backbone):
    """Any torchvision classification model, its classifier replaced by a linear head for the data's classes.

    Args:
        num_classes: the data's classes (given by the classifier).
        image_size: the data's image side (given by the classifier); vision transformers from random weights size
            their position embeddings for it.
        name: the model: resnet18, resnet50, mobilenet_v3_small, mobilenet_v3_large, efficientnet_b0,
            convnext_tiny, vit_b_16, ... (`torchvision.models.list_models()`).
        weights: None (random weights); a torchvision weight name ("DEFAULT", "IMAGENET1K_V1", or the full
            "ResNet18_Weights.IMAGENET1K_V1"), downloaded once into torch's hub cache; or the path of a weights
            file (a torchvision state dict of this model, or a checkpoint of this project).
    """

    def __init__(self, *, num_classes: int, image_size: int, name: str, weights: str | None = None) -> None:
        if name not in torchvision_names():
            raise UserError(
                f"--model.backbone.name {name[:100]!r}: no torchvision classification model of that name "
                f"(resnet18, mobilenet_v3_large, efficientnet_b0, ...: {', '.join(torchvision_names())})"
            )
        file = weights if weights and is_weights_file(weights) else None
        published = torchvision_weights(name, weights) if weights and not file else None
        features, head = torchvision_parts(name, num_classes, published, image_size)
        if file:
            load_weights_file(features, head, Path(file))
        super().__init__(features=features, head=head)


class TimmBackbone(Backbone):
    """Any model that timm registers (`pip install -e ".[timm]"`), without its classifier (its pooled features),
    and a new linear head for the data's classes.

    Args:
        num_classes: the data's classes (given by the classifier).
        image_size: the data's image side (given by the classifier; timm's models keep their own).
        name: a timm model: convnext_tiny, vit_small_patch16_224, resnet50.a1_in1k, ... (`timm.list_models()`).
        weights: None (random weights); DEFAULT for timm's pretrained weights, downloaded from the Hugging Face
            hub; or the path of a weights file (a timm state dict of this model, or a checkpoint of this project).
    """

    def __init__(self, *, num_classes: int, image_size: int, name: str, weights: str | None = None) -> None:
        file = weights if weights and is_weights_file(weights) else None
        if weights not in (None, "DEFAULT") and not file:
            raise UserError(f"--model.backbone.weights {weights!r}: for a timm model, DEFAULT or a weights file")
        features, head = timm_parts(name, num_classes, pretrained=weights == "DEFAULT")
        if file:
            load_weights_file(features, head, Path(file))
        super().__init__(features=features, head=head)
