"""How well each loader shuffles: its training order against a full random permutation of the same samples.

    python benchmarks/shuffle_quality.py [--workers 2] [--batch-size 128] [--loaders ...]
                                         [--buffers 1000,2000,5000,10000,20000] [--json PATH]

One epoch of each loader of benchmarks/peers.py (each at its own default shuffle: the project's
shuffle_buffer 1000, webdataset's .shuffle(1000) with shardshuffle=100, litdata's and mosaicml-streaming's
shuffle=True), read from the keys of its batches, on the demo's class-mixed shards and on the same samples
sorted by label (the hard case). Three measures:

- entropy ratio: the mean over batches of the entropy of a batch's label histogram, divided by the same for
  a full random permutation of the same labels (1.0 is as good as a full shuffle; the target is >= 0.98);
- displacement ratio: the mean of |position in the stream - stored position|, divided by the same for a full
  random permutation (about 1 for a full shuffle, 0 for the stored order);
- Kendall's tau between the stream's order and the stored order (1 for the stored order, about 0 for a full
  shuffle).

Then the project's loader on the sorted set with larger shuffle buffers, up to the first that reaches 0.98:
with the same workers, and if none does, with one worker.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from project.bench.shuffle import TRIALS, entropy_ratio

TARGET = 0.98


def displacement_ratio(positions: Sequence[int], total: int, seed: int = 0) -> float:
    """Mean |stream position - stored position| of the stream's samples (their stored positions in stream
    order, out of `total` stored samples) over the same for the first as many of a full random permutation."""
    positions = np.asarray(positions, dtype=np.int64)
    stream = np.arange(len(positions))
    rng = np.random.default_rng(seed)
    reference = np.mean([np.abs(stream - rng.permutation(total)[: len(positions)]).mean() for _ in range(TRIALS)])
    return float(np.abs(stream - positions).mean() / reference) if reference > 0 else 0.0


def kendall_tau(positions: Sequence[int]) -> float:
    """Kendall's tau between stream order and stored order (distinct positions): scipy's when installed, else
    1 - 4 × inversions / (n (n - 1)), the inversions counted by merge sort in O(n log n)."""
    if len(positions) < 2:
        return 1.0
    try:
        from scipy.stats import kendalltau
    except ImportError:
        inversions = count_inversions(list(positions))[1]
        return 1 - 4 * inversions / (len(positions) * (len(positions) - 1))
    return float(kendalltau(np.arange(len(positions)), np.asarray(positions)).statistic)


def count_inversions(values: list[int]) -> tuple[list[int], int]:
    """(sorted values, number of pairs i < j with values[i] > values[j]), by merge sort."""
    if len(values) < 2:
        return values, 0
    middle = len(values) // 2
    (left, a), (right, b) = count_inversions(values[:middle]), count_inversions(values[middle:])
    merged, inversions, i, j = [], a + b, 0, 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            inversions += len(left) - i
            j += 1
    return merged + left[i:] + right[j:], inversions


def quality(order: Sequence[str], stored: Sequence[str], labels: dict[str, int], batch_size: int) -> dict:
    """The three measures of a stream of keys, against the set's stored order of keys and their labels."""
    where = {key: position for position, key in enumerate(stored)}
    positions = [where[key] for key in order]
    return {
        "samples": len(order),
        "entropy_ratio": entropy_ratio([labels[key] for key in order], batch_size),
        "displacement_ratio": displacement_ratio(positions, len(stored)),
        "kendall_tau": kendall_tau(positions),
    }


def loader_orders(data, args: argparse.Namespace, loaders: Sequence[str], buffer: int = 1000) -> dict[str, dict]:
    """{loader: one epoch's keys in order, or {"note": ...}} (each epoch in a fresh process)."""
    from peer_data import ensure_format
    from peers import run_one

    orders = {}
    for loader in loaders:
        ensure_format(data, loader)
        result = run_one(loader, data, args.size, args, shuffle_buffer=buffer, isolated=not args.in_process)
        if "keys" in result:
            orders[loader] = result["keys"]
        else:
            orders[loader] = {"note": "not installed" if "missing" in result else f"failed: {result['error']}"}
    return orders


def rows_for(data, args: argparse.Namespace, loaders: Sequence[str], buffer: int = 1000) -> dict[str, dict]:
    stored, labels = data.labels()
    rows = {}
    for loader, order in loader_orders(data, args, loaders, buffer).items():
        rows[loader] = order if isinstance(order, dict) else quality(order, stored, labels, args.batch_size)
    return rows


def search_buffer(data, args: argparse.Namespace, buffers: Sequence[int]) -> list[dict]:
    """The project's measures on `data` with each shuffle buffer, until one reaches the target: with the
    bench's workers, then (if none did) with one worker, since each worker shuffles only its own run of the
    epoch's shards and so sees only their classes."""
    rows = []
    for workers in dict.fromkeys([args.workers, 1]):
        for buffer in buffers:
            row = rows_for(data, argparse.Namespace(**{**vars(args), "workers": workers}), ["project"], buffer)
            rows.append({"workers": workers, "shuffle_buffer": buffer, **row["project"]})
            if row["project"]["entropy_ratio"] >= TARGET:
                return rows
    return rows


def table(results: dict) -> str:
    lines = ["| loader | set | entropy ratio | displacement ratio | Kendall τ |", "|---|---|---|---|---|"]
    for name, rows in results["sets"].items():
        for loader, row in rows.items():
            if "note" in row:
                lines.append(f"| {loader} | {name} | {row['note']} | | |")
            else:
                lines.append(
                    f"| {loader} | {name} | {row['entropy_ratio']:.3f} | {row['displacement_ratio']:.3f} | "
                    f"{row['kendall_tau']:.3f} |"
                )
    lines += [
        "",
        "| project, sorted set: workers | shuffle_buffer | entropy ratio | displacement ratio | Kendall τ |",
        "|---|---|---|---|---|",
    ]
    for row in results["buffers"]:
        lines.append(
            f"| {row['workers']} | {row['shuffle_buffer']} | {row['entropy_ratio']:.3f} | "
            f"{row['displacement_ratio']:.3f} | {row['kendall_tau']:.3f} |"
        )
    needed = results["buffer_needed"]
    found = f"shuffle_buffer {needed['shuffle_buffer']} with {needed['workers']} worker(s)" if needed else "none tried"
    lines.append(
        f"\nreaching {TARGET} on the sorted set: {found}; {results['workers']} workers above, batch "
        f"{results['batch_size']}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from peer_data import demo_set, sorted_set
    from peer_loaders import LOADERS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--buffers", default="1000,2000,5000,10000,20000", help="project shuffle_buffer sizes to try")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--in-process", action="store_true", help="run the epochs in this process (tests)")
    args = parser.parse_args(argv)
    args.size = 32
    loaders = [name for name in args.loaders.split(",") if name]
    demo = demo_set()
    sorted_demo = sorted_set(demo)
    sets = {data.name: rows_for(data, args, loaders) for data in (demo, sorted_demo)}
    results = {"workers": args.workers, "batch_size": args.batch_size, "target": TARGET, "sets": sets}
    results["buffers"] = search_buffer(sorted_demo, args, [int(value) for value in args.buffers.split(",")])
    found = [row for row in results["buffers"] if row["entropy_ratio"] >= TARGET]
    results["buffer_needed"] = {key: found[0][key] for key in ("workers", "shuffle_buffer")} if found else None
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
