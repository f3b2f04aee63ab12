"""How well `prepare --dedup near` finds planted near duplicates: precision and recall over pairs.

    python benchmarks/dedup_quality.py [--originals N] [--similar N] [--seed S] [--json true]

The planted set (tests/planted.py): N originals (demo shapes, 160 px JPEGs), each with an exact copy, a
re-encode at JPEG quality 60-95, a resize to 50-90% and a crop of up to 5%; plus N distinct images of the same
classes and shape types, duplicates of nothing. A pair of samples is found when both land in one group, and
right when both come from one original. Printed for several --near-distance thresholds (the default marked),
with the thumbnail check and without it (pHash alone), and the time the hashing and the search took.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/planted.py

from project.commands import run_command  # noqa: E402
from project.shards.dedup import DEFAULT_NEAR_DISTANCE, Hasher  # noqa: E402
from project.shards.matching import groups  # noqa: E402
from tests.planted import VARIANTS, pair_scores, planted_images  # noqa: E402

DISTANCES = (4, 8, DEFAULT_NEAR_DISTANCE, 16)


def options(*, originals: int = 500, similar: int = 500, seed: int = 0, json: bool = False) -> SimpleNamespace:
    """How well `prepare --dedup near` finds planted near duplicates: precision and recall over pairs.

    Args:
        originals: planted originals, each with four copies.
        similar: distinct images of the same classes and shapes, duplicates of nothing.
        seed: draws the planted set.
        json: print one JSON object.
    """
    return SimpleNamespace(originals=originals, similar=similar, seed=seed, json=json)


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/dedup_quality.py", argv)
    with tempfile.TemporaryDirectory() as scratch:
        truth = planted_images(scratch, args.originals, args.similar, args.seed)
        names = sorted(truth)
        start = time.perf_counter()
        hasher = Hasher("near", text=False)
        for name in names:
            hasher.add((Path(scratch) / name).read_bytes())
        hashes = hasher.result()
        hashing = time.perf_counter() - start
    expected = [truth[name] for name in names]
    blind = Hasher("near", text=False).result()  # pHash alone: every thumbnail the same
    blind.digest, blind.size, blind.phash, blind.phash_ok = hashes.digest, hashes.size, hashes.phash, hashes.phash_ok
    blind.thumb = np.zeros_like(hashes.thumb)
    rows = []
    for distance in DISTANCES:
        for check, source in (("phash + thumbnail", hashes), ("phash alone", blind)):
            start = time.perf_counter()
            labels = groups(source, distance)
            precision, recall = pair_scores(labels.tolist(), expected)
            rows.append(
                {
                    "near_distance": distance,
                    "check": check,
                    "precision": round(precision, 4),
                    "recall": round(recall, 4),
                    "search_s": round(time.perf_counter() - start, 3),
                }
            )
    labels = groups(hashes).tolist()  # at the default: which kinds of copy join their original's group
    position = {name: i for i, name in enumerate(names)}
    found_by_kind = {
        kind: float(
            np.mean(
                [
                    labels[position[name]] == labels[position[truth[name]]]
                    for name in names
                    if name.endswith(f"_{kind}.jpg")
                ]
            )
        )
        for kind in VARIANTS
    }
    result = {
        "samples": len(names),
        "originals": args.originals,
        "similar": args.similar,
        "hash_us_per_sample": round(hashing / len(names) * 1e6),
        "rows": rows,
        "copies_found_by_kind": found_by_kind,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{len(names)} samples ({args.originals} originals x 5, {args.similar} similar), hashed in "
        f"{result['hash_us_per_sample']} us a sample (one process)"
    )
    print("| --near-distance | check | precision | recall |\n|---|---|---|---|")
    for row in rows:
        mark = " (default)" if row["near_distance"] == DEFAULT_NEAR_DISTANCE else ""
        print(f"| {row['near_distance']}{mark} | {row['check']} | {row['precision']:.4f} | {row['recall']:.4f} |")
    found = ", ".join(f"{kind} {share:.3f}" for kind, share in found_by_kind.items())
    print(f"copies found at the default, by kind: {found}")


if __name__ == "__main__":
    main()
