"""Turn an image or text collection into train/val/test WebDataset shards, each split with a shard index.

    python -m project.shards.prepare SOURCE --out DIR|URL [--val_fraction F] [--test_fraction F]
        [--samples_per_shard N] [--shard_size BYTES] [--workers N] [--seed S] [--part I/N]
        [--resize S] [--format jpg|png|webp] [--download true] [--text true] [--text_column C]
        [--label_column C] [--dedup exact|near|off] [--near_distance BITS] [--near_jaccard J] [--staging DIR]
        [--stage all|hash|match|write] [--wait SECONDS] [--engine local|ray] [--address auto] [--parts N]
        [--config FILE]

(`shards-prepare` is the same command.)

SOURCE: an ImageFolder tree (SOURCE/<class>/<image>), a CSV or JSONL listing (path, label), a torchvision
dataset (torchvision:CIFAR10), or existing tar shards (a folder, index, glob or brace pattern).

Text classification: a CSV or JSONL listing with a text and a label column (--text_column, --label_column;
a `key` or `id` column names the samples), a folder tree SOURCE/<class>/.../<name>.txt, or tar shards with
`.txt` and `.cls` members. Text is told from images by the content (a listing with the text column and no
`path` column, class folders of .txt files and no images, shards with .txt and no image members), or forced
with --text true. Each sample is written as `<key>.txt` (UTF-8) and `<key>.cls` (the integer label); rows that are
not valid UTF-8, or have an empty text or label, are skipped, each with a line on stderr, and counted.

The split is stratified and deterministic for a seed; keys come from the source paths, so they are
unique and stable. Samples are shuffled before sharding (a shard then mixes classes), and original
encoded bytes are kept unless --resize or --format ask otherwise, when their header is a JPEG's, PNG's or WebP's
(else the image is skipped and counted). A folder's or listing's entries that lead out of it (links, a listing's
`../` or absolute paths) or are no regular file (FIFOs, devices) are skipped, each with a line, and counted; no
file is written through a link out of OUT. Each shard is written under a
temporary name and renamed when complete: an interrupted run, started again with the same arguments,
keeps its finished shards and redoes the rest.

`--part I/N` (a job array) does 1/N of every stage: part I lists, hashes and writes only its slice of the source,
the parts' hashes are matched in one step that reads no image, and each part writes its samples into its own shards
and a part index (`python -m project.shards.index` merges them): the same samples in each split, and the same
duplicates removed, as one machine. The parts meet in OUT/.parts (with an --out url, in its bucket): `--stage all`
waits there for the others' hashes (--wait seconds); `--stage hash`, `match` (once) and `write` run them apart.
`--engine ray` runs the same parts (`--parts N`, by default the cluster's CPUs) as Ray tasks on a running cluster
(`--address auto`), a failed task retried. Rules: project/shards/stages.py and ray_engine.py.

--out may be an object store url (s3://bucket/ds, gs://, az://, any url fsspec writes; each library's own
credentials): the shards are written into a local staging folder (--staging; by default under
~/.cache/lightning-shards/prepare/), each uploaded as it is finished and its local copy removed, so the staging
folder holds a few shards at a time; each split's index goes up last, once every shard is in the bucket, so a
reader never sees a partial dataset. A run started again uploads only what is not in the bucket yet; with
--part I/N, each part uploads its shards and its part index. Rules: project/shards/publish.py.

--dedup (exact by default; near also finds re-encoded, resized or cropped images and texts that differ in
case, spacing or a few characters) keeps one copy of each duplicate, and no val or test sample with a copy in
train; OUT/duplicates.csv and .png (.txt for text) show them. Rules: project/shards/duplicates.py.

A run is the steps of `run`, in order; its options are `PrepareOptions` (project/shards/prepared.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from rich.progress import Progress

from project.commands import run_command
from project.data.parallel import Pool
from project.errors import run_main
from project.redact import redact
from project.shards.duplicates import Dedup, deduplicate, hash_records, report
from project.shards.jobs import ShardJob
from project.shards.parts import PARTS
from project.shards.prepared import MANIFEST, Prepared, PrepareOptions, check_manifest, check_out, manifest, summary
from project.shards.publish import LEDGER
from project.shards.ray_engine import run_on_ray
from project.shards.records import Record
from project.shards.split import SPLITS, plan_shards, split_records
from project.shards.stages import run_part
from project.shards.steps import columns, decide_text, list_source, write_indexes, write_shards
from project.shown import shown

HASH_CACHE = ".dedup-hashes.npz"  # the samples' hashes, kept for a run started again


def prepare(source: str, *, out: str | Path, **options: Any) -> Prepared:
    """Write the shards of `source` into OUT/{train,val,test}; returns what this part wrote and skipped.

    Args:
        source: an image or text folder (SOURCE/<class>/...), a .csv/.jsonl listing, tar shards, or
            torchvision:NAME.
        out: the output folder, or an object store url: train/, val/ and test/ go there.
        **options: the other `PrepareOptions`, by name (`samples_per_shard=500`).
    """
    return run(PrepareOptions(source=source, out=out, **options))


def run(options: PrepareOptions) -> Prepared:
    """A prepare run step by step; one --part of it, or a run on Ray, goes by its stages (stages.py)."""
    out = options.folder  # with an --out url, the staging folder
    check_out(out, [out / name for name in (MANIFEST, HASH_CACHE, LEDGER, PARTS, *SPLITS)])
    options = decide_text(options)
    if options.engine == "ray":
        return run_on_ray(options)
    if options.part[1] > 1 or options.stage != "all":
        return run_part(options)
    listed = list_source(options)
    remote = options.remote()
    check_manifest(out, manifest(options), remote)
    if remote is not None and not options.quiet:
        print(f"staging {shown(redact(options.out))} in {out}", file=sys.stderr)
    with Pool(options.workers) as pool:  # the same processes hash the samples, then write the shards
        found = find_duplicates(options, listed.records, pool)
        records = listed.records if found is None else found.kept
        splits = split_records(records, options.val_fraction, options.test_fraction, options.seed)
        jobs = plan_jobs(options, splits)
        check_out(out, [job.path for job in jobs])  # a shard's name planted as a link is no finished shard
        shards, unreadable = write_shards(options, jobs, pool, remote)
    dedup_lines = report_duplicates(options, found, splits, listed.classes)
    indexes = write_indexes(options, shards, listed.classes)
    if remote is not None:  # every shard is in the bucket (checked): the report this run wrote, then the indexes
        remote.check_unchanged(out / MANIFEST, manifest(options), [s for split in shards.values() for s in split])
        for path in [*report_files(options, found), *indexes]:
            remote.put(path)
    return Prepared(
        shards,
        text=options.text,
        skipped=listed.bad_rows + unreadable,
        left_out=listed.left_out,
        duplicates=0 if found is None else found.removed,
        dedup_lines=dedup_lines,
    )


def find_duplicates(options: PrepareOptions, records: list[Record], pool: Pool) -> Dedup | None:
    """The records with one copy of each duplicate kept (None with --dedup off); the hashes are cached in OUT."""
    if options.dedup == "off":
        return None
    with Progress(*columns("hash"), disable=options.quiet) as progress:
        cache = options.folder / HASH_CACHE
        hashes = hash_records(records, options.dedup, options.text, pool, progress=progress, cache=cache)
    return deduplicate(records, hashes, options.dedup, options.near_distance, options.near_jaccard)


def plan_jobs(options: PrepareOptions, splits: dict[str, list[Record]]) -> list[ShardJob]:
    """Every shard of the run, numbered within its split."""
    jobs = []
    for split, members in splits.items():
        for number, group in enumerate(plan_shards(members, options.samples_per_shard, options.shard_size)):
            path = str(options.folder / split / f"{split}-{number:06d}.tar")
            jobs.append(ShardJob(split, number, tuple(group), path, options.resize, options.format, options.text))
    return jobs


def report_files(options: PrepareOptions, found: Dedup | None) -> list[Path]:
    """The dedup report's files this run wrote: no other file of the staging folder goes up."""
    if found is None:
        return []
    sheet = "duplicates.txt" if options.text else "duplicates.png"
    return [options.folder / name for name in ["duplicates.csv", *([sheet] if found.groups else [])]]


def report_duplicates(
    options: PrepareOptions, found: Dedup | None, splits: dict[str, list[Record]], classes: list[str]
) -> list[str]:
    """The dedup report's lines, and its files in OUT."""
    if found is None:
        return []
    split_of = {record.key: split for split, members in splits.items() for record in members}
    return report(found, split_of, classes, options.folder, options.text)


def command(source: str, *, out: str, workers: int = min(4, os.cpu_count() or 1), **kwargs: Any) -> None:
    """Turn an image or text collection into train/val/test WebDataset shards, each split with a shard index.

    Args:
        source: an image or text folder (SOURCE/<class>/...), a .csv/.jsonl listing, tar shards, or
            torchvision:NAME.
        out: the output folder, or an object store url (s3://, gs://, az://, ...): train/, val/ and test/ go
            there, each split's index last.
        workers: processes that hash and write.
    """
    result = prepare(source, out=out, workers=workers, **kwargs)
    for line in result.dedup_lines:
        print(shown(line))  # keys and paths from the source
    print(shown(summary(out, result)))


def main(argv: list[str] | None = None) -> None:
    run_command(command, "project.shards.prepare", argv)


def console() -> None:
    """The `shards-prepare` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
