"""Remote shards that came without an index, over http from a slow server, against the same shards on local disk:
`shards.index` reading them (shards indexed per second, by threads), and training on them (the first run, which
indexes them once, and a later one, which reads the cached index).

    python benchmarks/remote_index.py [--shards DIR] [--latency_ms 50] [--rate_mb 25] [--threads '[1,8]']
                                      [--workers 2] [--batch_size 128] [--size 224] [--mix_shards 32]
                                      [--repeats 3] [--json PATH]

The shards (a folder with a shardindex.json; by default the peers' 4,096 demo images drawn at 256 px, 16 shards
of 6.4 MB, written once under data/peers/ by benchmarks/peer_data.py) are served without their index by
benchmarks/slow_server.py in a process of its own: `--latency_ms` before each response, at most `--rate_mb` MB/s
per connection. Every spec is a brace pattern of the shards' names, so the local one and the remote one name the
same files, and neither reads an index.

Interleaved, R repeats of:
- `build_index` (what `python -m project.shards.index PATTERN --out FILE` runs, images verified) with each of
  `--threads`, from local disk and over http;
- one training epoch of the project's loader (`ImageShards`: augment light, `--workers` workers, batch B, the
  image size `--size`, `data.mix_shards` set the same for every row) from the local pattern, over http with no
  index cached (the run indexes the shards first: the time is from the data module's creation to the last
  batch), and over http again with the index cached.

Per row, medians: seconds, shards/s and MB/s (indexing), samples/s (training), and the ratio to local disk. It
checks that the training order over http is the same as from disk.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from slow_server import SlowServer  # benchmarks/slow_server.py, beside this script

from project.commands import run_command
from project.errors import UserError, run_main


def brace_pattern(base: str, names: list[str]) -> str:
    """`base/{a,b,...}`: the shards by name, in order (a brace list, which any name fits)."""
    return f"{base}/{{{','.join(names)}}}"


def index_once(spec: str, threads: int, out: Path) -> float:
    """Seconds for `build_index` to read every shard of `spec` and write its index to `out`."""
    from project.shards.index import build_index

    out.unlink(missing_ok=True)
    start = time.perf_counter()
    build_index([spec], out, verify_images=True, workers=threads)
    return time.perf_counter() - start


def epoch(spec: str, args: SimpleNamespace) -> tuple[float, list[int]]:
    """(samples/s, labels in training order) of one epoch from creating the data module to its last batch."""
    from project.tasks.image.data import ImageShards

    start, labels = time.perf_counter(), []
    data = ImageShards(
        root=None,
        train=spec,
        num_workers=args.workers,
        pin_memory=False,
        image_size=args.size,
        augment="light",
        batch_size=args.batch_size,
        mix_shards=args.mix_shards,
        classes=args.classes,
    )
    for batch in data.train_dataloader():
        labels.extend(batch.label.tolist())
    return len(labels) / (time.perf_counter() - start), labels


def measure(specs: dict[str, str], cache: Path, args: SimpleNamespace) -> dict:
    """Every row, interleaved; medians and ratios to local disk."""
    from project.data.workers import warm_forkserver
    from project.tasks import WORKER_MODULES

    warm_forkserver(WORKER_MODULES)  # its one-time imports are the training process's, not an epoch's
    runs: dict[str, list[float]] = {}
    orders: dict[str, list[int]] = {}
    for _ in range(args.repeats):
        for place in ("local disk", "http"):
            for threads in args.threads:
                row = f"index, {place}, {threads} thread{'s' if threads > 1 else ''}"
                seconds = index_once(specs[place], threads, cache / "index.json")
                runs.setdefault(row, []).append(seconds)
                print(f"  {row}: {seconds:.2f} s", flush=True)
        shutil.rmtree(cache / "lightning-shards", ignore_errors=True)  # the first run over http indexes
        for row, place in (
            ("train, local disk", "local disk"),
            ("train, http, first run (indexes)", "http"),
            ("train, http, index cached", "http"),
        ):
            rate, labels = epoch(specs[place], args)
            runs.setdefault(row, []).append(rate)
            orders.setdefault(row, labels)
            print(f"  {row}: {rate:,.0f} samples/s", flush=True)
    medians = {row: statistics.median(values) for row, values in runs.items()}
    ratios = {}
    for row, value in medians.items():
        kind, place, rest = (row.split(", ", 2) + [""])[:3]
        local = medians[", ".join(filter(None, (kind, "local disk", rest if kind == "index" else "")))]
        ratios[row] = local / value if kind == "index" else value / local  # above 1: faster than local disk
    same = all(order == orders["train, local disk"] for order in orders.values())
    return {"runs": runs, "medians": medians, "vs_local": ratios, "same_order": same}


def table(result: dict, args: SimpleNamespace, shards: int, size_mb: float) -> str:
    lines = ["| row | median | shards/s | MB/s | samples/s | ÷ local disk |", "|---|---|---|---|---|---|"]
    for row, median in result["medians"].items():
        ratio = f"{result['vs_local'][row]:.2f}"
        if row.startswith("index"):
            rate = f"{shards / median:.1f} | {shards * size_mb / median:.0f} | "
            lines.append(f"| {row} | {median:.2f} s | {rate} | {ratio} |")
        else:
            lines.append(f"| {row} | | | | {median:,.0f} | {ratio} |")
    lines.append(
        f"\n{shards} shards of {size_mb:.1f} MB; the server waits {args.latency_ms:g} ms before each response and "
        f"sends {args.rate_mb:g} MB/s per connection; training at {args.size} px, {args.workers} workers, batch "
        f"{args.batch_size}, data.mix_shards {args.mix_shards}; medians of {args.repeats}. The training order is "
        f"{'the same' if result['same_order'] else 'NOT the same'} over http and from disk."
    )
    return "\n".join(lines)


def options(
    *,
    shards: Path | None = None,
    photo_samples: int = 4096,
    latency_ms: float = 50.0,
    rate_mb: float = 25.0,
    threads: list[int] | None = None,
    workers: int = 2,
    batch_size: int = 128,
    size: int = 224,
    mix_shards: int = 32,
    repeats: int = 3,
    json: Path | None = None,
) -> SimpleNamespace:
    """Remote shards without an index, over http from a slow server, against local disk: indexing and training.

    Args:
        shards: a folder of shards with a shardindex.json (default: photo256); the server does not serve the index.
        photo_samples: images of the default set, if it is built.
        latency_ms: the server's wait before each response.
        rate_mb: the most MB/s the server sends a connection.
        threads: the shards read at once by `build_index` (its --workers), one row each (default [1, 8]).
        workers: DataLoader workers of the training rows.
        batch_size: samples per batch.
        size: the trained image size in px.
        mix_shards: data.mix_shards of every training row.
        repeats: runs per row (medians).
        json: write every run, median and ratio to this file.
    """
    threads = threads or [1, 8]
    if latency_ms < 0 or rate_mb <= 0:
        raise UserError("--latency_ms must be 0 or more and --rate_mb more than 0")
    if min(batch_size, size, repeats, photo_samples, mix_shards, *threads) < 1 or workers < 0:
        raise UserError(
            "--batch_size, --size, --repeats, --photo_samples, --mix_shards and --threads must be positive, "
            "--workers 0 or more"
        )
    if shards is not None and not (Path(shards) / "shardindex.json").is_file():
        raise UserError(f"--shards {shards}: no shardindex.json there")
    return SimpleNamespace(
        shards=shards and Path(shards),
        photo_samples=photo_samples,
        latency_ms=latency_ms,
        rate_mb=rate_mb,
        threads=threads,
        workers=workers,
        batch_size=batch_size,
        size=size,
        mix_shards=mix_shards,
        repeats=repeats,
        json=json,
    )


def main(argv: list[str] | None = None) -> dict:
    args = run_command(options, "benchmarks/remote_index.py", argv)
    from peer_data import photo_set

    from project.data.specs import resolve_shards
    from project.tasks.labels import index_classes

    folder = (args.shards or photo_set(samples=args.photo_samples).shards).resolve()
    index = resolve_shards(str(folder))
    args.classes = index_classes(index)  # the same classes for every row: the cached index records the labels seen
    names = [Path(shard.url).name for shard in index.shards]
    size_mb = statistics.mean(shard.filesize for shard in index.shards) / 1e6
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="remote-index-") as work:
        served, cache = Path(work) / "served", Path(work) / "cache"
        served.mkdir()
        for name in names:  # the shards alone: no index beside them
            (served / name).symlink_to(folder / name)
        os.environ["XDG_CACHE_HOME"] = str(cache)  # the cached indexes go here, removed with it
        server = SlowServer(served, args.latency_ms / 1e3, args.rate_mb * 1e6)
        try:
            specs = {"local disk": brace_pattern(str(folder), names), "http": brace_pattern(server.url, names)}
            result = measure(specs, cache, args)
        finally:
            server.close()
    result["machine"] = {"cores": os.cpu_count(), "load_before": load, "load_after": os.getloadavg()}
    print(table(result, args, len(names), size_mb))
    print(
        f"{os.cpu_count()} cores; load average (1, 5, 15 min) {', '.join(f'{v:.2f}' for v in load)} before, "
        f"{', '.join(f'{v:.2f}' for v in result['machine']['load_after'])} after"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    run_main(main)
