"""Backbones by name: the small CNN, or any torchvision classification model, split into a feature
extractor and a linear head sized for this dataset's classes.

Pretrained weights come by torchvision weight name (downloaded once into torch's hub cache) or from a
local file (a torchvision state dict, or one of our own checkpoints), read with `weights_only=True` so
that a weights file can never run code.
"""

from __future__ import annotations

import socket
import urllib.error
from pathlib import Path

import torch
import torchvision
from torch import nn

from project.callbacks.checkpoint_pickle import pickle_problem
from project.callbacks.checkpoint_shape import plain
from project.errors import UserError
from project.tasks.weights import check_finite

DOWNLOAD_TIMEOUT_S = 60
TIMM_PREFIX = "timm:"  # --model.backbone timm:convnext_tiny: any model of timm (the timm extra)


def _block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True)
    )


def small_cnn(width: int = 32, in_channels: int = 3) -> tuple[nn.Module, int]:
    """A 6-layer VGG-style CNN: three stages of two 3x3 convolutions, then global average pooling.

    Sized for the demo on a CPU: about 0.3 M parameters at width 32. Returns (features, feature size).
    """
    w = width
    features = nn.Sequential(
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
    )
    return features, 4 * w


def available_backbones() -> list[str]:
    """Every name `--model.backbone` accepts but timm's (timm:NAME): small_cnn and torchvision's classifiers."""
    return ["small_cnn", *torchvision.models.list_models(module=torchvision.models)]


def build_backbone(
    name: str,
    num_classes: int,
    width: int = 32,
    weights: str | None = None,
    image_size: int = 224,
) -> tuple[nn.Module, nn.Linear]:
    """The backbone called `name` as (features, head): features map NCHW images to (N, F) vectors,
    the head maps those to `num_classes` logits.

    Args:
        name: "small_cnn", a torchvision classification model ("resnet18", "mobilenet_v3_large", ...), or
            "timm:NAME" for any timm model ("timm:convnext_tiny", "timm:vit_small_patch16_224").
        num_classes: size of the new head.
        width: first-stage width of small_cnn (ignored by torchvision models).
        weights: None (random init), a torchvision weight name ("DEFAULT", "IMAGENET1K_V1", or the
            full "ResNet18_Weights.IMAGENET1K_V1"; timm models: "DEFAULT"), or the path of a local weights file
            (a state dict, a timm or torchvision checkpoint, or one of this project's).
        image_size: input size; only vision transformers without pretrained weights use it (their
            position embeddings are sized for it).
    """
    if name == "small_cnn":
        if weights and not _is_path(weights):
            raise UserError(f"--model.weights {weights!r}: small_cnn has no published weights; pass a weights file")
        features, dim = small_cnn(width)
        head = nn.Linear(dim, num_classes)
    elif name in torchvision.models.list_models(module=torchvision.models):
        pretrained = _torchvision_weights(name, weights) if weights and not _is_path(weights) else None
        features, head = _torchvision_backbone(name, num_classes, pretrained, image_size)
    elif name.startswith(TIMM_PREFIX):
        features, head = _timm_backbone(
            name[len(TIMM_PREFIX) :], num_classes, weights if not _is_path(weights or "") else None
        )
    else:
        raise UserError(
            f"unknown backbone {name!r}: expected small_cnn, a torchvision classification model such as "
            f"resnet18, mobilenet_v3_large, efficientnet_b0, or timm:NAME (all but timm's: "
            f"{', '.join(available_backbones())})"
        )
    if weights and _is_path(weights):
        load_weights_file(features, head, Path(weights))
    return features, head


def _timm_backbone(name: str, num_classes: int, weights: str | None) -> tuple[nn.Module, nn.Linear]:
    """A timm model without its classifier (`num_classes=0`: pooled features), and a new head. `weights`:
    None (random), or "DEFAULT" for timm's own pretrained weights (downloaded from the Hugging Face hub)."""
    try:
        import timm
    except ImportError:
        raise UserError(f'--model.backbone {TIMM_PREFIX}{name} needs timm: pip install -e ".[timm]"') from None
    if not timm.is_model(name):
        found = timm.list_models(f"*{name}*")[:5]
        hint = f" (similar: {', '.join(found)})" if found else " (timm.list_models() lists them)"
        raise UserError(f"--model.backbone {TIMM_PREFIX}{name}: timm has no such model{hint}")
    if weights not in (None, "DEFAULT"):
        raise UserError(f"--model.weights {weights!r}: for a timm model, DEFAULT (timm's pretrained weights) or a file")
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        features = timm.create_model(name, pretrained=weights == "DEFAULT", num_classes=0)
    except (OSError, RuntimeError) as error:  # offline, or the hub refused: huggingface_hub's errors are OSErrors
        raise UserError(f"could not load timm's {name} weights ({error}); pass a weights file's path instead") from None
    finally:
        socket.setdefaulttimeout(previous)
    return features, nn.Linear(features.num_features, num_classes)


def _is_path(weights: str) -> bool:
    return "/" in weights or Path(weights).suffix in (".pth", ".pt", ".ckpt", ".bin") or Path(weights).exists()


