"""How well each loader shuffles: its training order against a full random permutation of the same samples.

    python benchmarks/shuffle_quality.py [--workers 2] [--batch_size 128] [--loaders ...] [--repeats 5]
                                         [--json PATH]

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

Then the project's loader on the sorted set at its default buffer, reading one shard after another
(data.mix_shards 1) and interleaving groups of shards (its default, 32), with 1, 2 and 4 workers and with
2 DDP ranks of 2 workers (that order from the stream itself, with a task that decodes nothing); and the
throughput cost of interleaving: epochs on the class-mixed set with mix_shards 1 and 32 taking turns.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np

from project.bench.shuffle import TRIALS, entropy_ratio
from project.commands import run_command
from project.errors import run_main

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


def loader_orders(data, args: SimpleNamespace, loaders: Sequence[str], buffer: int = 1000) -> dict[str, dict]:
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


def rows_for(data, args: SimpleNamespace, loaders: Sequence[str], buffer: int = 1000) -> dict[str, dict]:
    stored, labels = data.labels()
    rows = {}
    for loader, order in loader_orders(data, args, loaders, buffer).items():
        rows[loader] = order if isinstance(order, dict) else quality(order, stored, labels, args.batch_size)
    return rows


def project_rows(data, args: SimpleNamespace, workers: int, mix_shards: int) -> dict:
    """The project's loader on `data`: one epoch with `workers` and `mix_shards`, its measures and rate."""
    from peers import run_one

    stored, labels = data.labels()
    run_args = SimpleNamespace(**{**vars(args), "workers": workers})
    result = run_one("project", data, args.size, run_args, isolated=not args.in_process, mix_shards=mix_shards)
    if "keys" not in result:
        return {"note": f"failed: {result.get('error')}"}
    return {**quality(result["keys"], stored, labels, args.batch_size), "rate": result["rate"]}


def ddp_order(data, args: SimpleNamespace, world_size: int, workers: int, mix_shards: int) -> tuple[list, float]:
    """(the global order of a DDP epoch: step by step, rank 0's batch then rank 1's ..., the mean over ranks of
    the entropy ratio of each rank's batches), from the project's stream with a task that decodes nothing: the
    order of keys is the plan's and the shuffle's, whatever the task decodes."""
    from project.data.batch import Batch
    from project.data.specs import resolve_shards
    from project.data.stream import ShardStream
    from project.data.task import Task

    class Keys(Task):
        def decode(self, sample: dict, stage: str) -> str:
            return sample["__key__"]

        def collate(self, examples: list, stage: str) -> Batch:
            return Batch()

    _, labels = data.labels()
    shards = resolve_shards(str(data.shards)).shards
    ranks, ratios = [], []
    for rank in range(world_size):
        stream = ShardStream(
            shards=shards,
            task=Keys(),
            stage="train",
            batch_size=args.batch_size,
            num_workers=workers,
            mix_shards=mix_shards,
        )
        stream.set_topology(world_size, rank)
        per_worker = []
        for worker in range(workers):
            info = SimpleNamespace(id=worker, num_workers=workers)
            with mock.patch("project.data.stream.get_worker_info", return_value=info):
                per_worker.append([batch.keys for batch in stream])
        batches = [batch for step in itertools.zip_longest(*per_worker) for batch in step if batch is not None]
        ranks.append(batches)
        ratios.append(entropy_ratio([labels[key] for batch in batches for key in batch], args.batch_size))
    order = [key for step in zip(*ranks, strict=True) for batch in step for key in batch]
    return order, float(np.mean(ratios))


def mixing_rows(data, args: SimpleNamespace) -> list[dict]:
    """The project on the sorted set, one shard after another (mix_shards 1) and at its default (32), with 1, 2
    and 4 workers, and 2 DDP ranks of 2 workers."""
    stored, labels = data.labels()
    rows = []
    for workers in (1, 2, 4):
        for mix in (1, 32):
            rows.append(
                {"topology": f"{workers} worker(s)", "mix_shards": mix, **project_rows(data, args, workers, mix)}
            )
    for mix in (1, 32):
        order, ratio = ddp_order(data, args, 2, 2, mix)
        row = {**quality(order, stored, labels, args.batch_size), "entropy_ratio": ratio}
        rows.append({"topology": "2 ranks × 2 workers", "mix_shards": mix, **row})
    return rows


def mixing_cost(data, args: SimpleNamespace) -> dict:
    """Samples/s of the project's loader with mix_shards 1 and 32, epochs taking turns, `args.repeats` each."""
    from peers import run_one

    rates: dict[int, list[float]] = {1: [], 32: []}
    for _ in range(args.repeats):
        for mix in rates:
            result = run_one("project", data, args.size, args, isolated=not args.in_process, mix_shards=mix)
            rates[mix].append(result.get("rate", float("nan")))
    medians = {mix: float(np.median(values)) for mix, values in rates.items()}
    return {"set": data.name, "rates": rates, "medians": medians, "ratio": medians[32] / medians[1]}


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
        "| project, sorted set | mix_shards | entropy ratio | displacement ratio | Kendall τ | samples/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["mixing"]:
        if "note" in row:
            lines.append(f"| {row['topology']} | {row['mix_shards']} | {row['note']} | | | |")
            continue
        rate = f"{row['rate']:.0f}" if "rate" in row else "(plan only)"
        lines.append(
            f"| {row['topology']} | {row['mix_shards']} | {row['entropy_ratio']:.3f} | "
            f"{row['displacement_ratio']:.3f} | {row['kendall_tau']:.3f} | {rate} |"
        )
    cost = results.get("cost")
    if cost:
        lines.append(
            f"\nthroughput on {cost['set']}, {results['workers']} workers, median of {len(cost['rates'][1])} epochs "
            f"each: mix_shards 32 {cost['medians'][32]:.0f} samples/s, 1 {cost['medians'][1]:.0f}: "
            f"ratio {cost['ratio']:.3f}."
        )
    return "\n".join(lines)


def options(
    *,
    workers: int = 2,
    batch_size: int = 128,
    loaders: str | None = None,
    repeats: int = 5,
    json: str | None = None,
    in_process: bool = False,
) -> SimpleNamespace:
    """How well each loader shuffles: its training order against a full random permutation of the same samples.

    Args:
        workers: DataLoader workers of every loader.
        batch_size: samples per batch.
        loaders: comma-separated loaders of benchmarks/peers.py (default: all of them).
        repeats: epochs of each mix_shards for the throughput cost.
        json: write the results to this file.
        in_process: run the epochs in this process (tests).
    """
    from peer_names import LOADERS

    names = [name for name in (loaders or ",".join(LOADERS)).split(",") if name]
    given = {"workers": workers, "batch_size": batch_size, "repeats": repeats, "json": json}
    return SimpleNamespace(**given, loaders=names, in_process=in_process, size=32)


def main(argv: list[str] | None = None) -> dict:
    from peer_data import demo_set, sorted_set

    args = run_command(options, "benchmarks/shuffle_quality.py", argv)
    loaders = args.loaders
    demo = demo_set()
    sorted_demo = sorted_set(demo)
    sets = {data.name: rows_for(data, args, loaders) for data in (demo, sorted_demo)}
    results = {"workers": args.workers, "batch_size": args.batch_size, "target": TARGET, "sets": sets}
    results["mixing"] = mixing_rows(sorted_demo, args)
    results["cost"] = mixing_cost(demo, args) if args.repeats > 0 else None
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    run_main(main)
