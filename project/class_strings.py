"""Which strings jsonargparse may read as a class to import, by the types of a class's init arguments.

Where an argument's type admits a class (a subclass type such as `v2.Transform`, `Any`, or no type), jsonargparse
reads a string as a class: a class path (`my.module.Class`, imported), YAML naming one (`{class_path: ...}`), or
the path of a file holding that YAML. A run folder's config.yaml (`project/run_folder.py`) may give such an
argument only a `class_path` mapping or one of its type's Literal strings (`data.augment: light`).
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

PLAIN = (str, int, float, bool, bytes, type(None), Path)  # types jsonargparse reads no class from


@functools.cache
def class_settings(class_path: str) -> Callable[[Any], frozenset | None]:
    """For each init argument of an allowed class: None when any string may be given (its type admits no class),
    else the strings its type admits (its Literal values). An argument passed on through `**kwargs` is typed by
    the base class that takes it (as jsonargparse follows it); one typed nowhere is taken to admit a class."""
    module, _, name = class_path.rpartition(".")
    strings: dict[str, frozenset | None] = {}
    try:
        for cls in getattr(importlib.import_module(module), name).__mro__:  # a task, or a class the user names
            if "__init__" not in vars(cls):
                continue
            hints, parameters = typing.get_type_hints(cls.__init__), inspect.signature(cls.__init__).parameters
            for key, parameter in parameters.items():
                hint = hints.get(key, Any)
                if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) and key not in strings:
                    strings[key] = frozenset(literal_values(hint)) if admits_class(hint) else None
            if all(parameter.kind != parameter.VAR_KEYWORD for parameter in parameters.values()):
                break
    except Exception:  # noqa: BLE001 - a class we cannot see into: no string settings but those seen
        pass
    return lambda key: strings.get(key, frozenset()) if isinstance(key, str) else frozenset()


def admits_class(hint: Any) -> bool:
    """Whether jsonargparse may read a value of type `hint` as a class (a subclass type, `Any`, untyped)."""
    if typing.get_origin(hint) is Literal:
        return False
    arguments = typing.get_args(hint)
    if arguments or typing.get_origin(hint) is not None:  # a union, list[...], tuple[...], dict[...]
        return any(admits_class(argument) for argument in arguments if argument is not Ellipsis)
    return not (isinstance(hint, type) and (issubclass(hint, PLAIN) or issubclass(hint, enum.Enum)))


def literal_values(hint: Any) -> set[str]:
    if typing.get_origin(hint) is Literal:
        return {value for value in typing.get_args(hint) if isinstance(value, str)}
    return set().union(*(literal_values(argument) for argument in typing.get_args(hint)))


def setting_kinds(
    value: dict, kind: Any, class_path: Any, class_keys: tuple[str, ...]
) -> Iterator[tuple[Any, Any, Any]]:
    """Each (key, item, what it may be) of a mapping in a config tree, once its `class_path` (None: it names no
    class) is allowed: None any string, a set the only strings, a function a class's init_args (`class_settings`).
    The walkers of a run folder's config and of a checkpoint's hyperparameters both take it; `class_keys` are the
    keys whose string is a class the walker has checked."""
    for key, item in value.items():
        if callable(kind):  # a class's init_args: each setting as its type says
            inner = kind(key)
        elif class_path is None:
            inner = kind
        elif key == "init_args" and isinstance(item, dict):
            inner = class_settings(class_path)
        else:
            inner = None if key in class_keys else frozenset()
        yield key, item, inner
