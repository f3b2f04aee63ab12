"""Turn an image or text collection into train/val/test WebDataset shards, each split with a shard index.

    python -m project.shards.prepare SOURCE --out DIR|URL [--val_fraction F] [--test_fraction F]
        [--samples_per_shard N] [--shard_size BYTES] [--workers N] [--seed S] [--part I/N]
        [--resize S] [--format jpg|png|webp] [--download true] [--text true] [--text_column C]
        [--label_column C] [--dedup exact|near|off] [--near_distance BITS] [--near_jaccard J] [--staging DIR]
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
keeps its finished shards and redoes the rest. `--part I/N` writes every N-th shard (from the I-th) and
a part index, for cluster job arrays; `python -m project.shards.index` then merges the parts' indexes.

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

import dataclasses
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.commands import run_command
from project.data.parallel import Pool
from project.data.samples import count_samples
from project.data.shard_index import INDEX_NAME, SHUFFLED_KEY, Shard, write_index
from project.errors import UserError, run_main
from project.redact import redact
from project.shards.dedup import require_near_text
from project.shards.duplicates import Dedup, deduplicate, hash_records, report
from project.shards.jobs import ShardJob, write_shard
from project.shards.prepared import MANIFEST, Prepared, PrepareOptions, check_manifest, check_out, manifest, summary
from project.shards.publish import LEDGER, Remote, Uploads
from project.shards.records import Record
from project.shards.sources import load_images
from project.shards.split import SPLITS, plan_shards, split_records
from project.shards.text_sources import is_text, load_text
from project.shown import shown

HASH_CACHE = ".dedup-hashes.npz"  # the samples' hashes, kept for a run started again and for the other parts


def prepare(source: str, *, out: str | Path, **options: Any) -> Prepared:
    """Write the shards of `source` into OUT/{train,val,test}; returns what this part wrote and skipped.

    Args:
        source: an image or text folder (SOURCE/<class>/...), a .csv/.jsonl listing, tar shards, or
            torchvision:NAME.
        out: the output folder, or an object store url: train/, val/ and test/ go there.
        **options: the other `PrepareOptions`, by name (`samples_per_shard=500`).
    """
    return run(PrepareOptions(source=source, out=out, **options))


@dataclasses.dataclass(frozen=True)
class Listed:
    """The source's samples and class names, with a line about each row or file skipped while listing."""

    records: list[Record]
    classes: list[str]
    bad_rows: list[str]  # a text source's rows skipped
    left_out: list[str]  # an image folder's or listing's files skipped: links out of it, FIFOs, devices


def run(options: PrepareOptions) -> Prepared:
    """A prepare run (or one --part of it), step by step."""
    out = options.folder  # with an --out url, the staging folder
    check_out(out, [out / MANIFEST, out / HASH_CACHE, out / LEDGER, *(out / split for split in SPLITS)])
    options = decide_text(options)
    listed = list_texts(options) if options.text else list_images(options)
    remote = options.remote()
    check_manifest(out, manifest(options), remote)
    if remote is not None and not options.quiet:
        print(f"staging {shown(redact(options.out))} in {out}", file=sys.stderr)
    with Pool(options.workers) as pool:  # the same processes hash the samples, then write the shards
        found = find_duplicates(options, listed.records, pool)
        records = listed.records if found is None else found.kept
        splits = split_records(records, options.val_fraction, options.test_fraction, options.seed)
        jobs = this_part(options, plan_jobs(options, splits))
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


def decide_text(options: PrepareOptions) -> PrepareOptions:
    """The options with `text` decided (by the source's content unless --text true), and checked against it."""
    text = options.text or is_text(options.source, options.text_column)
    if text and (options.resize is not None or options.format is not None):
        raise UserError(f"--resize and --format re-encode images; {options.source} is text: drop them")
    if text and options.dedup == "near":
        require_near_text()  # before the source is listed
    return dataclasses.replace(options, text=text)


def list_texts(options: PrepareOptions) -> Listed:
    """A text source's samples; each bad row is skipped with a line, and a source with no good row refused."""
    records, classes, bad_rows = load_text(options.source, options.text_column, options.label_column)
    tell(options, bad_rows)
    if not records:
        raise UserError(f"no usable texts in {options.source} ({len(bad_rows)} bad rows skipped)")
    return Listed(records, classes, bad_rows=bad_rows, left_out=[])


def list_images(options: PrepareOptions) -> Listed:
    """An image source's samples (with their sizes when --shard_size needs them)."""
    records, classes, left_out = load_images(
        options.source, options.download, options.torchvision_root, with_sizes=options.shard_size is not None
    )
    tell(options, left_out)
    return Listed(records, classes, bad_rows=[], left_out=left_out)


def find_duplicates(options: PrepareOptions, records: list[Record], pool: Pool) -> Dedup | None:
    """The records with one copy of each duplicate kept (None with --dedup off); the hashes are cached in OUT."""
    if options.dedup == "off":
        return None
    with Progress(*_columns("hash"), disable=options.quiet) as progress:
        cache = options.folder / HASH_CACHE
        hashes = hash_records(records, options.dedup, options.text, pool, progress=progress, cache=cache)
    return deduplicate(records, hashes, options.dedup, options.near_distance, options.near_jaccard)


