"""The steps a `prepare` run shares with each of its parts (project/shards/stages.py): tell text from images, list
the source (or a part's slice of it), write the planned shards with a pool (uploading them with an --out url), and
write each split's index."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from project.data.parallel import Pool
from project.data.samples import count_samples
from project.data.shard_index import INDEX_NAME, SHUFFLED_KEY, Shard, write_index
from project.errors import UserError
from project.shards.dedup import require_near_text
from project.shards.jobs import ShardJob, write_shard
from project.shards.parts import Slice
from project.shards.prepared import PrepareOptions
from project.shards.publish import Remote, Uploads
from project.shards.records import Record
from project.shards.sources import load_images
from project.shards.split import SPLITS
from project.shards.text_sources import is_text, load_text
from project.shown import shown


@dataclasses.dataclass(frozen=True)
class Listed:
    """The source's samples and class names, with a line about each row or file skipped while listing."""

    records: list[Record]
    classes: list[str]
    bad_rows: list[str]  # a text source's rows skipped
    left_out: list[str]  # an image folder's or listing's files skipped: links out of it, FIFOs, devices


def decide_text(options: PrepareOptions) -> PrepareOptions:
    """The options with `text` decided (by the source's content unless --text true), and checked against it."""
    text = options.text or is_text(options.source, options.text_column)
    if text and (options.resize is not None or options.format is not None):
        raise UserError(f"--resize and --format re-encode images; {options.source} is text: drop them")
    if text and options.dedup == "near":
        require_near_text()  # before the source is listed
    return dataclasses.replace(options, text=text)


def list_source(options: PrepareOptions, part: Slice | None = None) -> Listed:
    """The source's samples, or with `part` those of its slice (the one-machine run lists them all)."""
    return list_texts(options, part) if options.text else list_images(options, part)


def list_texts(options: PrepareOptions, part: Slice | None = None) -> Listed:
    """A text source's samples; each bad row is skipped with a line, and a source with no good row refused."""
    records, classes, bad_rows = load_text(options.source, options.text_column, options.label_column, part=part)
    tell(options, bad_rows)
    if not records and part is None:
        raise UserError(f"no usable texts in {options.source} ({len(bad_rows)} bad rows skipped)")
    return Listed(records, classes, bad_rows=bad_rows, left_out=[])


def list_images(options: PrepareOptions, part: Slice | None = None) -> Listed:
    """An image source's samples (with their sizes when --shard_size needs them)."""
    records, classes, left_out = load_images(
        options.source, options.download, options.torchvision_root, options.shard_size is not None, part=part
    )
    tell(options, left_out)
    return Listed(records, classes, bad_rows=[], left_out=left_out)


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
    with Progress(*columns(), disable=options.quiet) as progress:
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


def tell(options: PrepareOptions, lines: Iterable[str]) -> None:
    """Lines about skipped rows or files, on stderr unless --quiet."""
    if not options.quiet:
        for line in lines:
            print(shown(line), file=sys.stderr)  # keys and paths from the source


def columns(name: str = "{task.description}") -> tuple:
    """A progress bar's columns: the task's name, the bar, done of total, the unit, the time left."""
    unit = "{task.fields[unit]}" if name == "{task.description}" else "samples"
    return TextColumn(name), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeRemainingColumn()
