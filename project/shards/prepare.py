"""Turn an image or text collection into train/val/test WebDataset shards, each split with a shard index.

    python -m project.data.prepare SOURCE --out DIR [--val-fraction F] [--test-fraction F]
        [--samples-per-shard N] [--shard-size BYTES] [--workers N] [--seed S] [--part I/N]
        [--resize S] [--format jpg|png|webp] [--download] [--text] [--text-column C] [--label-column C]
        [--dedup exact|near|off] [--near-distance BITS] [--near-jaccard J]

SOURCE: an ImageFolder tree (SOURCE/<class>/<image>), a CSV or JSONL listing (path, label), a torchvision
dataset (torchvision:CIFAR10), or existing tar shards (a folder, index, glob or brace pattern).

Text classification: a CSV or JSONL listing with a text and a label column (--text-column, --label-column;
a `key` or `id` column names the samples), a folder tree SOURCE/<class>/.../<name>.txt, or tar shards with
`.txt` and `.cls` members. Text is told from images by the content (a listing with the text column and no
`path` column, class folders of .txt files and no images, shards with .txt and no image members), or forced
with --text. Each sample is written as `<key>.txt` (UTF-8) and `<key>.cls` (the integer label); rows that are
not valid UTF-8, or have an empty text or label, are skipped, each with a line on stderr, and counted.

The split is stratified and deterministic for a seed; keys come from the source paths, so they are
unique and stable. Samples are shuffled before sharding (a shard then mixes classes), and original
encoded bytes are kept unless --resize or --format ask otherwise. Each shard is written under a
temporary name and renamed when complete: an interrupted run, started again with the same arguments,
keeps its finished shards and redoes the rest. `--part I/N` writes every N-th shard (from the I-th) and
a part index, for cluster job arrays; `python -m project.data.index` then merges the parts' indexes.

--dedup (exact by default; near also finds re-encoded, resized or cropped images and texts that differ in
case, spacing or a few characters) keeps one copy of each duplicate, and no val or test sample with a copy in
train; OUT/duplicates.csv and .png (.txt for text) show them. Rules: project/shards/duplicates.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.data.atomic import write_json_atomically
from project.data.redact import redact
from project.data.samples import count_samples
from project.data.shard_index import INDEX_NAME, Shard, write_index
from project.errors import UserError
from project.shards.dedup import DEFAULT_NEAR_DISTANCE, DEFAULT_NEAR_JACCARD, MODES, require_near_text
from project.shards.duplicates import check_dedup, deduplicate, hash_records, report
from project.shards.jobs import ShardJob, write_shard
from project.shards.parallel import Pool
from project.shards.sources import load
from project.shards.split import SPLITS, plan_shards, split_records
from project.shards.text_sources import is_text, load_text

MANIFEST = ".prepare.json"
HASH_CACHE = ".dedup-hashes.npz"  # the samples' hashes, kept for a run started again and for other --parts


class Prepared(dict):
    """{split: [Shard, ...]}: the shards this part wrote, the lines about the bad rows skipped (text), and
    the duplicates removed with the report's lines about them (empty with --dedup off, or on a --part > 0)."""

    def __init__(self, shards: dict[str, list[Shard]], skipped: list[str] | None = None, text: bool = False,
                 duplicates: int = 0, dedup_lines: list[str] | None = None):  # fmt: skip
        super().__init__(shards)
        self.skipped = list(skipped or [])
        self.text = text
        self.duplicates = duplicates
        self.dedup_lines = list(dedup_lines or [])

    @property
    def bad_rows(self) -> int:
        return len(self.skipped)


def _check_manifest(out: Path, settings: dict) -> None:
    """A second run into the same folder must use the same settings, or finished shards would differ."""
    path = out / MANIFEST
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except (ValueError, OSError) as error:
            raise UserError(f"{path} is not a prepare manifest ({error}): delete {out} to start over") from None
        if not isinstance(previous, dict):
            raise UserError(f"{path} is not a prepare manifest: delete {out} to start over")
        if previous != settings:
            changed = sorted(k for k in settings if previous.get(k) != settings[k])
            raise UserError(f"{out} holds a prepare run with other settings ({', '.join(changed)}): "
                            "use another --out, or delete it")  # fmt: skip
    else:
        write_json_atomically(path, settings)


