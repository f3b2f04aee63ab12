"""What `--help`, `--print_config` and a parse error show: the options of the classes a configuration picks, with
their docstrings, and no secret of a URL (`redact.py`, the one choke point)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
from typing import Any, NoReturn

from jsonargparse import ArgumentParser, Namespace

from project.redact import redact_text, redact_value


class RedactedErrors:
    """A jsonargparse parser (a mixin before it) whose error lines show URLs' secrets as ***: jsonargparse quotes
    the value it refused, a whole section of a config file among them (`Given value: {'train': 'https://...'}`)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        super().error(redact_text(message), ex)  # type: ignore[misc]


class HelpRequested(argparse.Action):
    """`-h`/`--help` noted on the parser, not printed at once: the help lists the options of the classes that the
    whole command line picks (`--model`, `--data`, `--config`), so it is printed once they are parsed."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        parser.help_requested = True


@contextlib.contextmanager
def redacted_print_config(args: list[str] | None) -> Any:
    """`--print_config` shows the configuration with its URLs' secrets as *** (`redact.py`), as config.yaml
    does: jsonargparse prints it and exits inside the parse."""
    if not any(str(arg).startswith("--print_config") for arg in args or ()):
        yield
        return
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        sys.stdout.write(redact_text(printed.getvalue()))


def print_help(parser: ArgumentParser, config: Any, linked: set[str]) -> None:
    """The CLI's help, then every option of the model and data classes this configuration picks, with
    their docstrings: `--model.lr`, `--data.batch_size` (LightningCLI alone lists only `--model.help`).
    Defaults are the configuration's values, so their URLs' secrets are shown as *** (`redact.py`)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_help_sections(parser, config, linked)
    sys.stdout.write(redact_text(printed.getvalue()))


def print_help_sections(parser: ArgumentParser, config: Any, linked_model_arguments: set[str]) -> None:
    print(parser.format_help())
    for section in ("model", "data"):
        chosen = config.get(section)
        class_path = getattr(chosen, "class_path", None)
        if class_path is None:
            continue
        linked = linked_model_arguments if section == "model" else set()
        classes = ArgumentParser(prog=parser.prog, usage=argparse.SUPPRESS)
        classes.add_class_arguments(import_class(class_path), nested_key=section, fail_untyped=False, skip=linked)
        init_args = getattr(chosen, "init_args", None)
        given = init_args.items(branches=True, nested=False) if init_args is not None else ()  # a class: a Namespace
        # redacted before argparse lays the help out: it may break a URL across lines (at a hyphen)
        # a class given as a setting (`model.backbone`) keeps its own default: jsonargparse would set its keys one by
        # one (`model.backbone.class_path`), which are no options
        shown = [(key, value) for key, value in given if key not in linked and not isinstance(value, Namespace)]
        defaults = {f"{section}.{key}": redact_value(value) for key, value in shown}
        classes.set_defaults(defaults)  # the configuration's values, not the class's own defaults
        print(f"\n{section} ({class_path}; pick another with --{section} CLASS):")
        print(classes.format_help().split("\n", 2)[-1])


def import_class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)
