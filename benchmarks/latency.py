"""The train loader reading its shards over http from a slow server, against local disk; webdataset's both ways.

    python benchmarks/latency.py [--shards DIR] [--latency_ms 50] [--rate_mb 25] [--workers 2]
                                 [--batch_size 128] [--size 224] [--repeats 3] [--copies 1] [--json PATH]

The shards (a folder with a shardindex.json; by default the peers' 4,096 demo images drawn at 256 px, 16
shards of 6.4 MB, written once under data/peers/ by benchmarks/peer_data.py) are served by a threaded
http.server in a process of its own, which waits `--latency_ms` before each response and sends each body no
faster than `--rate_mb` MB/s per connection (Range requests answered, as HTTPStream resumes with them). Both
indexes list the shards `--copies` times (a longer epoch of the same bytes); the server's one is read from
http://127.0.0.1:PORT/shardindex.json.

Interleaved, R repeats of one full training epoch each of:
- the project's train loader (`ImageShards` at its defaults: augment light, shuffle buffer 1000, batch B,
  N workers, `read_ahead_mb` 32; the image size `--size`) reading local disk, and reading over http;
- the same over http with `read_ahead_mb=0` (each worker opens a shard when it needs it, as before);
- webdataset's own pipeline (`WebDataset(urls, shardshuffle=100).shuffle(1000)`, the naive torchvision
  decode and `light` augmentation in a map, `.batched(B)`, `WebLoader`, N workers: project/bench/images.py)
  on the local shards and on the same urls (which it fetches with curl).

Per row, medians: samples/s from iter() to the last batch, the seconds to the first batch (each worker first
fills its shuffle buffer), samples/s from the first batch to the last, and each rate's ratio to the same
loader's from local disk. It checks that the project's training order is the same over http as from disk.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from slow_server import SlowServer  # benchmarks/slow_server.py, beside this script

from project.commands import run_command
from project.errors import UserError, run_main

# -- the loaders, measured -----------------------------------------------------------------------------

ROWS = {  # row: (loader, where, extra settings)
    "project, local disk": ("project", "local", {}),
    "project, http": ("project", "http", {}),
    "project, http, read_ahead_mb=0": ("project", "http", {"read_ahead_mb": 0}),
    "webdataset, local disk": ("webdataset", "local", {}),
    "webdataset, http (curl)": ("webdataset", "http", {}),
}


def indexes(folder: Path, served: Path, url: str, copies: int) -> dict[str, str]:
    """A local index of the shards and one of their urls on the server (served from `served`, which links to
    them), each listing them `copies` times: a longer epoch from the same bytes."""
    from project.data.shard_index import Shard, write_index
    from project.data.specs import resolve_shards

    index = resolve_shards(str(folder))
    remote = []
    for shard in index.shards:
        name = Path(shard.url).name
        (served / name).symlink_to(Path(shard.url).resolve())
        remote.append(Shard(f"{url}/{name}", shard.nsamples, shard.filesize))
    local = write_index(served / "local.json", index.shards * copies, name="train", extra=index.extra)
    write_index(served / "shardindex.json", remote * copies, name="train", extra=index.extra)
    return {"local": str(local), "http": f"{url}/shardindex.json"}


def epoch(loader: str, spec: str, args: SimpleNamespace, extra: dict) -> dict:
    """One training epoch of `loader` over `spec`: samples/s from iter() to the last batch, the seconds to the
    first batch, samples/s from the first batch to the last (the rate once the shuffle buffers are full),
    and the project's labels in training order."""
    from project.bench.images import NaiveSample, make_datamodule, webdataset_pipeline
    from project.data.specs import resolve_shards

    settings = {"image_size": args.size, "augment": "light", "batch_size": args.batch_size, **extra}
    if loader == "project" and args.mix_shards is not None:
        settings.setdefault("mix_shards", args.mix_shards)
    if loader == "project":
        batches = make_datamodule(spec, args.workers, settings).train_dataloader()  # type: ignore[arg-type]
    else:
        urls = [shard.url for shard in resolve_shards(spec).shards]
        batches = webdataset_pipeline(urls, NaiveSample("light", args.size), args.batch_size, args.workers)
    labels, first, start = [], 0, time.perf_counter()
    first_at = start
    for batch in batches:
        if not labels:
            first, first_at = len(batch.label if loader == "project" else batch[1]), time.perf_counter()
        labels.extend((batch.label if loader == "project" else batch[1]).tolist())
    seconds = time.perf_counter() - start
    steady = (len(labels) - first) / max(1e-9, time.perf_counter() - first_at)
    return {"rate": len(labels) / seconds, "first_batch_s": first_at - start, "steady": steady, "labels": labels}


