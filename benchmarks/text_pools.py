"""The texts benchmarks/text_corpora.py draws its sets from: Debian's package descriptions (from apt's lists) and
the docstrings of installed packages (read with `ast`), each as a `Pool` of (text, label) rows.
"""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sysconfig
import warnings
from collections import defaultdict
from pathlib import Path

LISTS = Path("/var/lib/apt/lists")
RELEASE = "deb.debian.org_debian_dists_bookworm"
PACKAGES = LISTS / f"{RELEASE}_main_binary-amd64_Packages"
TRANSLATION = LISTS / f"{RELEASE}_main_i18n_Translation-en"
UPDATE = "run `apt-get update -o Acquire::Languages=en` (as root)"
MIN_CHARS = 80  # the least long description (Debian) or docstring (docs), in characters
PREFIXES = ("contrib/", "non-free/", "non-free-firmware/")
BULLET = ("*", "-", "+", "o ", "#")
DOCS_PACKAGES = (
    "numpy", "scipy", "pandas", "sklearn", "matplotlib", "sympy", "networkx", "torch", "transformers",
    "torchmetrics", "ray", "mlflow", "sqlalchemy", "fontTools", "pygments",
)  # fmt: skip
SKIP_PARTS = {"_vendor", "vendor", "_vendored", "vendored", "externals", "_externals", "extern", "_extern"}
SKIP_PARTS |= {"array_api_compat", "array_api_extra", "__pycache__"}  # copies of other projects' code


class Pool:
    """The kept texts of one source, their labels, and what was dropped on the way."""

    def __init__(self, source: str, rows: list[tuple[str, str]], built_from: list[str], notes: list[str]):
        self.source, self.built_from, self.notes = source, built_from, notes
        copies: dict[str, list[str]] = defaultdict(list)
        for text, label in rows:
            copies[text].append(label)
        self.rows = [(text, labels[0]) for text, labels in copies.items() if len(set(labels)) == 1]
        extra = sum(len(labels) - 1 for labels in copies.values() if len(set(labels)) == 1)
        torn = [labels for labels in copies.values() if len(set(labels)) > 1]
        notes.append(
            f"{len(rows)} texts read; {extra} exact duplicates of a kept text dropped; {sum(map(len, torn))} "
            f"copies of {len(torn)} texts whose copies carry different labels dropped; {len(self.rows)} left"
        )


def apt_list(stem: Path) -> tuple[str, Path]:
    """The text of an apt list file, whichever compression apt stored it with (apt-helper undoes it)."""
    for suffix in ("", ".lz4", ".xz", ".gz", ".zst", ".bz2"):
        path = stem.with_name(stem.name + suffix)
        if path.exists():
            done = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], capture_output=True)
            if done.returncode:
                raise SystemExit(f"text_corpora: apt-helper cannot read {path}: {done.stderr.decode().strip()}")
            return done.stdout.decode("utf-8", "replace"), path
    raise SystemExit(f"text_corpora: {stem.name} is missing from {LISTS}: {UPDATE}")


def stanzas(text: str) -> list[dict[str, str]]:
    """The paragraphs of a deb822 file as {field: value}; continuation lines keep their newline and space."""
    found = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.split("\n"):
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            found.append(fields)
    return found


def undo_debian(long: str) -> str:
    """A long description as plain text: paragraphs apart, wrapped lines joined, indented or bulleted lines kept."""
    lines: list[str] = []
    for raw in long.split("\n"):
        line = raw[1:] if raw.startswith(" ") else raw
        if line.strip() == ".":
            lines.append("")
        elif lines and lines[-1] and not line.startswith((" ", "\t", *BULLET)):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line.rstrip())
    return "\n".join(lines).strip().replace("\n\n\n", "\n\n")


def debian_pool() -> Pool:
    packages_text, packages_path = apt_list(PACKAGES)
    translation_text, translation_path = apt_list(TRANSLATION)
    by_md5 = {}
    by_name = {}
    for fields in stanzas(translation_text):
        if "Description-en" in fields:
            by_md5[fields.get("Description-md5")] = fields["Description-en"]
            by_name.setdefault(fields.get("Package"), fields["Description-en"])
    if not by_md5:
        raise SystemExit(f"text_corpora: {translation_path} holds no Description-en: {UPDATE}")
    rows, seen, unmatched, short = [], set(), 0, 0
    for fields in stanzas(packages_text):
        name, section = fields.get("Package"), fields.get("Section", "")
        if not name or not section or name in seen:
            continue
        seen.add(name)
        description = by_md5.get(fields.get("Description-md5")) or by_name.get(name)
        if description is None:
            unmatched += 1
            continue
        head, _, long = description.partition("\n")
        long = undo_debian(long)
        if len(long) < MIN_CHARS:
            short += 1
            continue
        for prefix in PREFIXES:
            section = section.removeprefix(prefix)
        rows.append((f"{head.strip()}\n{long}", section))
    release = LISTS / f"{RELEASE}_InRelease"
    lines = release.read_text(errors="replace").splitlines() if release.exists() else []
    date = next((line for line in lines if line.startswith("Date:")), "Date: ?")
    notes = [
        f"bookworm main amd64, InRelease {date.strip()}; {len(seen)} packages, {unmatched} without an English "
        f"description, {short} with a long description under {MIN_CHARS} characters (dropped)"
    ]
    built_from = [str(packages_path), str(translation_path)]
    return Pool("Debian bookworm main package descriptions (label: Section)", rows, built_from, notes)


def docstrings(path: Path) -> list[str]:
    """The docstrings of a .py file's module, classes and functions, cleaned (inspect.cleandoc); none if the
    file does not parse under this Python."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like in old sources
            tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError):
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [doc for node in ast.walk(tree) if isinstance(node, kinds) if (doc := ast.get_docstring(node))]


def docs_pool() -> Pool:
    site = Path(sysconfig.get_paths()["purelib"])
    distributions = importlib.metadata.packages_distributions()
    rows, built_from, files, short = [], [], 0, 0
    for package in DOCS_PACKAGES:
        root = site / package
        if not root.is_dir():
            raise SystemExit(f"text_corpora: {package} is not installed in {site}")
        dist = (distributions.get(package) or [package])[0]
        built_from.append(f"{dist} {importlib.metadata.version(dist)}: {root}")
        for path in sorted(root.rglob("*.py")):
            if SKIP_PARTS & set(path.relative_to(root).parts):
                continue
            files += 1
            for doc in docstrings(path):
                if len(doc.strip()) < MIN_CHARS:
                    short += 1
                else:
                    rows.append((doc.strip(), package))
    notes = [f"{files} .py files read with ast (none imported); {short} docstrings under {MIN_CHARS} chars dropped"]
    return Pool("Python docstrings of site-packages (label: top-level package)", rows, built_from, notes)
