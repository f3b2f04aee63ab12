"""torchvision's and timm's classification models as (features, head), with their published weights by name:
downloaded once (torchvision: into torch's hub cache; timm: from the Hugging Face hub) under a timeout, so that
an offline machine says so in one line instead of hanging."""

from __future__ import annotations

import contextlib
import re
import socket
import urllib.error
from collections.abc import Iterator

import torchvision
from torch import nn

from project.errors import UserError

DOWNLOAD_TIMEOUT_S = 60
PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_-]+)?")  # a timm architecture and its tag, no source or path
AUXILIARY = ("inception_v3", "googlenet")  # a second, training-time output beside the classifier's


def torchvision_names() -> list[str]:
    """Every torchvision classification model (`TorchvisionBackbone`'s `name`)."""
    return torchvision.models.list_models(module=torchvision.models)


@contextlib.contextmanager
def download_timeout() -> Iterator[None]:
    """A timeout for every socket opened meanwhile: torch.hub's download has none, and offline it would hang."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def torchvision_weights(name: str, weights: str) -> torchvision.models.WeightsEnum:
    """The weights enum member for `weights`, a short ("DEFAULT") or full ("X_Weights.Y") name."""
    try:
        enum = torchvision.models.get_model_weights(name)
    except ValueError:  # some models have no published weights
        raise UserError(
            f"--model.backbone.weights {weights!r}: torchvision has no pretrained weights for {name}"
        ) from None
    short = weights.split(".", 1)[1] if weights.startswith(enum.__name__ + ".") else weights
    if short not in enum.__members__:
        raise UserError(
            f"--model.backbone.weights {weights!r}: unknown for {name}; expected one of "
            f"{', '.join(enum.__members__)}, or the path of a weights file"
        )
    return enum[short]


def torchvision_parts(
    name: str, num_classes: int, weights: torchvision.models.WeightsEnum | None, image_size: int
) -> tuple[nn.Module, nn.Linear]:
    """torchvision's model `name` without its classifier, and a linear head for `num_classes`: from random weights,
    the model's own last layer (sized for the classes, with the model's own initialization); from published
    weights, a new one."""
    kwargs: dict = {}
    if name in AUXILIARY:
        kwargs["aux_logits"] = weights is not None  # pretrained files hold the auxiliary head
        kwargs["init_weights"] = weights is None  # and random init would otherwise warn
    if weights is None:
        if name.startswith("vit_"):
            kwargs["image_size"] = image_size  # position embeddings sized for the data's images
        model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    else:
        model = download(name, weights, kwargs)
    drop_auxiliary_outputs(model)
    parent, attribute, last = last_classifier_layer(model)
    setattr(parent, attribute, nn.Identity())
    if isinstance(last, nn.Linear) and weights is None:
        return model, last
    inputs = last.in_features if isinstance(last, nn.Linear) else last.in_channels
    return model, nn.Linear(inputs, num_classes)


def download(name: str, weights: torchvision.models.WeightsEnum, kwargs: dict) -> nn.Module:
    try:
        with download_timeout():
            return torchvision.models.get_model(name, weights=weights, **kwargs)
    except (urllib.error.URLError, OSError, ConnectionError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(
            f"could not download {name} weights {weights} from {weights.url} ({reason}); if this machine is "
            "offline, fetch that file elsewhere and pass its path with --model.backbone.weights PATH"
        ) from None


def drop_auxiliary_outputs(model: nn.Module) -> None:
    """Inception's and GoogLeNet's second training-time outputs, which the head split drops."""
    if getattr(model, "aux_logits", False):
        model.aux_logits, model.AuxLogits = False, None
        for aux in ("aux1", "aux2"):
            if hasattr(model, aux):
                setattr(model, aux, None)


def last_classifier_layer(model: nn.Module) -> tuple[nn.Module, str, nn.Module]:
    """(parent, attribute name, layer) of the model's final classifier: its last Linear, or for
    SqueezeNet its last 1x1 convolution (whose ReLU and pooling then feed our linear head)."""
    candidates = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not candidates:
        candidates = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)]
    if not candidates:
        raise UserError(f"cannot find the classifier layer of {type(model).__name__} to replace")
    path, layer = candidates[-1]
    parent_path, _, attribute = path.rpartition(".")
    return model.get_submodule(parent_path), attribute, layer


def timm_parts(name: str, num_classes: int, pretrained: bool) -> tuple[nn.Module, nn.Linear]:
    """A timm model without its classifier (`num_classes=0`: pooled features), and a new head. Only a model that
    timm itself registers, by a plain name: a `hf-hub:` or `local-dir:` name would read a configuration from
    elsewhere, and timm takes `resnet18.<tag>` for a registered model whatever the tag, then reads a `:` or `/`
    in it as such a source or a path."""
    try:
        import timm
    except ImportError:
        raise UserError('TimmBackbone needs timm: pip install -e ".[timm]"') from None
    if not (PLAIN_NAME.fullmatch(name) and timm.is_model(name)):  # `resnet18.<any tag>` is a model to timm
        found = timm.list_models(f"*{name[:100]}*")[:5]
        hint = f" (similar: {', '.join(found)})" if found else " (timm.list_models() lists them)"
        raise UserError(f"--model.backbone.name {name[:100]!r}: timm has no such model{hint}")
    try:
        with download_timeout():
            features = timm.create_model(name, pretrained=pretrained, num_classes=0)
    except (OSError, RuntimeError) as error:  # offline, or the hub refused: huggingface_hub's errors are OSErrors
        raise UserError(f"could not load timm's {name} weights ({error}); pass a weights file's path instead") from None
    return features, nn.Linear(features.num_features, num_classes)
