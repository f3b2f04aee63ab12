"""The layout the design document describes: a streaming core that knows no task, no import circles (also
through imports inside functions), and small modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from .conftest import REPO

PROJECT = REPO / "project"
MAX_LINES = 300
# what the core may not import, and the task words it may not use as keys or extensions
NOT_IN_CORE = ("torchvision", "PIL", "project.tasks", "project.shards", "project.callbacks", "project.cli")
TASK_WORDS = {"image", "label", "jpg", "jpeg", "png", "cls", "txt", "class", "classes"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PROJECT.rglob("*.py"))}
CORE = sorted(name for name in MODULES if name.startswith("project.data."))


def imports(path: Path) -> set[str]:
    """Every module a file imports: at the top, inside functions, or for type checking only (a `from package
    import name` imports `package.name` where that is a module)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES
            )
    return found


def test_the_layout_is_found():
    assert {"project.data.stream", "project.data.plan", "project.tasks.image.data", "project.shards.prepare"} <= set(
        MODULES
    )
    assert "project.data.datamodule" in CORE and "project.shards.prepare" not in CORE


def test_no_module_imports_itself_through_others():
    graph = {
        name: {target for target in imports(path) if target in MODULES and target != name}
        for name, path in MODULES.items()
    }
    state: dict[str, str] = {}
    circles = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    """The check above could pass by finding nothing: on two modules that import each other inside
    functions, it must fail."""
    (tmp_path / "a.py").write_text("def f():\n    from project.b import g\n")
    (tmp_path / "b.py").write_text("def g():\n    import project.a\n")
    fake = {"project.a": tmp_path / "a.py", "project.b": tmp_path / "b.py"}
    monkeypatch.setattr(__import__(__name__, fromlist=["MODULES"]), "MODULES", fake)
    with pytest.raises(AssertionError, match="project.a -> project.b -> project.a"):
        test_no_module_imports_itself_through_others()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(REPO)} has {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize("name", CORE)
def test_the_core_knows_no_task(name):
    """The read path (resolve, plan, read, shuffle, stream, load, resume, skip counting) imports no image
    library and no task, and never names a task's keys: tasks plug into it through decode and collate."""
    path = MODULES[name]
    banned = [target for target in imports(path) if target.startswith(NOT_IN_CORE)]
    assert not banned, f"{name} imports {banned}"
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    words = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and node.value.strip(".").lower() in TASK_WORDS
    ]
    assert not words, f"{name} names a task's keys: {words}"


def design_modules() -> set[str]:
    """The modules DESIGN.md's layout names: `project/<folder>/<name>.py` for each backticked `name.py` under
    a "### `project/<folder>/`" heading (a bullet that starts with a `sub/` folder names that folder's)."""
    text = (REPO / "docs" / "DESIGN.md").read_text()
    layout = text[text.index("A sample travels these stages") : text.index("Rules of the layout")]
    found, folder, bullet_folder = set(), None, ""
    for line in layout.splitlines():
        if heading := re.match(r"### `(project/[\w/]*)`", line):
            folder, bullet_folder = heading.group(1), ""
            continue
        if line.startswith("- "):
            sub = re.match(r"- `(\w+/)`:", line)
            bullet_folder = sub.group(1) if sub else ""
        if folder is not None and (line.startswith("- ") or line.startswith("  ")):
            found |= {f"{folder}{bullet_folder}{name}" for name in re.findall(r"`(\w+\.py)`", line)}
    return found


def test_the_design_names_every_module_in_its_folder():
    tree = {
        f"{path.relative_to(REPO).as_posix()}"
        for path in PROJECT.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }
    named = design_modules()
    assert not tree - named, f"modules DESIGN.md's layout does not name: {sorted(tree - named)}"
    assert not named - tree, f"DESIGN.md's layout names modules that do not exist: {sorted(named - tree)}"


def test_the_design_reads_in_a_terminal():
    long = [
        number
        for number, line in enumerate((REPO / "docs" / "DESIGN.md").read_text().splitlines(), 1)
        if len(line) > 120
    ]
    assert not long, f"DESIGN.md lines over 120 characters: {long}"


def test_a_task_imports_no_write_tool():
    """Imports run down: the write tools (project.shards) use the tasks' decoding and labels, never the reverse;
    the text demo, a CSV that prepare shards, is the one task module that calls a write tool."""
    exempt = {"project.tasks.text.demo"}
    tasks = [name for name in MODULES if name.startswith("project.tasks") and name not in exempt]
    upward = {name: sorted(t for t in imports(MODULES[name]) if t.startswith("project.shards")) for name in tasks}
    assert not any(upward.values()), {name: found for name, found in upward.items() if found}


def test_the_readme_map_names_every_folder_of_the_project():
    readme = (REPO / "README.md").read_text()
    listing = readme[readme.index("## Repository map") :]
    folders = sorted(
        f"{path.relative_to(REPO).as_posix()}/"
        for path in PROJECT.rglob("*")
        if path.is_dir() and path.name != "__pycache__" and any(path.glob("*.py"))
    )
    missing = [folder for folder in folders if folder not in listing]
    assert not missing, f"folders the README's map does not name: {missing}"
