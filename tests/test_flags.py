"""Every `--flag` the project names, in its messages, docstrings and comments, the README, docs/ and the comments of
configs/, is one its parsers take: LightningCLI's for train, evaluate and predict (with every task's model and data
classes), the tools' from their functions. A flag after `python -m project.X` on the same line is checked against
X's own parser. Only the flags of other programs (docker, curl, tensorboard ...) are allowed by name."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import pkgutil
import re
import runpy
import sys
import tokenize
import warnings
from collections.abc import Iterator
from pathlib import Path

import jsonargparse
import pytest

from .conftest import REPO

FLAG = re.compile(r"(?<![\w\-/])--[A-Za-z][\w.\-]*[A-Za-z0-9_]")
COMMAND = re.compile(r"python -m (project[\w.]*\w)([^`|#;\n]*)")
# flags of other programs that the project's text names, by program
OTHER_PROGRAMS = {
    "docker": {"--build-arg", "--entrypoint", "--gpus", "--ipc", "--rm"},
    "tensorboard": {"--logdir"},
    "hf download": {"--local-dir"},
    "mlflow server": {"--backend-store-uri"},
    "ray start": {"--head"},
    "sbatch": {"--array", "--dependency", "--parsable", "--wrap"},
    "py-spy": {"--pid"},
    # curl, wget and the AWS CLI: options whose values are secrets, which project/redact.py hides
    "curl, wget, aws": {
        "--access-key",
        "--auth",
        "--aws-secret-access-key",
        "--header",
        "--http-password",
        "--http-user",
        "--oauth2-bearer",
        "--password",
        "--proxy-user",
        "--secret",
        "--secret-key",
        "--token",
        "--user",
    },
}
# the general form of every option (`--section.key VALUE`, `--key=value`), named as such
GENERAL_FORMS = {"--section.key", "--key"}
# named as what the parsers refuse: an abbreviation (they take none)
REFUSED = {"--print_conf"}


def python_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string (messages, docstrings) and comment of a Python file."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) where a file names flags: a Python file's strings and comments, a YAML file's comments,
    every line of any other (Markdown)."""
    if path.suffix == ".py":
        yield from python_texts(path)
        return
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if path.suffix in (".yaml", ".yml"):
            if "#" in line:
                yield number, line.split("#", 1)[1]
        else:
            yield number, line


def sources() -> list[Path]:
    return [
        *sorted((REPO / "project").rglob("*.py")),
        REPO / "README.md",
        REPO / "data" / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "configs").rglob("*.yaml")),
    ]


def named_flags(path: Path) -> Iterator[tuple[str, str | None, str]]:
    """(flag, the module whose command line it is on or None, where) of each flag a file names."""
    for number, text in texts(path):
        where = place(path, number)
        for line in text.splitlines():
            commands = list(COMMAND.finditer(line))
            inside = {(m.start(2), m.end(2)): m.group(1) for m in commands}
            for flag in FLAG.finditer(line):
                module = next((name for (a, b), name in inside.items() if a <= flag.start() < b), None)
                yield flag.group(), module, where


def commands_named(path: Path) -> Iterator[tuple[str, str, str]]:
    """(the command's text, its module, where) of each `python -m project.X` a file names."""
    for number, text in texts(path):
        for command in COMMAND.finditer(text):
            yield command.group(0), command.group(1), place(path, number)


def place(path: Path, number: int) -> str:
    return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}"


class Captured(BaseException):
    """Raised by the first parse an entry point makes, carrying its parser (BaseException: past run_main)."""


