"""Print the dependencies of pyproject.toml, one requirement a line, for `pip install -r`.

    python scripts/requirements.py [EXTRAS]      # EXTRAS: comma-separated, e.g. "tune,export"

The Dockerfile installs these before it copies the source, so that the dependency layer is rebuilt only
when pyproject.toml changes. Reads pyproject.toml in the working directory; standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The project's dependencies plus those of `extras`; an extra naming the project itself is expanded."""
    self_reference = re.compile(rf"^{re.escape(project['name'])}\[(.+)\]$")
    found = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            if match := self_reference.match(requirement.replace(" ", "")):
                pending.extend(match.group(1).split(","))
            elif requirement not in found:
                found.append(requirement)
    return found


def main(argv: list[str]) -> None:
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    extras = [extra.strip() for extra in (argv[0] if argv else "").split(",") if extra.strip()]
    known = sorted(project.get("optional-dependencies", {}))
    if unknown := sorted(set(extras) - set(known)):
        raise SystemExit(f"error: unknown extra {unknown}; pyproject.toml has {known}")
    print("\n".join(requirements(project, extras)))


if __name__ == "__main__":
    main(sys.argv[1:])
