"""The modules a model builds from factories (a class_path and its settings, `model.encoder`), as its checkpoint
records them, and the check of a checkpoint's classes before Lightning rebuilds them from it."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from project.class_strings import class_settings, setting_kinds
from project.errors import UserError
from project.run_folder import allowed_class
from project.shown import abbreviated, shown

LOADER = "lightning.pytorch.cli.instantiate_module"  # rebuilds a module from hyperparameters that name classes
LIGHTNING_KEYS = frozenset({"_instantiator", "_class_path"})  # Lightning's own: its allowlist, and `check_class`


def described(factory: Any, option: str) -> dict[str, Any] | None:
    """A module factory as a config names it, `{class_path, init_args}`: what a checkpoint keeps of it, so that
    `load_from_checkpoint` rebuilds it (through `LOADER`, as for a model the CLI built). The CLI gives that form
    already; a model built in Python gives a class or a `functools.partial` of one with keyword settings
    (jsonargparse's binds the class after its instantiator functions)."""
    if factory is None or isinstance(factory, dict):
        return factory
    bound = (factory.func, *factory.args) if isinstance(factory, functools.partial) else (factory,)
    classes = [part for part in bound if isinstance(part, type)]
    if len(classes) != 1 or not all(callable(part) for part in bound):
        raise UserError(f"{option} must be a class, or a functools.partial of one with keyword settings")
    settings = dict(factory.keywords) if isinstance(factory, functools.partial) else {}
    return {"class_path": f"{classes[0].__module__}.{classes[0].__qualname__}", "init_args": settings}


def check_classes(arguments: dict, where: str, owner: type) -> None:
    """A `UserError` unless every class the arguments a checkpoint gives `owner` name, at any depth, is one of the
    project's tasks (project/run_folder.py's rule for a stranger's run config) or a class already imported
    (Lightning's rule for the model's own), and unless every setting whose type admits a class gives it as such a
    `class_path`: Lightning rebuilds the model through jsonargparse, which imports a nested class_path's module (an
    encoder's) before it checks the class, and reads a string given where a class goes (`encoder: my.module`, or
    YAML naming one) as one to import (project/class_strings.py). Keys `owner` does not take are dropped by
    Lightning, unread."""
    top = arguments.get("_class_path")  # Lightning's: the subclass the CLI built, which it checks is imported
    if top is not None:
        check_class(top, where)
        owner = getattr(sys.modules[top.rpartition(".")[0]], top.rpartition(".")[2])
    settings = class_settings(f"{owner.__module__}.{owner.__qualname__}")
    parameters = inspect.signature(owner.__init__).parameters
    takes_any = any(parameter.kind == parameter.VAR_KEYWORD for parameter in parameters.values())
    stack = [
        (shown(str(key)[:100]), value, settings(key))
        for key, value in arguments.items()
        if key not in LIGHTNING_KEYS and (key in parameters or takes_any)
    ]
    while stack:
        place, value, kind = stack.pop()
        if isinstance(value, dict):
            stack.extend(mapping_items(place, value, kind, where))
        elif isinstance(value, list | tuple):
            stack.extend((f"{place}[{index}]", item, kind) for index, item in enumerate(value))
        elif isinstance(value, str) and value.lstrip().startswith("pipe:"):
            raise UserError(f"{where}: its hyperparameter {place} is a pipe: command: a checkpoint runs nothing")
        elif isinstance(value, str) and isinstance(kind, frozenset) and value not in kind:
            raise UserError(
                f"{where}: its hyperparameter {place} names a class by a string "
                f"({shown(abbreviated(value, 200))}), which a checkpoint may not import: a class goes there as a "
                "class_path of one of the project's tasks"
            )


def mapping_items(place: str, value: dict, kind: Any, where: str) -> list[tuple[str, Any, Any]]:
    """A mapping's items for `check_classes`, each with what it may be (`setting_kinds`), once its class_path is
    allowed."""
    class_path = next((value[key] for key in ("class_path", "_class_path") if key in value), None)
    if class_path is not None:
        check_class(class_path, where)
    kinds = setting_kinds(value, kind, class_path, ("class_path", "_class_path"))
    return [(f"{place}.{shown(str(key)[:100])}", item, inner) for key, item, inner in kinds]


def check_class(class_path: Any, where: str) -> None:
    if not (allowed_class(class_path, set()) or imported_class(class_path)):
        raise UserError(
            f"{where}: its hyperparameters name the class {shown(abbreviated(class_path, 200))}, which is neither one "
            "of the project's tasks nor imported: a checkpoint may not import it (import its module first if you "
            "trust it)"
        )


def imported_class(class_path: Any) -> bool:
    """Whether `class_path` names a class of a module imported already (read from sys.modules: nothing is imported)."""
    module, _, name = class_path.rpartition(".") if isinstance(class_path, str) else ("", "", "")
    return isinstance(getattr(sys.modules.get(module), name, None), type)