def prepare(
    source: str,
    out: str | Path,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    samples_per_shard: int = 1000,
    shard_size: int | None = None,
    workers: int = 1,
    seed: int = 0,
    part: tuple[int, int] = (0, 1),
    resize: int | None = None,
    format: str | None = None,  # noqa: A002
    download: bool = False,
    quiet: bool = False,
    torchvision_root: str = "data/torchvision",
    text: bool = False,
    text_column: str = "text",
    label_column: str = "label",
    dedup: str = "exact",
    near_distance: int = DEFAULT_NEAR_DISTANCE,
    near_jaccard: float = DEFAULT_NEAR_JACCARD,
) -> Prepared:
    """Write the shards of `source` into OUT/{train,val,test}; returns the shards this part wrote, by split
    (a dict), with `.bad_rows` (and `.skipped`, a line about each) for the rows of a text source skipped.
    `text` forces a text source; otherwise `is_text` tells by the content. `dedup`: see the module's docstring."""
    check_dedup(dedup, near_distance, near_jaccard)
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise UserError("--val-fraction and --test-fraction must be in [0, 1) and add up to less than 1")
    index, count = part
    if not 0 <= index < count:
        raise UserError(f"--part {index}/{count}: I must be in 0..N-1")
    out = Path(out)
    skipped: list[str] = []
    text = text or is_text(source, text_column)
    if text and (resize is not None or format is not None):
        raise UserError(f"--resize and --format re-encode images; {source} is text: drop them")
    if text and dedup == "near":
        require_near_text()  # before the source is listed
    if text:
        records, classes, skipped = load_text(source, text_column, label_column)
        if not quiet:
            for line in skipped:
                print(line, file=sys.stderr)
        if not records:
            raise UserError(f"no usable texts in {source} ({len(skipped)} bad rows skipped)")
    else:
        records, classes = load(source, download, torchvision_root, with_sizes=shard_size is not None)
    # the source as people may see it: the manifest is a file beside the shards, which get shared
    settings = {"source": redact(source), "val_fraction": val_fraction, "test_fraction": test_fraction,
                "samples_per_shard": samples_per_shard, "shard_size": shard_size, "seed": seed,
                "resize": resize, "format": format, "parts": count}  # fmt: skip
    if text:  # only for text, so that an image run of an earlier version still resumes
        settings.update(text=True, text_column=text_column, label_column=label_column)
    if dedup != "off":  # a run of an earlier version, without dedup, is a run with --dedup off
        settings["dedup"] = dedup
        if dedup == "near":
            settings.update({"near_jaccard": near_jaccard} if text else {"near_distance": near_distance})
    _check_manifest(out, settings)
    with Pool(workers) as pool:  # the same processes hash the samples, then write the shards
        found = None
        if dedup != "off":
            with Progress(*_columns("hash"), disable=quiet) as progress:
                hashes = hash_records(records, dedup, text, pool, progress, cache=out / HASH_CACHE)
            found = deduplicate(records, hashes, dedup, near_distance, near_jaccard)
            records = found.kept
        splits = split_records(records, val_fraction, test_fraction, seed)
        jobs: list[ShardJob] = []
        for split, members in splits.items():
            (out / split).mkdir(parents=True, exist_ok=True)
            for number, group in enumerate(plan_shards(members, samples_per_shard, shard_size)):
                path = str(out / split / f"{split}-{number:06d}.tar")
                jobs.append(ShardJob(split, number, tuple(group), path, resize, format, text))
        mine = jobs[index::count]
        todo = [job for job in mine if not os.path.exists(job.path)]  # finished shards are kept
        # a finished shard's count from its headers: a sample left out of it is not in it
        written = {job.path: Shard(job.path, count_samples(job.path), os.path.getsize(job.path))
                   for job in mine if os.path.exists(job.path)}  # fmt: skip
        unreadable: list[str] = []
        with Progress(*_columns("prepare"), disable=quiet) as progress:
            task = progress.add_task("prepare", total=sum(len(j.records) for j in mine))
            progress.advance(task, sum(len(j.records) for j in mine if j.path in written))
            for shard, lines in pool.imap_unordered(write_shard, todo):
                written[shard.url] = shard
                unreadable += lines
                progress.advance(task, shard.nsamples + len(lines))
        if not quiet:
            for line in unreadable:
                print(line, file=sys.stderr)
        skipped += unreadable
    lines = []
    if found is not None and index == 0:
        split_of = {record.key: split for split, members in splits.items() for record in members}
        lines = report(found, split_of, classes, out, text)
    result = Prepared({split: [written[j.path] for j in mine if j.split == split] for split in SPLITS}, skipped, text,
                      found.removed if found is not None else 0, lines)  # fmt: skip
    name = INDEX_NAME if count == 1 else f"shardindex.part-{index}-of-{count}.json"
    for split in SPLITS:
        if result[split] or count == 1:
            write_index(out / split / name, result[split], name=split, extra={"classes": classes})
    return result