def plan_jobs(options: PrepareOptions, splits: dict[str, list[Record]]) -> list[ShardJob]:
    """Every shard of the run, numbered within its split, whichever part writes it."""
    jobs = []
    for split, members in splits.items():
        for number, group in enumerate(plan_shards(members, options.samples_per_shard, options.shard_size)):
            path = str(options.folder / split / f"{split}-{number:06d}.tar")
            jobs.append(ShardJob(split, number, tuple(group), path, options.resize, options.format, options.text))
    return jobs


def this_part(options: PrepareOptions, jobs: list[ShardJob]) -> list[ShardJob]:
    """The shards of --part I/N, every N-th from the I-th, none of their names a link out of OUT."""
    index, count = options.part
    mine = jobs[index::count]
    check_out(options.folder, [job.path for job in mine])  # a shard's name planted as a link is no finished shard
    return mine


def write_shards(
    options: PrepareOptions, jobs: list[ShardJob], pool: Pool, remote: Remote | None
) -> tuple[dict[str, list[Shard]], list[str]]:
    """This part's shards by split, the finished ones kept and the rest written by the pool (and uploaded, with an
    --out url), and a line about each sample left out of them (an image that could not be read)."""
    for split in SPLITS:
        (options.folder / split).mkdir(parents=True, exist_ok=True)
    most = {job.path: len(job.records) for job in jobs}
    written = {} if remote is None else remote.uploaded(list(most), most)  # in the bucket already
    # a finished shard's count from its headers: a sample left out of it is not in it
    staged = {job.path: finished(job.path) for job in jobs if job.path not in written and os.path.exists(job.path)}
    todo = [job for job in jobs if job.path not in written and job.path not in staged]
    unreadable: list[str] = []
    with Progress(*_columns(), disable=options.quiet) as progress:
        task = progress.add_task("prepare", total=sum(most.values()), unit="samples")
        progress.advance(task, sum(most[path] for path in [*written, *staged]))
        if remote is not None and (staged or todo):  # a shard goes up: no index may name the one it replaces
            remote.take_down(f"{split}/{name}" for split in SPLITS for name in {INDEX_NAME, options.index_name})
        with uploads(remote, progress, jobs, written) as up:
            for shard in staged.values():
                up.submit(shard)
            for shard, lines in pool.imap_unordered(write_shard, todo):
                staged[shard.url] = shard
                up.submit(shard)  # waits while a few shards wait for their upload: the pool writes none meanwhile
                unreadable += lines
                progress.advance(task, shard.nsamples + len(lines))
            up.finish()
    tell(options, unreadable)
    written |= staged
    return {split: [written[job.path] for job in jobs if job.split == split] for split in SPLITS}, unreadable


def uploads(remote: Remote | None, progress: Progress, jobs: list[ShardJob], written: dict[str, Shard]) -> Uploads:
    """The uploads of the shards not in the bucket yet, with their progress bar (none for a local OUT)."""
    if remote is None:
        return Uploads(None, lambda shard: None)
    task = progress.add_task("upload", total=len(jobs) - len(written), unit="shards")
    return Uploads(remote, lambda shard: progress.advance(task))


def finished(path: str) -> Shard:
    """A shard a run before this one finished."""
    return Shard(path, count_samples(path), os.path.getsize(path))


def write_indexes(options: PrepareOptions, shards: dict[str, list[Shard]], classes: list[str]) -> list[Path]:
    """Each split's shard index, or with --part I/N (N > 1) its part's, for `project.shards.index` to merge; the
    files written."""
    name = options.index_name
    extra = {"classes": classes, SHUFFLED_KEY: True}  # the split's samples are shuffled before sharding
    return [
        write_index(options.folder / split / name, written, name=split, extra=extra)
        for split, written in shards.items()
        if written or options.part[1] == 1
    ]


def report_files(options: PrepareOptions, found: Dedup | None) -> list[Path]:
    """The dedup report's files this run wrote (none on a --part other than 0): no other file of the staging
    folder goes up."""
    if found is None or options.part[0] != 0:
        return []
    sheet = "duplicates.txt" if options.text else "duplicates.png"
    return [options.folder / name for name in ["duplicates.csv", *([sheet] if found.groups else [])]]


def report_duplicates(
    options: PrepareOptions, found: Dedup | None, splits: dict[str, list[Record]], classes: list[str]
) -> list[str]:
    """The dedup report's lines, and its files in OUT; part 0 alone writes them, as every part finds the same."""
    if found is None or options.part[0] != 0:
        return []
    split_of = {record.key: split for split, members in splits.items() for record in members}
    return report(found, split_of, classes, options.folder, options.text)


def tell(options: PrepareOptions, lines: Iterable[str]) -> None:
    """Lines about skipped rows or files, on stderr unless --quiet."""
    if not options.quiet:
        for line in lines:
            print(shown(line), file=sys.stderr)  # keys and paths from the source


def _columns(name: str = "{task.description}") -> tuple:
    unit = "{task.fields[unit]}" if name == "{task.description}" else "samples"
    return TextColumn(name), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeRemainingColumn()


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
