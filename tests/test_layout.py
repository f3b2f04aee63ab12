"""The layout the design document describes: a streaming core that knows no task, no import circles (also
through imports inside functions), and small modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

PROJECT = REPO / "project"
MAX_LINES = 300
# `python -m project.data.demo|prepare|index|inspect|tokenizer`: thin aliases of the write tools
ALIASES = {f"project.data.{name}" for name in ("demo", "prepare", "index", "inspect", "tokenizer")}
# what the core may not import, and the task words it may not use as keys or extensions
NOT_IN_CORE = ("torchvision", "PIL", "project.tasks", "project.shards", "project.callbacks", "project.cli")
TASK_WORDS = {"image", "label", "jpg", "jpeg", "png", "cls", "txt", "class", "classes"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PROJECT.rglob("*.py"))}
CORE = sorted(name for name in MODULES if name.startswith("project.data.") and name not in ALIASES)


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
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in MODULES)  # fmt: skip
    return found


def test_the_layout_is_found():
    assert {"project.data.stream", "project.data.plan", "project.tasks.image.data", "project.shards.prepare"} <= set(
        MODULES
    )
    assert "project.data.datamodule" in CORE and "project.data.demo" not in CORE


def test_no_module_imports_itself_through_others():
    graph = {name: {target for target in imports(path) if target in MODULES and target != name}
             for name, path in MODULES.items()}  # fmt: skip
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
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr)}  # fmt: skip
    words = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and id(node) not in docstrings and node.value.strip(".").lower() in TASK_WORDS]  # fmt: skip
    assert not words, f"{name} names a task's keys: {words}"
