"""The tools' command lines come from their functions, as `train`'s comes from its classes: jsonargparse reads
the signature (the options and their types, following `**kwargs` into the function they are passed to) and
the docstrings' Args (the help), with `--config FILE` and `--print_config`. Flags are spelled as LightningCLI
spells them (`--samples_per_shard 500`, `--text true`); the spellings of the release before
(`--samples-per-shard`, a switch given alone, `--no-verify-images`) still work, each with a one-line notice,
until the next release.

Tools that run training (active, tune, export) pass every argument that is not theirs on to the runs, as
`train` takes it: there `--config FILE` is the runs' config, and `--print_config` shows the tool's options.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from project.cli_help import RedactedErrors, redacted_print_config
from project.redact import redact_text


def invocation(module: str) -> str:
    """How the command was started, for its usage line: `python -m project.shards.prepare` (also when it was
    started by an alias module), or the name of the console script (`shards-prepare`)."""
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
    parser.add_function_arguments(function, as_positional=True)
    return parser


def option_names(parser: ArgumentParser) -> set[str]:
    return {f"--{key}" for key in parser.get_defaults().keys()}  # noqa: SIM118 - a Namespace: keys() flattens


def _notice(old: str, new: str) -> None:
    print(f"note: {old} is spelled {new} now; the old spelling goes in the next release", file=sys.stderr)


class Spellings:
    """What changed since the release before, for `modernized`.

    Args:
        switches: options that were switches (`--text`): given alone, they mean `--text true`.
        renamed: old options to their new form, whole (`{"--no-verify-images": "--verify_images=false"}`).
        lists: options that took several values (`--quantize a b`): now one list, `--quantize=["a","b"]`.
        positional_list: the leading paths are one list-typed positional (`index a b --out x`).
    """

    def __init__(
        self,
        switches: Collection[str] = (),
        renamed: dict[str, str] | None = None,
        lists: Collection[str] = (),
        positional_list: bool = False,
    ) -> None:
        self.switches, self.renamed, self.lists = set(switches), dict(renamed or {}), set(lists)
        self.positional_list = positional_list


def modernized(args: Sequence[str], options: set[str], spellings: Spellings | None = None) -> list[str]:
    """`args` with the spellings of the release before rewritten into the ones `options` has, a notice each."""
    spellings = spellings or Spellings()
    result, position = [], 0
    leading = []
    while spellings.positional_list and position < len(args) and not args[position].startswith("-"):
        leading.append(args[position])
        position += 1
    if leading:
        result.append(json.dumps(leading))
    while position < len(args):
        token = args[position]
        name, equals, value = token.partition("=")
        position += 1
        if name in spellings.renamed and not equals:
            _notice(name, spellings.renamed[name])
            result.append(spellings.renamed[name])
            continue
        if name.startswith("--") and "-" in name[2:] and (new := "--" + name[2:].replace("-", "_")) in options:
            _notice(name, new)
            name = new
        following = args[position] if position < len(args) else None
        if name in spellings.switches and not equals and (following is None or following.startswith("-")):
            _notice(f"{name} alone", f"{name} true")
            result.append(f"{name}=true")
        elif name in spellings.lists and not equals and following is not None and not following.startswith("["):
            values = []
            while position < len(args) and not args[position].startswith("-"):
                values.append(args[position])
                position += 1
            result.append(f"{name}={json.dumps(values)}")
        elif name in spellings.lists and equals and not value.startswith("["):  # one value, given as a list
            result.append(f"{name}={json.dumps(value.split(','))}")
        else:
            result.append(f"{name}{equals}{value}")
    return result


def run_command(
    function: Callable, module: str, args: Sequence[str] | None = None, spellings: Spellings | None = None
) -> Any:
    """Parse `args` (the command line by default) into `function`'s arguments and call it."""
    parser = command_parser(function, module)
    given = list(sys.argv[1:] if args is None else args)
    with redacted_print_config(given):  # jsonargparse prints --print_config inside the parse
        config = parser.parse_args(modernized(given, option_names(parser), spellings))
    return function(**arguments(parser, config))


def arguments(parser: ArgumentParser, config: Namespace) -> dict[str, Any]:
    """The parsed values (classes built) as keyword arguments."""
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in jsonargparse 4.49
    built = instantiate(config)
    return {key: value for key, value in vars(built).items() if key not in ("config", "print_config", "__path__")}


def parse_tool_arguments(
    function: Callable, module: str, args: Sequence[str], spellings: Spellings | None = None
) -> tuple[dict[str, Any], list[str]]:
    """A training tool's own options (keyword arguments of `function`) and the rest, for its runs. A token
    naming one of the tool's options (`--budget 10`, `--budget=10`) is the tool's, with its value."""
    parser = command_parser(function, module, config=False)
    options = option_names(parser) - {"--print_config"}
    args = modernized(args, options, spellings)
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


def renamed_command(old: str, new: str) -> None:
    """Run the command that `python -m old` was, with a note of its name now (the older names stay a release)."""
    import importlib

    from project.errors import run_main

    _notice(f"python -m {old}", f"python -m {new}")
    run_main(importlib.import_module(new).main)
