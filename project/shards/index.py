"""Write a shard index for existing shards, made by any tool, and verify them.

    python -m project.shards.index PATTERN|DIR|URL|PART_INDEX.json... --out FILE|URL [--verify_images false]
        [--workers 8]

(`shards-index` is the same command.)

Accepts webdataset TarWriter/ShardWriter output, GNU tar of a folder of key.ext files, and gzip-compressed
tars (.tar.gz, .tgz), local or remote: a store's folder (`s3://bucket/train/`, listed one level deep), glob or
brace pattern, or an http(s) brace pattern or list (http has no listing). Each shard is read through once,
`--workers` at a time, with a progress bar in bytes and shards on a terminal: samples are counted, labels collected
(so num_classes flows on to the model), and corrupt shards and members (unreadable data, undecodable images,
missing labels, text that is not UTF-8) are listed (project/tasks/scan.py). Text shards (`.txt` text and `.cls`
label) are indexed too. Part indexes written by `prepare --part I/N` are merged without a re-scan.

A journal beside the index (`<out>.journal`; for a url `--out`, in the user's cache folder) keeps the shards done:
a run stopped (killed, a store down) goes on where it stopped, and the journal goes once the index is written.
`--out` is a local path or a store's url, written beside the shards (index_out.py).
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from project.commands import run_command
from project.data.journal import Journal
from project.data.listing import remote_shards
from project.data.paths import matching_files, source_files
from project.data.remote import is_remote
from project.data.scanning import Scanned, scan_shards
from project.data.shard_index import INDEX_NAME, SHUFFLED_KEY, Shard, ShardIndex, read_index, shuffled_before_sharding
from project.data.specs import SHARD_SUFFIXES, resolve_shards
from project.errors import UserError, check_positive, run_main
from project.redact import redact, redact_text
from project.shards.index_out import check_out, index_name, journal_path, write_out
from project.shards.mixing import sorted_warning
from project.shown import shown
from project.tasks.labels import index_classes
from project.tasks.scan import ShardReport, index_extra, label_indexer, scan_shard, text_sample_problems

__all__ = ["ShardReport", "build_index", "command", "scan_shard", "shard_spec", "text_sample_problems"]


def build_index(
    inputs: list[str],
    out: str | Path,
    verify_images: bool = True,
    shard_labels: list[Counter] | None = None,
    skipped: list[str] | None = None,
    *,
    workers: int = 8,
) -> tuple[ShardIndex, list[str]]:
    """Merge part indexes and scan shards into one index at `out` (a local path or a store's url); returns it and
    the problems found. Shards are read `workers` at a time, each once: a journal beside `out` keeps those done, so
    that a run stopped goes on where it stopped. The labels counted in each scanned shard are appended to
    `shard_labels` when it is given, and a line for each entry of a folder or glob left out (a link out of it, a
    FIFO, a folder named like a shard) to `skipped`."""
    out = str(out)
    check_out(out)
    parts: list[ShardIndex | list[str]] = []  # part indexes, and runs of shards to scan
    sizes: dict[str, int] = {}
    for spec in inputs:
        if urlsplit(spec).path.endswith(".json") if is_remote(spec) else spec.endswith(".json"):
            parts.append(read_index(spec))
            continue
        paths, listed = input_shards(spec, skipped)
        parts.append(paths)
        sizes |= listed
    urls = list(dict.fromkeys(url for part in parts if isinstance(part, list) for url in part))
    journal = Journal(journal_path(out), urls, label_indexer(verify_images).name)
    with journal.locked():  # another run writing the same index: waited for
        index, problems = _built(parts, out, _scan(journal, verify_images, workers, sizes), shard_labels)
        journal.remove()
    return index, problems


def _built(
    parts: list[ShardIndex | list[str]], out: str, scanned_list: list[Scanned], shard_labels: list[Counter] | None
) -> tuple[ShardIndex, list[str]]:
    """The index of the part indexes and the scanned shards, written to `out`; and the problems found."""
    scanned = {result.shard.url: result for result in scanned_list}
    shards: list[Shard] = []
    problems: list[str] = []
    shuffled: list[bool] = []  # whether each input says its samples were shuffled before sharding
    for part in parts:
        if isinstance(part, ShardIndex):
            shards += part.shards
            shuffled.append(shuffled_before_sharding(part))
            continue
        shuffled.append(False)  # shards made elsewhere: training interleaves them
        for url in part:
            shards.append(scanned[url].shard)
            problems += [f"{redact(url)}: {redact_text(problem)}" for problem in scanned[url].problems]
            if shard_labels is not None:
                shard_labels.append(scanned[url].labels)
    if not shards:
        raise UserError("no shards to index")
    indexes = [part for part in parts if isinstance(part, ShardIndex)]
    classes = next(filter(None, map(index_classes, indexes)), None)
    classes = classes or index_extra(scanned_list).get("classes")
    extra = ({"classes": classes} if classes else {}) | ({SHUFFLED_KEY: True} if all(shuffled) else {})
    index = ShardIndex(shards, index_name(out), extra)
    write_out(out, shards, index.name, index.extra)
    return index, problems


def _scan(journal: Journal, verify_images: bool, workers: int, sizes: dict[str, int]) -> list[Scanned]:
    """The shards scanned, those an interrupted run's journal holds taken from it (and said in a line)."""
    indexer, urls = label_indexer(verify_images), journal.urls
    finished = journal.finished() if urls else {}
    if finished:
        print(f"going on from {journal.path}: {len(finished)} of {len(urls)} shards already indexed", file=sys.stderr)
    return scan_shards(urls, indexer, workers=workers, finished=finished, record=journal.add, sizes=sizes)


def input_shards(spec: str, skipped: list[str] | None = None) -> tuple[list[str], dict[str, int]]:
    """The shards an input names, in order, and the sizes its listing gave: a local file, folder or glob's regular
    files (a line for each entry left out added to `skipped`), a local brace pattern's files, or a remote pattern,
    glob or folder (a store's listing)."""
    paths, left_out = local_shards(spec)
    if skipped is not None:
        skipped += left_out
    if paths is None and is_remote(spec):
        paths, sizes = remote_shards(spec)
    elif paths is None:
        paths, sizes = [s.url for s in resolve_shards(spec, count=lambda url: 0).shards], {}
    else:
        sizes = {}
    if not paths:
        more = f" ({len(left_out)} skipped; the first: {shown(left_out[0])})" if left_out else ""  # a file's name
        raise UserError(f"no shards match {redact(spec)}{more}")
    return paths, sizes


def local_shards(spec: str) -> tuple[list[str] | None, list[str]]:
    """The shard files a local file, folder or glob names (None for any other spec), and a line for each entry
    left out: a folder's or a glob's shards are its regular files, and links that stay inside it."""
    if os.path.isfile(spec):
        return [spec], []  # named on the command line
    if os.path.isdir(spec):
        listed = source_files(spec, SHARD_SUFFIXES, recursive=False)
    elif not is_remote(spec) and re.search(r"[*?\[]", spec):
        listed = matching_files(spec, SHARD_SUFFIXES)
    else:
        return None, []
    return [file.path for file in listed.files], listed.skipped


def shard_spec(spec: str) -> tuple[str | list[str], list[str]]:
    """A data spec whose local folder (without a shard index) or glob is read as its regular shard files, and a
    line for each entry skipped: the spec itself where nothing is skipped (resolve_shards then reads it as
    before), else the list of the files kept. Any other spec as it is: an index names its shards, and that is
    the index's boundary. For prepare's and inspect's shard sources."""
    if os.path.isdir(spec) and os.path.exists(os.path.join(spec, INDEX_NAME)):
        return spec, []
    paths, skipped = local_shards(spec) if not os.path.isfile(spec) else (None, [])
    if paths is None or not skipped:
        return spec, skipped
    if not paths:
        raise UserError(f"no shards in {spec}: {len(skipped)} skipped, the first: {shown(skipped[0])}")
    return paths, skipped


def command(inputs: list[str], *, out: str, verify_images: bool = True, workers: int = 8) -> None:
    """Write a shard index for existing shards, made by any tool, and verify them.

    Args:
        inputs: shard folders, files, globs, brace patterns or part indexes, local or remote: a store's folder
            (s3://bucket/train/, listed one level deep), glob or brace pattern; an http(s) brace pattern or list.
        out: the shard index to write (usually DIR/shardindex.json): a local path, or a store's url
            (s3://bucket/train/shardindex.json), beside the shards.
        verify_images: check that every image decodes (false: faster).
        workers: shards read at a time (threads: the work is mostly waiting on a store).
    """
    check_positive(workers=workers)
    shard_labels: list[Counter] = []
    skipped: list[str] = []
    index, problems = build_index(inputs, out, verify_images, shard_labels, skipped, workers=workers)
    classes = f"{len(index_classes(index))} classes" if index_classes(index) else "no labels found"
    print(shown(f"wrote {redact(out)}: {len(index.shards)} shards, {index.nsamples} samples, {classes}"))
    if warning := sorted_warning(shard_labels):
        print(shown(warning))
    if skipped:
        print(f"{len(skipped)} entries skipped (links out of their folder, or not regular files):")
        for line in skipped:
            print(f"  {shown(line)}")
    if problems:
        print(f"{len(problems)} problem(s) found; training skips these samples and counts them:")
        for problem in problems:
            print(f"  {shown(problem)}")


def main(argv: list[str] | None = None) -> None:
    run_command(command, "project.shards.index", argv)


def console() -> None:
    """The `shards-index` console script."""
    run_main(main)


if __name__ == "__main__":
    console()
