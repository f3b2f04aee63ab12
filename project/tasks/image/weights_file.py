"""A backbone's weights from a local file (`--model.backbone.weights PATH`): a torchvision or timm state dict of
the same architecture, or a checkpoint of this project (keys `backbone.*` and `head.*`).

The file is a stranger's data: its pickles are read as opcodes first (`pickle_problem`: no bomb), then torch loads
it with `weights_only=True` (tensors and plain data only: it cannot run code). Every feature-extractor weight must be
in it with the right shape, finite: a file for another architecture is one line, never a silent partial load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.callbacks.checkpoint_pickle import pickle_problem
from project.callbacks.checkpoint_shape import plain
from project.errors import UserError
from project.tasks.weights import check_finite

OPTION = "--model.backbone.weights"
SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")


def is_weights_file(weights: str) -> bool:
    """Whether `weights` names a file rather than published weights ("DEFAULT", "IMAGENET1K_V1")."""
    return "/" in weights or Path(weights).suffix in SUFFIXES or Path(weights).exists()


def load_weights_file(features: nn.Module, head: nn.Linear, path: Path) -> None:
    """Load the weights file at `path` into (features, head); the head only when it has this dataset's shape
    (the same classes: a probe's trained head is kept), else the head stays new."""
    state = read_state(path)
    feature_state, head_state = split_state(state, features, path)
    check_fits(features, feature_state, path)
    parameters = {name for name, _ in features.named_parameters()} | {"head.weight", "head.bias"}
    named = [*feature_state.items(), *((f"head.{name}", value) for name, value in head_state.items())]
    check_finite(named, parameters, f"{OPTION} {path}: ")
    features.load_state_dict(feature_state)
    expected = head.state_dict()
    if head_state.keys() == expected.keys() and all(head_state[k].shape == expected[k].shape for k in expected):
        head.load_state_dict(head_state)


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The file's state dict of plain tensors (a Lightning checkpoint's `state_dict`, a timm one's `model`)."""
    if not path.is_file():
        raise UserError(f"{OPTION} {path}: no such file")
    try:
        problem = pickle_problem(path)  # plain data that would cost without bound to unpickle (a pickle bomb)
        state = None if problem else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable or unsafe file is the user's to fix
        raise UserError(f"{OPTION} {path}: not a readable weights file ({error})") from None
    if problem:
        raise UserError(f"{OPTION} {path}: refused: {problem} (a bomb, or a damaged file)")
    for key in ("state_dict", "model"):  # a Lightning checkpoint; a timm or torchvision training checkpoint
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(k, str) and is_plain(v) for k, v in state.items()):
        raise UserError(f"{OPTION} {path}: expected a state dict of tensors (plain ones)")
    return state


def is_plain(value: object) -> bool:
    return isinstance(value, torch.Tensor) and plain(value)  # not sparse, quantized or meta: load_state_dict fails


def split_state(state: dict[str, Any], features: nn.Module, path: Path) -> tuple[dict, dict]:
    """(features' state, head's state): a checkpoint of ours by its prefixes; a published file by the features'
    own keys, the rest being its classifier (a weight and a bias, named anything)."""
    if any(key.startswith("backbone.") for key in state):
        feature_state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        head_state = {k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}
        return feature_state, head_state
    expected = features.state_dict()
    feature_state = {k: v for k, v in state.items() if k in expected}
    leftover = {k: v for k, v in state.items() if k not in expected}
    head_state = {k.rpartition(".")[2]: v for k, v in leftover.items()}
    head_state = {k: v for k, v in head_state.items() if k in ("weight", "bias")}
    if len(head_state) != len(leftover) or len(leftover) > 2:
        sample = ", ".join(sorted(leftover)[:3])
        raise UserError(f"{OPTION} {path}: does not fit this backbone (unexpected keys: {sample} ...)")
    return feature_state, head_state


def check_fits(features: nn.Module, feature_state: dict[str, torch.Tensor], path: Path) -> None:
    """Every weight of the feature extractor, each of its shape."""
    expected = features.state_dict()
    missing = sorted(set(expected) - set(feature_state))
    wrong = sorted(k for k in feature_state if k in expected and feature_state[k].shape != expected[k].shape)
    if missing or wrong:
        what = f"{len(missing)} missing keys, e.g. {missing[0]}" if missing else f"wrong shape for {wrong[0]}"
        raise UserError(f"{OPTION} {path}: does not fit this backbone ({what})")
