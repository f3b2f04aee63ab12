"""The tools' command lines come from their functions, as `train`'s comes from its classes: jsonargparse reads
the signature (the options and their types, following `**kwargs` into the function they are passed to) and
the docstrings' Args (the help), with `--config FILE` and `--print_config`. Flags are spelled as LightningCLI
spells them (`--samples_per_shard 500`, `--text true`, `--quantize [static-int8,dynamic-int8]`).

Tools that run training (active, tune, export, scaling) pass every argument that is not theirs on to the runs,
as `train` takes it: there `--config FILE` is the runs' config, and `--print_config` shows the tool's options.
Besides LightningCLI, this module is the only reader of the command line (`command_line`).
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docstring_parser
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from project.cli_help import RedactedErrors, redacted_print_config
from project.redact import redact_text


def invocation(module: str) -> str:
    """How the command was started, for its usage line: `python -m project.shards.prepare`, or the name of the
    console script (`shards-prepare`); a script named by its path (`benchmarks/peers.py`) as `python PATH`."""
    if module.endswith(".py"):
        return f"python {module}"
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if not name or name.endswith(".py") or name.startswith("project.") or name in ("-m", "-c") or "pytest" in name:
        return f"python -m {module}"
    return name


def started_as() -> str:
    """The running entry point's name for a usage line: `python -m project.train` for `python -m` (the module
    of `sys.argv[0]`), else the console script's name."""
    path = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    package = Path(__file__).resolve().parent
    if path is not None and path.suffix == ".py" and path.is_relative_to(package.parent):
        parts = path.relative_to(package.parent).with_suffix("").parts
        return "python -m " + ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
    if sys.argv and sys.argv[0].startswith("project."):  # runpy with the module's name (the tests' run_here)
        return f"python -m {sys.argv[0]}"
    return invocation("project.train")


def description(function: Callable) -> str:
    return (inspect.getdoc(function) or "").split("\n\n")[0].replace("\n", " ")


class ToolParser(RedactedErrors, ArgumentParser):
    """A tool's parser: its error lines show no secret."""


def command_parser(function: Callable, module: str, config: bool = True) -> ArgumentParser:
    """`function`'s parameters as a parser: required ones before a `*` positional, the others options."""
    # no abbreviations: `--print_conf=` would print the options past redacted_print_config's check
    parser = ToolParser(prog=invocation(module), description=description(function), allow_abbrev=False)
    if config:
        parser.add_argument("--config", action=ActionConfigFile, help="A YAML file of these options.")
    else:
        parser.add_argument("--print_config", action="store_true", help="Print these options as YAML, and exit.")
    parser.add_function_arguments(function, as_positional=True, skip=positional_lists(parser, function))
    return parser


def positional_lists(parser: ArgumentParser, function: Callable) -> set[str]:
    """Each required list parameter (`inputs: list[str]`) as a positional of one or more values (`index a b
    --out x`): jsonargparse itself reads a list positional as one JSON list (`'["a", "b"]'`)."""
    hints = typing.get_type_hints(function)
    docs = {param.arg_name: param.description for param in docstring_parser.parse(inspect.getdoc(function)).params}
    added = set()
    for parameter in inspect.signature(function).parameters.values():
        hint = hints.get(parameter.name)
        required = parameter.kind is parameter.POSITIONAL_OR_KEYWORD and parameter.default is parameter.empty
        if required and typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            parser.add_argument(parameter.name, type=item, nargs="+", help=docs.get(parameter.name))
            added.add(parameter.name)
    return added


def option_names(parser: ArgumentParser) -> set[str]:
    return {f"--{key}" for key in parser.get_defaults().keys()}  # noqa: SIM118 - a Namespace: keys() flattens


def command_line(args: Sequence[str] | None) -> list[str]:
    """`args`, or the command line's arguments: what every parser here is given."""
    return list(sys.argv[1:] if args is None else args)


def run_command(function: Callable, module: str, args: Sequence[str] | None = None) -> Any:
    """Parse `args` (the command line by default) into `function`'s arguments and call it."""
    parser = command_parser(function, module)
    given = command_line(args)
    with redacted_print_config(given):  # jsonargparse prints --print_config inside the parse
        config = parser.parse_args(given)
    return function(**arguments(parser, config))


def arguments(parser: ArgumentParser, config: Namespace) -> dict[str, Any]:
    """The parsed values (classes built) as keyword arguments."""
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in jsonargparse 4.49
    built = instantiate(config)
    return {key: value for key, value in vars(built).items() if key not in ("config", "print_config", "__path__")}


def parse_tool_arguments(
    function: Callable, module: str, args: Sequence[str] | None = None, on_help: Callable[[str], Any] = print
) -> tuple[dict[str, Any], list[str]]:
    """A training tool's own options (keyword arguments of `function`) and the rest, for its runs. A token
    naming one of the tool's options (`--budget 10`, `--budget=10`) is the tool's, with its value. With `-h` or
    `--help`, `on_help` gets the tool's own help (a tool that passes train options on adds train's), then exit."""
    parser = command_parser(function, module, config=False)
    options = option_names(parser) - {"--print_config"}
    args = command_line(args)
    if "-h" in args or "--help" in args:
        on_help(parser.format_help())
        raise SystemExit(0)
    printing = any(arg.partition("=")[0] == "--print_config" for arg in args)  # `--print_config=x` too
    mine, rest, position = [], [], 0
    while position < len(args):
        token = args[position]
        name, equals, _ = token.partition("=")
        takes_value = name in options and not equals
        if name != "--print_config":
            (mine if name in options else rest).extend(args[position : position + 1 + takes_value])
        position += 1 + takes_value
    config = parser.parse_args(mine)
    if printing:
        del config["print_config"]
        print(redact_text(parser.dump(config, skip_none=False)), end="")
        raise SystemExit(0)
    return arguments(parser, config), rest