def entry_point_parser(module: str) -> jsonargparse.ArgumentParser:
    """The parser `python -m module` parses its command line with, caught as it starts to parse."""

    def capture(parser: jsonargparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise Captured(parser)

    argv = sys.argv
    sys.argv = [module]
    try:
        with (
            pytest.MonkeyPatch.context() as patch,
            contextlib.redirect_stdout(io.StringIO()),
            warnings.catch_warnings(),
        ):
            patch.setattr(jsonargparse.ArgumentParser, "parse_args", capture)
            # runpy warns of a module this test process imported before; `python -m` has none
            warnings.filterwarnings("ignore", ".*found in sys.modules", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Captured as captured:
        return captured.args[0]
    finally:
        sys.argv = argv
    raise AssertionError(f"python -m {module} parsed no command line")


def option_strings(parser: jsonargparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings if option.startswith("--")}


def class_options(section: str, base: type) -> set[str]:
    """`--section.X` for every argument of every class that is a `base` of the project's tasks and of the
    regression task in tests/ (docs/DESIGN.md's guide to adding a task names its flags)."""
    import project.tasks

    for module in pkgutil.walk_packages(project.tasks.__path__, "project.tasks."):
        importlib.import_module(module.name)  # a task package imports its classes when first asked for
    importlib.import_module("tests.regression_task")
    found, stack = set(), [base]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith(("project.", "tests.regression_task")):
            parser = jsonargparse.ArgumentParser()
            parser.add_class_arguments(cls, nested_key=section, fail_untyped=False)
            found |= option_strings(parser)
    return found


def parameter_names() -> set[str]:
    """Every `__init__` parameter of the classes a class-typed option may name: the project's, Lightning's
    callbacks and loggers, and any a config names by class_path."""
    import lightning.pytorch.callbacks
    import lightning.pytorch.loggers  # noqa: F401

    named = set()
    for config in (REPO / "configs").rglob("*.yaml"):
        named |= set(re.findall(r"class_path: *([\w.]+)", config.read_text()))
    for path in named:
        with contextlib.suppress(ImportError, ValueError):
            importlib.import_module(path.rpartition(".")[0])
    prefixes = ("project.", "lightning.pytorch.callbacks", "lightning.pytorch.loggers")
    classes = {
        value
        for name, module in list(sys.modules.items())
        if name.startswith(prefixes)
        for value in vars(module).values()
        if isinstance(value, type)
    }
    names = set()
    for cls in classes:
        with contextlib.suppress(TypeError, ValueError):
            names |= set(inspect.signature(cls.__init__).parameters)
    return names - {"self", "args", "kwargs"}


class Options:
    """What each entry point takes: its parser's options; for the LightningCLI ones also every task class's;
    for a tool that passes on what it does not take (its parser has no --config: that is its runs'), also train's."""

    def __init__(self) -> None:
        from lightning.pytorch import LightningModule

        from project.data.datamodule import ShardDataModule

        classes = class_options("model", LightningModule) | class_options("data", ShardDataModule)
        modules = sorted({*entry_points(), "project.train"})
        self.by_module = {}
        for module in modules:
            parser = entry_point_parser(module)
            options = option_strings(parser)
            self.by_module[module] = options | (classes if "--model" in options else set())
        train = self.by_module["project.train"]
        for options in self.by_module.values():
            if "--config" not in options:
                options |= train
        self.everything = set().union(*self.by_module.values())
        self.parameters = parameter_names()

    def takes(self, flag: str, module: str | None) -> bool:
        """Whether `flag` is an option (of `module`'s command when given; `init_args` levels optional; an upper-case
        part, `--callbacks.NAME`, stands for any name), or names an argument of a class a class-typed option
        takes (`--trainer.callbacks.decay`, `--trainer.logger.init_args.name`)."""
        known = self.by_module.get(module, self.everything) if module else self.everything
        parts = [part for part in flag.split(".") if part != "init_args"]
        pattern = re.compile(r"\.".join("[^.]+" if part.isupper() else re.escape(part) for part in parts))
        if any(pattern.fullmatch(without_init_args(option)) for option in known):
            return True
        for end in range(len(parts) - 1, 0, -1):  # the longest class-typed option it extends
            if ".".join([*parts[:end], "help"]) in known:
                return parts[end] in self.parameters
        return False


def without_init_args(option: str) -> str:
    return ".".join(part for part in option.split(".") if part != "init_args")


def entry_points() -> list[str]:
    from .test_repo import ENTRY_POINTS

    return ENTRY_POINTS


@pytest.fixture(scope="module")
def options() -> Options:
    return Options()


def unknown(paths: list[Path], options: Options) -> list[str]:
    """`where: flag` for each flag named in `paths` that nothing takes."""
    others = set().union(*OTHER_PROGRAMS.values()) | GENERAL_FORMS | REFUSED
    found = []
    for path in paths:
        for flag, module, where in named_flags(path):
            if flag not in others and not options.takes(flag, module):
                found.append(f"{where}: {flag}" + (f" (python -m {module})" if module else ""))
    return found


def test_every_flag_the_project_names_is_taken_by_a_parser(options):
    missing = unknown(sources(), options)
    assert not missing, "flags that no parser takes:\n" + "\n".join(missing)


def test_every_command_the_project_names_is_an_entry_point():
    """`python -m project.X` in a message, docstring, comment, the README, docs/ or a config comment runs."""
    missing = stale_commands(sources())
    assert not missing, "commands that do not exist:\n" + "\n".join(missing)


def stale_commands(paths: list[Path]) -> list[str]:
    named = {(module, where) for path in paths for _, module, where in commands_named(path)}
    return sorted(f"{where}: python -m {module}" for module, where in named if module not in entry_points())


def test_a_stale_flag_is_found_in_text_code_and_config_comments(options, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "python -m project.shards.prepare SRC --out DIR --samples_per_shard 500 --val-fraction 0.1\n"
        "then train with `--data.num_workers 2` or `--data.num_wrokers 2`, `--trainer.callbacks.amuont=0.2`\n"
        "python -m project.bench --json true --data.root x\n"  # a train option is not the bench's
        "python -m project.data.prepare SRC --out DIR\n"  # a command's name of an earlier layout
    )
    code = tmp_path / "tool.py"
    code.write_text('"""Docs: --quick true."""\nraise ValueError("set --text-column")  # or --image-size\n')
    config = tmp_path / "x.yaml"
    config.write_text("# --trainer.max_epochs 3, or --model.lrr 0.1\ntrainer: {}  # --callbacks.NAME.ARG\n")
    assert sorted(line.split(": ", 1)[1] for line in unknown([readme, code, config], options)) == [
        "--data.num_wrokers",
        "--data.root (python -m project.bench)",
        "--image-size",
        "--model.lrr",
        "--text-column",
        "--trainer.callbacks.amuont",
        "--val-fraction (python -m project.shards.prepare)",
    ]
    assert stale_commands([readme, code, config]) == [f"{readme}:4: python -m project.data.prepare"]


def test_the_other_programs_flags_and_the_refused_ones_are_no_option_of_ours(options):
    """The allow-list holds no flag of ours (it would hide a stale one), and what is named as refused is."""
    for flag in set().union(*OTHER_PROGRAMS.values()) | REFUSED:
        assert not options.takes(flag, None), flag
