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
  docstrings under 80 characters are dropped. Both pools are read by benchmarks/text_pools.py.

Duplicates: of the texts that occur more than once, one copy is kept when all copies share a label, and none
when the copies disagree (such a text cannot tell its class). Class rule: a set of n texts keeps the classes
with at least max(20, 0.5% of n) texts. A set is drawn from one seeded shuffle of the pool: its first n texts
are taken, the classes under the rule dropped, and the set topped up from further along the shuffle with texts
of the kept classes (which only grows them). So the smaller sets are (nearly) subsets of the larger ones. A tune
set is drawn from what the 2k and 10k sets left, of their classes only, so is disjoint from them; debian-50k
is drawn apart from debian-tune-5k while the pool allows, and overlaps it otherwise (info.json's notes say so).
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Literal

from text_pools import Pool, debian_pool, docs_pool  # benchmarks/text_pools.py, beside this script

from project.commands import run_command

MIN_CLASS, MIN_SHARE = 20, 0.005  # a class stays in a set of n texts with at least max(20, 0.5% of n)
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


def text_corpora(*, out: Path, seed: int = 0, only: Literal["debian", "docs"] | None = None) -> None:
    """Real-text classification corpora for the text benchmarks, built offline from what is on this machine.

    Args:
        out: folder the sets are written under.
        seed: the seed of the shuffle the sets are drawn from.
        only: build one source's sets.
    """
    for kind in [only] if only else sorted(SETS):
        build(kind, Path(out), seed)


def main(argv: list[str] | None = None) -> None:
    run_command(text_corpora, "benchmarks/text_corpora.py", argv)


if __name__ == "__main__":
    main()