def measure(specs: dict[str, str], server: SlowServer, args: SimpleNamespace) -> dict:
    """Every row's epochs, interleaved; medians, ratios to the local rate, whether the project's orders agree."""
    from project.data.workers import warm_forkserver
    from project.tasks import WORKER_MODULES

    warm_forkserver(WORKER_MODULES)  # its one-time imports are the training process's, not an epoch's
    rows = {row: settings for row, settings in ROWS.items() if settings[0] in args.loaders}
    runs: dict[str, list[dict]] = {row: [] for row in rows}
    orders: dict[str, list] = {}
    cpu = server.cpu_seconds()
    for _ in range(args.repeats):
        for row, (loader, place, extra) in rows.items():
            result = epoch(loader, specs[place], args, extra)
            orders.setdefault(row, result.pop("labels"))
            runs[row].append(result)
            print(f"  {row}: {result['rate']:,.0f} samples/s, first batch {result['first_batch_s']:.2f} s", flush=True)
    medians = {
        row: {key: statistics.median(r[key] for r in results) for key in results[0]} for row, results in runs.items()
    }
    local = {loader: medians[row] for row, (loader, place, _) in rows.items() if place == "local"}
    for row, (loader, _, _) in rows.items():
        medians[row]["vs_local"] = medians[row]["rate"] / local[loader]["rate"]
        medians[row]["steady_vs_local"] = medians[row]["steady"] / local[loader]["steady"]
    project = [order for row, order in orders.items() if row.startswith("project")]
    same = all(order == project[0] for order in project)
    return {"runs": runs, "medians": medians, "same_order": same, "server_cpu_s": server.cpu_seconds() - cpu}


def table(result: dict, args: SimpleNamespace, samples: int, shards: int, size_mb: float) -> str:
    lines = [
        "| loader | reads from | samples/s | ÷ local | first batch | samples/s after it | ÷ local |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, median in result["medians"].items():
        name, _, source = row.partition(", ")
        lines.append(
            f"| {name} | {source} | {median['rate']:,.0f} | {median['vs_local']:.2f} | "
            f"{median['first_batch_s']:.2f} s | {median['steady']:,.0f} | {median['steady_vs_local']:.2f} |"
        )
    epoch_samples = samples * args.copies
    lines.append(
        f"\n{samples:,} samples in {shards} shards of {size_mb:.1f} MB"
        + (f", listed {args.copies} times ({epoch_samples:,} samples an epoch)" if args.copies > 1 else "")
        + f"; trained at {args.size} px, {args.workers} workers, batch {args.batch_size}; the server waits "
        f"{args.latency_ms:g} ms before each response and sends {args.rate_mb:g} MB/s per connection; medians of "
        f"{args.repeats} epochs. The project's training order is "
        f"{'the same' if result['same_order'] else 'NOT the same'} over http and from disk."
    )
    return "\n".join(lines)


def options(
    *,
    shards: Path | None = None,
    photo_samples: int = 4096,
    latency_ms: float = 50.0,
    rate_mb: float = 25.0,
    workers: int = 2,
    batch_size: int = 128,
    size: int = 224,
    repeats: int = 3,
    copies: int = 1,
    mix_shards: int | None = None,
    loaders: str = "project,webdataset",
    json: Path | None = None,
) -> SimpleNamespace:
    """The train loader reading its shards over http from a slow server, against local disk; webdataset's too.

    Args:
        shards: a folder of shards with a shardindex.json (default: photo256).
        photo_samples: images of the default set, if it is built.
        latency_ms: the server's wait before each response.
        rate_mb: the most MB/s the server sends a connection.
        workers: DataLoader workers of every loader.
        batch_size: samples per batch.
        size: the trained image size in px.
        repeats: epochs per row (medians).
        copies: list the shards this many times: a longer epoch.
        mix_shards: the project's data.mix_shards (default: its index's default).
        loaders: the loaders measured: project, webdataset or both.
        json: write every run, median and ratio to this file.
    """
    if latency_ms < 0 or rate_mb <= 0:
        raise UserError("--latency_ms must be 0 or more and --rate_mb more than 0")
    if min(batch_size, size, repeats, copies, photo_samples) < 1 or workers < 0:
        raise UserError(
            "--batch_size, --size, --repeats, --copies and --photo_samples must be positive, --workers 0 or more"
        )
    names = [name.strip() for name in loaders.split(",") if name.strip()]
    if not names or set(names) - {"project", "webdataset"}:
        raise UserError(f"--loaders: a comma-separated subset of project,webdataset, not {names}")
    if shards is not None and not (Path(shards) / "shardindex.json").is_file():
        raise UserError(f"--shards {shards}: no shardindex.json there")
    return SimpleNamespace(
        shards=shards and Path(shards),
        photo_samples=photo_samples,
        latency_ms=latency_ms,
        rate_mb=rate_mb,
        workers=workers,
        batch_size=batch_size,
        size=size,
        repeats=repeats,
        copies=copies,
        mix_shards=mix_shards,
        loaders=names,
        json=json,
    )


def main(argv: list[str] | None = None) -> dict:
    args = run_command(options, "benchmarks/latency.py", argv)
    from peer_data import photo_set

    from project.data.specs import resolve_shards

    folder = args.shards or photo_set(samples=args.photo_samples).shards
    shards = resolve_shards(str(folder)).shards
    samples, size_mb = sum(s.nsamples for s in shards), statistics.mean(s.filesize for s in shards) / 1e6
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="latency-") as served:
        server = SlowServer(Path(served), args.latency_ms / 1e3, args.rate_mb * 1e6)
        try:
            result = measure(indexes(folder, Path(served), server.url, args.copies), server, args)
        finally:
            server.close()
    result["machine"] = {"cores": os.cpu_count(), "load_before": load, "load_after": os.getloadavg()}
    print(table(result, args, samples, len(shards), size_mb))
    print(
        f"{os.cpu_count()} cores; load average (1, 5, 15 min) {', '.join(f'{v:.2f}' for v in load)} before, "
        f"{', '.join(f'{v:.2f}' for v in result['machine']['load_after'])} after; "
        f"the server's CPU {result['server_cpu_s']:.1f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    run_main(main)
