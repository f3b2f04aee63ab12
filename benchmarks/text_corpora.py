"""Real-text classification corpora for the text benchmarks, built offline from what is on this machine.

    python benchmarks/text_corpora.py --out DIR [--seed 0] [--only debian|docs]

Each set is a folder DIR/<name>/ holding `texts.csv` (UTF-8, header `text,label`, written by Python's csv
module) and `info.json` ({source, texts, classes, seed, built_from, notes}); `python -m project.shards.prepare
DIR/<name>/texts.csv --text --out SHARDS` reads it. Nothing is downloaded here or at training time: the Debian
sets need only apt's package lists, fetched once by `apt-get update -o Acquire::Languages=en` (as root).

- debian-2k, debian-10k, debian-50k (as many as the pool holds) and debian-tune-5k: Debian bookworm main
  package descriptions (the release's Packages list, not -updates or -security, joined with Translation-en on
  package name and Description-md5); text = the short description, a newline, then the long description with
  Debian's formatting undone (the leading space dropped, " ." lines made blank lines, wrapped lines joined;
  indented and bulleted lines kept on their own lines); label = the package's Section less any contrib/,
  non-free/ or non-free-firmware/ prefix. Descriptions whose long part is under 80 characters are dropped.
- docs-2k, docs-10k, docs-tune-2k and docs-tune-10k (which holds docs-tune-2k): docstrings of modules, classes
  and functions of DOCS_PACKAGES in this interpreter's site-packages, read from the .py sources with `ast`
  (nothing is imported; vendored copies of other projects are skipped); label = the top-level package;
  docstrings under 80 characters are dropped.

Duplicates: of the texts that occur more than once, one copy is kept when all copies share a label, and none
when the copies disagree (such a text cannot tell its class). Class rule: a set of n texts keeps the classes
with at least max(20, 0.5% of n) texts. A set is drawn from one seeded shuffle of the pool: its first n texts
are taken, the classes under the rule dropped, and the set topped up from further along the shuffle with texts
of the kept classes (which only grows them). So the smaller sets are (nearly) subsets of the larger ones. A tune
set is drawn from what the 2k and 10k sets left, of their classes only, so is disjoint from them; debian-50k
is drawn apart from debian-tune-5k while the pool allows, and overlaps it otherwise (info.json's notes say so).
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib.metadata
import json
import random
import statistics
import subprocess
import sysconfig
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

LISTS = Path("/var/lib/apt/lists")
RELEASE = "deb.debian.org_debian_dists_bookworm"
PACKAGES = LISTS / f"{RELEASE}_main_binary-amd64_Packages"
TRANSLATION = LISTS / f"{RELEASE}_main_i18n_Translation-en"
UPDATE = "run `apt-get update -o Acquire::Languages=en` (as root)"
MIN_CHARS = 80  # the least long description (Debian) or docstring (docs), in characters
MIN_CLASS, MIN_SHARE = 20, 0.005  # a class stays in a set of n texts with at least max(20, 0.5% of n)
PREFIXES = ("contrib/", "non-free/", "non-free-firmware/")
BULLET = ("*", "-", "+", "o ", "#")
DOCS_PACKAGES = (
    "numpy", "scipy", "pandas", "sklearn", "matplotlib", "sympy", "networkx", "torch", "transformers",
    "torchmetrics", "ray", "mlflow", "sqlalchemy", "fontTools", "pygments",
)  # fmt: skip
SKIP_PARTS = {"_vendor", "vendor", "_vendored", "vendored", "externals", "_externals", "extern", "_extern"}
SKIP_PARTS |= {"array_api_compat", "array_api_extra", "__pycache__"}  # copies of other projects' code
SETS = {  # name, texts; a tune set names the sets (drawn before it) it is disjoint from and takes its classes from
    "debian": (
        ("debian-2k", 2000, ()),
        ("debian-10k", 10000, ()),
        ("debian-tune-5k", 5000, ("debian-2k", "debian-10k")),
        ("debian-50k", 50000, ()),
    ),
    "docs": (
        ("docs-2k", 2000, ()),
        ("docs-10k", 10000, ()),
        ("docs-tune-2k", 2000, ("docs-2k", "docs-10k")),
        ("docs-tune-10k", 10000, ("docs-2k", "docs-10k")),  # as large as a 10k report set; holds docs-tune-2k
    ),
}


Drawn = tuple[list[int], int, list[str]]  # the pool's rows taken, the class floor, the classes dropped


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


def draw(pool: Pool, order: list[int], size: int, taken: set[int], allowed: set[str] | None = None) -> Drawn:
    """`size` texts (or all there are) along `order`, outside `taken`, of the `allowed` classes the rule keeps."""
    candidates = [i for i in order if i not in taken and (allowed is None or pool.rows[i][1] in allowed)]
    first = candidates[:size]
    floor = max(MIN_CLASS, round(MIN_SHARE * len(first)))
    counts = Counter(pool.rows[i][1] for i in first)
    kept = {label for label, count in counts.items() if count >= floor}
    chosen = [i for i in candidates if pool.rows[i][1] in kept][:size]
    return chosen, floor, sorted(set(counts) - kept)


def write_set(out: Path, name: str, pool: Pool, *, chosen: list[int], seed: int, notes: list[str]) -> str:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    rows = [pool.rows[i] for i in chosen]
    with open(folder / "texts.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    classes = Counter(label for _, label in rows)
    info = {
        "source": pool.source,
        "texts": len(rows),
        "classes": dict(sorted(classes.items(), key=lambda item: (-item[1], item[0]))),
        "seed": seed,
        "built_from": pool.built_from,
        "notes": "; ".join(pool.notes + notes),
    }
    (folder / "info.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    top, count = classes.most_common(1)[0]
    median = statistics.median(len(text) for text, _ in rows)
    return (
        f"{name}: {len(rows)} texts, {len(classes)} classes, majority {count / len(rows):.1%} ({top}), "
        f"median {median:.0f} chars -> {folder}"
    )


def build(kind: str, out: Path, seed: int) -> None:
    start = time.perf_counter()
    pool = debian_pool() if kind == "debian" else docs_pool()
    order = list(range(len(pool.rows)))
    random.Random(seed).shuffle(order)
    drawn: dict[str, tuple[list[int], list[str]]] = {}
    for name, size, apart in SETS[kind]:
        notes = []
        if apart:  # a tune set: none of their texts, only their classes
            taken = set().union(*(drawn[other][0] for other in apart))
            chosen, floor, dropped = draw(pool, order, size, taken, {pool.rows[i][1] for i in taken})
            notes.append(f"disjoint from {' and '.join(apart)}, and of their classes only")
        else:  # apart from the tune sets drawn so far, if the pool allows
            tunes = set().union(
                *(drawn[other][0] for other, _, its_apart in SETS[kind] if its_apart and other in drawn)
            )
            chosen, floor, dropped = draw(pool, order, size, tunes)
            if len(chosen) < size and tunes:
                chosen, floor, dropped = draw(pool, order, size, set())
        notes.append(
            f"{len(pool.rows)} texts in the pool; drawn with seed {seed}; classes kept: at least {floor} texts "
            f"(max({MIN_CLASS}, {MIN_SHARE:.1%} of the set)); dropped: {', '.join(dropped) or 'none'}"
        )
        if len(chosen) < size:
            notes.append(f"the pool holds only {len(chosen)} texts of the kept classes, not {size}")
        drawn[name] = chosen, notes
    tunes = [name for name, _, apart in SETS[kind] if apart]
    for tune in tunes:
        for other in [name for name in drawn if name not in tunes]:
            if shared := len(set(drawn[tune][0]) & set(drawn[other][0])):
                drawn[tune][1].append(f"shares {shared} texts with {other} (the pool is too small to avoid it)")
                drawn[other][1].append(f"shares {shared} texts with {tune} (the pool is too small to avoid it)")
            else:
                drawn[other][1].append(f"disjoint from {tune}")
    lines = [
        write_set(out, name, pool, chosen=chosen, seed=seed, notes=notes) for name, (chosen, notes) in drawn.items()
    ]
    print(f"{kind}: {pool.notes[-1]}; built in {time.perf_counter() - start:.0f} s")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder the sets are written under")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(SETS), help="build one source's sets")
    args = parser.parse_args()
    for kind in [args.only] if args.only else sorted(SETS):
        build(kind, args.out, args.seed)


if __name__ == "__main__":
    main()