def _torchvision_weights(name: str, weights: str) -> torchvision.models.WeightsEnum:
    """The weights enum member for `weights`, a short ("DEFAULT") or full ("X_Weights.Y") name."""
    try:
        enum = torchvision.models.get_model_weights(name)
    except ValueError:  # some models have no published weights
        raise UserError(f"--model.weights {weights!r}: torchvision has no pretrained weights for {name}") from None
    short = weights.split(".", 1)[1] if weights.startswith(enum.__name__ + ".") else weights
    if short not in enum.__members__:
        raise UserError(
            f"--model.weights {weights!r}: unknown for {name}; expected one of "
            f"{', '.join(enum.__members__)}, or the path of a weights file"
        )
    return enum[short]


def _torchvision_backbone(
    name: str, num_classes: int, weights: torchvision.models.WeightsEnum | None, image_size: int
) -> tuple[nn.Module, nn.Linear]:
    kwargs: dict = {}
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = weights is not None  # pretrained files hold the auxiliary head
        kwargs["init_weights"] = weights is None  # and random init would otherwise warn
    if weights is None:
        if name.startswith("vit_"):
            kwargs["image_size"] = image_size
        model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    else:
        model = _download(name, weights, kwargs)
    if getattr(model, "aux_logits", False):  # a second training-time output that the head split drops
        model.aux_logits, model.AuxLogits = False, None
        for aux in ("aux1", "aux2"):
            if hasattr(model, aux):
                setattr(model, aux, None)
    parent, attribute, last = _last_classifier_layer(model)
    setattr(parent, attribute, nn.Identity())
    if isinstance(last, nn.Linear) and weights is None:
        head = last  # already sized for num_classes, with torchvision's own initialization
    else:
        inputs = last.in_features if isinstance(last, nn.Linear) else last.in_channels
        head = nn.Linear(inputs, num_classes)
    return model, head


def _download(name: str, weights: torchvision.models.WeightsEnum, kwargs: dict) -> nn.Module:
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # torch.hub's download has none: offline would hang
    try:
        return torchvision.models.get_model(name, weights=weights, **kwargs)
    except (urllib.error.URLError, OSError, ConnectionError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(
            f"could not download {name} weights {weights} from {weights.url} ({reason}); if this machine is "
            "offline, fetch that file elsewhere and pass its path with --model.weights PATH"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)


def _last_classifier_layer(model: nn.Module) -> tuple[nn.Module, str, nn.Module]:
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


def is_plain(value: object) -> bool:
    return isinstance(value, torch.Tensor) and plain(value)  # not sparse, quantized or meta: load_state_dict fails


def load_weights_file(features: nn.Module, head: nn.Linear, path: Path) -> None:
    """Load a local weights file into (features, head).

    Accepts a torchvision state dict of the same architecture (its classifier is dropped unless it
    has this dataset's shape) or a checkpoint of this project (keys `backbone.*` and `head.*`).
    Every feature-extractor weight must be present with the right shape: a file for another
    architecture is an error, not a silent partial load.
    """
    if not path.is_file():
        raise UserError(f"--model.weights {path}: no such file")
    try:
        problem = pickle_problem(path)  # plain data that would cost without bound to unpickle (a pickle bomb)
        state = None if problem else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable or unsafe file is the user's to fix
        raise UserError(f"--model.weights {path}: not a readable weights file ({error})") from None
    if problem:
        raise UserError(f"--model.weights {path}: refused: {problem} (a bomb, or a damaged file)")
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a Lightning checkpoint
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and is_plain(v) for k, v in state.items()):
        raise UserError(f"--model.weights {path}: expected a state dict of tensors (plain ones)")
    if any(key.startswith("backbone.") for key in state):  # our own checkpoint
        feature_state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        head_state = {k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}
    else:
        expected = features.state_dict()
        feature_state = {k: v for k, v in state.items() if k in expected}
        leftover = {k: v for k, v in state.items() if k not in expected}
        head_state = {k.rpartition(".")[2]: v for k, v in leftover.items()}
        head_state = {k: v for k, v in head_state.items() if k in ("weight", "bias")}
        if len(head_state) != len(leftover) or len(leftover) > 2:
            sample = ", ".join(sorted(leftover)[:3])
            raise UserError(f"--model.weights {path}: does not fit this backbone (unexpected keys: {sample} ...)")
    expected = features.state_dict()
    missing = sorted(set(expected) - set(feature_state))
    wrong = sorted(k for k in feature_state if k in expected and feature_state[k].shape != expected[k].shape)
    if missing or wrong:
        what = f"{len(missing)} missing keys, e.g. {missing[0]}" if missing else f"wrong shape for {wrong[0]}"
        raise UserError(f"--model.weights {path}: does not fit this backbone ({what})")
    parameters = {name for name, _ in features.named_parameters()} | {f"head.{name}" for name in ("weight", "bias")}
    named = [*feature_state.items(), *((f"head.{name}", value) for name, value in head_state.items())]
    check_finite(named, parameters, f"--model.weights {path}: ")
    features.load_state_dict(feature_state)
    head_expected = head.state_dict()
    if head_state.keys() == head_expected.keys() and all(
        head_state[k].shape == head_expected[k].shape for k in head_expected
    ):
        head.load_state_dict(head_state)  # same classes: keep the trained head too
