"""The modules a model builds from factories (a class_path and its settings, `model.encoder`), as its checkpoint
records them, and the check of a checkpoint's classes before Lightning rebuilds them from it."""

from __future__ import annotations

import functools
import sys
from typing import Any

from project.errors import UserError
from project.run_folder import allowed_class
from project.shown import abbreviated, shown

LOADER = "lightning.pytorch.cli.instantiate_module"  # rebuilds a module from hyperparameters that name classes


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


def check_classes(hyperparameters: Any, where: str) -> None:
    """A `UserError` unless every class a checkpoint's hyperparameters name, at any depth, is one of the project's
    tasks (project/run_folder.py's rule for a stranger's run config) or a class already imported (Lightning's rule
    for the model's own): Lightning rebuilds a model the CLI built through jsonargparse, which imports a nested
    class_path's module (an encoder's) before it checks the class."""
    stack = [hyperparameters]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in ("class_path", "_class_path"):
                if key in value and not (allowed_class(value[key], set()) or imported_class(value[key])):
                    named = shown(abbreviated(value[key], 200))
                    raise UserError(
                        f"{where}: its hyperparameters name the class {named}, which is neither one of the project's "
                        "tasks nor imported: a checkpoint may not import it (import its module first if you trust it)"
                    )
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)


def imported_class(class_path: Any) -> bool:
    """Whether `class_path` names a class of a module imported already (read from sys.modules: nothing is imported)."""
    module, _, name = class_path.rpartition(".") if isinstance(class_path, str) else ("", "", "")
    return isinstance(getattr(sys.modules.get(module), name, None), type)
