"""How the loader's ratio to bare decoding moves with the cost of decoding: (a), (b) and (c) of
`python -m project.bench` (no training), on the demo at 32 px and at larger stored and trained sizes.

    python benchmarks/loader_scaling.py [--workers N] [--repeats R] [--samples N] [--json true]

For each (stored size, training size) it writes a demo training split into a temporary folder (32 px:
the demo at data/demo), then measures, interleaved and as medians of R repeats: bare decoding by N
processes, the project's train loader with N workers, and ImageFolder + DataLoader with N workers.
Trained at the stored size, the loader does the decoding of (a) plus its fixed work per sample (tar
reading, batching, handing batches over); the last size adds a resize, which (a) does not do.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace

from project.bench.images import decode_rate, imagefolder_rate, loader_rate, subset_index, write_image_folder
from project.bench.run import data_settings
from project.commands import run_command
from project.data.samples import read_samples
from project.data.specs import resolve_shards
from project.tasks.image.demo import make_demo

# (stored, trained): at the stored size the loader's work beyond bare decoding is its fixed cost per sample;
# the last row adds a resize, which bare decoding does not do
SIZES = ((32, 32), (64, 64), (128, 128), (128, 112))


def measure(stored: int, trained: int, args: SimpleNamespace, scratch: Path) -> dict:
    root = Path("data/demo") if stored == 32 else scratch / f"demo{stored}"
    if stored != 32 and not (root / "train").is_dir():
        make_demo(root, train=args.samples, val=1, test=1, image_size=stored, samples_per_shard=500, quiet=True)
    train = resolve_shards(str(root / "train"))
    index = subset_index(train.shards, args.samples, train.extra, scratch / f"train{stored}-{trained}")
    samples = [sample for shard in resolve_shards(str(index)).shards for sample in read_samples(shard.url)]
    folder = write_image_folder(samples, scratch / f"imagefolder{stored}-{trained}")
    settings = {**data_settings(), "image_size": trained}
    runs = {"decode": [], "loader": [], "imagefolder": []}
    for _ in range(args.repeats):
        runs["decode"].append(decode_rate(samples, args.workers, trained)[0])
        runs["loader"].append(loader_rate(index, args.workers, settings)[0])
        runs["imagefolder"].append(imagefolder_rate(folder, args.workers, settings))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "stored": stored,
        "trained": trained,
        "samples": len(samples),
        "runs": runs,
        "medians": medians,
        "loader_vs_decode": medians["loader"] / medians["decode"],
        "loader_vs_imagefolder": medians["loader"] / medians["imagefolder"],
    }


def options(*, workers: int = 2, repeats: int = 3, samples: int = 6000, json: bool = False) -> SimpleNamespace:
    """How the loader's ratio to bare decoding moves with the cost of decoding.

    Args:
        workers: DataLoader workers and decoding processes.
        repeats: repeats of each measurement (medians).
        samples: training samples the loaders read.
        json: end with one line of JSON.
    """
    return SimpleNamespace(workers=workers, repeats=repeats, samples=samples, json=json)


def main(argv: list[str] | None = None) -> None:
    args = run_command(options, "benchmarks/loader_scaling.py", argv)
    with tempfile.TemporaryDirectory(prefix="loader-scaling-") as scratch:
        results = [measure(stored, trained, args, Path(scratch)) for stored, trained in SIZES]
    print("| stored px | trained px | decode limit | loader | ImageFolder | loader/decode | loader/ImageFolder |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        m, ratios = r["medians"], f"{r['loader_vs_decode']:.2f} | {r['loader_vs_imagefolder']:.2f}"
        print(
            f"| {r['stored']} | {r['trained']} | {m['decode']:,.0f}/s | {m['loader']:,.0f}/s | "
            f"{m['imagefolder']:,.0f}/s | {ratios} |"
        )
    print(f"\n{args.workers} workers, medians of {args.repeats} repeats, {results[0]['samples']:,} samples each")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