def _columns(name: str) -> tuple:
    return TextColumn(name), BarColumn(), MofNCompleteColumn(), TextColumn("samples"), TimeRemainingColumn()


def summary(out: str | Path, result: Prepared) -> str:
    """The last line of a run: `wrote DIR: train 800, val 100, test 100 samples[; 3 bad rows skipped]
    [; 12 duplicates removed]`."""
    counts = ", ".join(f"{split} {sum(s.nsamples for s in shards)}" for split, shards in result.items())
    plural = "" if result.bad_rows == 1 else "s"
    what = "bad row" if result.text else "unreadable image"
    bad = f"; {result.bad_rows} {what}{plural} skipped" if result.text or result.bad_rows else ""
    plural = "" if result.duplicates == 1 else "s"
    duplicates = f"; {result.duplicates} duplicate{plural} removed" if result.duplicates else ""
    return f"wrote {out}: {counts} samples{bad}{duplicates}"


def _part(text: str) -> tuple[int, int]:
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 0/8, got {text!r}") from None
    return index, count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m project.data.prepare", description=__doc__.split("\n")[0])
    parser.add_argument(
        "source", help="image or text folder (SOURCE/<class>/...), .csv/.jsonl listing, tar shards, or torchvision:NAME"
    )
    parser.add_argument("--out", required=True, help="output folder: train/, val/ and test/ go here")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="share of each class for val (0.1)")
    parser.add_argument("--test-fraction", type=float, default=0.1, help="share of each class for test (0.1)")
    parser.add_argument("--samples-per-shard", type=int, default=1000, help="samples per shard (1000)")
    parser.add_argument("--shard-size", type=int, default=None, help="bytes per shard, at most (no limit)")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and the shuffle (0)")
    parser.add_argument("--part", type=_part, default=(0, 1), help="write part I of N (a job array)")
    parser.add_argument("--resize", type=int, default=None, help="re-encode images with the shorter side this size")
    parser.add_argument("--format", choices=["jpg", "png", "webp"], default=None, help="re-encode images as this")
    parser.add_argument("--download", action="store_true", help="download a torchvision dataset")
    parser.add_argument("--torchvision-root", default="data/torchvision", help="torchvision datasets' root")
    parser.add_argument("--text", action="store_true", help="the source holds texts (default: tell by its content)")
    parser.add_argument("--text-column", default="text", help="a text listing's column of texts (text)")
    parser.add_argument("--label-column", default="label", help="a text listing's column of labels (label)")
    parser.add_argument(
        "--dedup",
        choices=MODES,
        default="exact",
        help="remove exact copies (exact), also near copies (near), or none (off); default exact",
    )
    parser.add_argument(
        "--near-distance",
        type=int,
        default=DEFAULT_NEAR_DISTANCE,
        help=f"images: most differing bits of 64 for a near copy ({DEFAULT_NEAR_DISTANCE})",
    )
    parser.add_argument(
        "--near-jaccard",
        type=float,
        default=DEFAULT_NEAR_JACCARD,
        help=f"text: least Jaccard similarity for a near copy ({DEFAULT_NEAR_JACCARD})",
    )
    args = parser.parse_args(argv)
    result = prepare(args.source, args.out, args.val_fraction, args.test_fraction, args.samples_per_shard,
                     args.shard_size, args.workers, args.seed, args.part, args.resize, args.format,
                     args.download, torchvision_root=args.torchvision_root, text=args.text,
                     text_column=args.text_column, label_column=args.label_column, dedup=args.dedup,
                     near_distance=args.near_distance, near_jaccard=args.near_jaccard)  # fmt: skip
    for line in result.dedup_lines:
        print(line)
    print(summary(args.out, result))
