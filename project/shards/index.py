"""Write a shard index for existing shards, made by any tool, and verify them.

    python -m project.shards.index PATTERN|DIR|PART_INDEX.json... --out FILE [--verify_images false]

(`shards-index` is the same command.)

Accepts webdataset TarWriter/ShardWriter output, GNU tar of a folder of key.ext files, and gzip-compressed
tars (.tar.gz, .tgz). Each shard is read through: samples are counted, labels collected (so num_classes
flows on to the model), and corrupt shards and members (unreadable data, undecodable images, missing
labels, text that is not UTF-8) are listed. Text shards (`.txt` text and `.cls` label) are indexed too.
Part indexes written by `prepare --part I/N` are merged without a re-scan.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from project.commands import run_command
from project.data.paths import matching_files, source_files
from project.data.remote import is_remote
from project.data.samples import REFUSED, read_samples
from project.data.shard_index import (
    INDEX_NAME,
    SHUFFLED_KEY,
    Shard,
    ShardIndex,
    read_index,
    shuffled_before_sharding,
    write_index,
)
from project.data.specs import SHARD_SUFFIXES, resolve_shards
from project.errors import ShardError, UserError, run_main
from project.shards.mixing import sorted_warning
from project.shards.records import labels_to_classes
from project.shown import shown
from project.tasks.image.decode import IMAGE_EXTENSIONS, WANTED_EXTENSIONS, label_text, open_image
from project.tasks.labels import index_classes


@dataclass
class ShardReport:
    shard: Shard
    labels: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # "key: what is wrong"


def scan_shard(url: str, verify_images: bool = True) -> ShardReport:
    """Count, collect labels and verify one shard, reading it to the end."""
    labels: Counter = Counter()
    problems, count = [], 0
    try:
        for sample in read_samples(url, extensions=WANTED_EXTENSIONS):
            count += 1
            key = sample["__key__"]
            if REFUSED in sample:
                problems.append(f"{key}: {sample[REFUSED]}")
                continue
            image = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
            if image is None and "npy" not in sample and "txt" in sample and "cls" in sample:
                problems += [f"{key}: {problem}" for problem in text_sample_problems(sample, labels)]
                continue  # a text sample (.txt text, .cls label), as prepare --text writes
            try:
                labels[label_text(sample)] += 1  # integers or class names: labels_to_classes sorts them out
            except (ValueError, UnicodeDecodeError) as error:
                problems.append(f"{key}: {error}")
            if image is None and "npy" not in sample:
                problems.append(f"{key}: no image member")
            elif image is not None and verify_images:
                try:
                    with open_image(sample[image]) as opened:  # the pixel bound, from the header
                        opened.verify()
                except Exception as error:  # noqa: BLE001 - PIL raises many types for bad data
                    problems.append(f"{key}: .{image} does not decode ({error})")
    except ShardError as error:
        problems.append(f"(after sample {count}) {error}")
    size = os.path.getsize(url) if os.path.exists(url) else None
    return ShardReport(Shard(url, count, size), labels, problems)


def text_sample_problems(sample: dict, labels: Counter) -> list[str]:
    """What is wrong with a text sample (its text not UTF-8 or empty, its label unreadable); counts its label."""
    problems = []
    try:
        if not sample["txt"].decode("utf-8").strip():
            problems.append("empty text")
    except UnicodeDecodeError:
        problems.append(".txt is not valid UTF-8")
    try:
        labels[sample["cls"].decode("utf-8").strip()] += 1
    except UnicodeDecodeError:
        problems.append(".cls is not valid UTF-8")
    return problems


def build_index(
    inputs: list[str],
    out: str | Path,
    verify_images: bool = True,
    shard_labels: list[Counter] | None = None,
    skipped: list[str] | None = None,
) -> tuple[ShardIndex, list[str]]:
    """Merge part indexes and scan shards into one index at `out`; returns it and the problems found. The labels
    counted in each scanned shard are appended to `shard_labels` when it is given, and a line for each entry of
    a folder or glob left out (a link out of it, a FIFO, a folder named like a shard) to `skipped`."""
    shards: list[Shard] = []
    classes: list[str] | None = None
    labels: Counter = Counter()
    problems: list[str] = []
    shuffled: list[bool] = []  # whether each input says its samples were shuffled before sharding
    for spec in inputs:
        if spec.endswith(".json"):
            part = read_index(spec)
            shards += part.shards
            classes = classes or index_classes(part)
            shuffled.append(shuffled_before_sharding(part))
            continue
        shuffled.append(False)  # shards made elsewhere: training interleaves them
        paths, left_out = local_shards(spec)
        if paths is None:
            paths = [s.url for s in resolve_shards(spec, count=lambda url: 0).shards]
        if skipped is not None:
            skipped += left_out
        if not paths:
            more = f" ({len(left_out)} skipped; the first: {shown(left_out[0])})" if left_out else ""  # a file's name
            raise UserError(f"no shards match {spec}{more}")
        for path in paths:
            report = scan_shard(path, verify_images)
            shards.append(report.shard)
            labels.update(report.labels)
            if shard_labels is not None:
                shard_labels.append(report.labels)
            problems += [f"{path}: {problem}" for problem in report.problems]
    if not shards:
        raise UserError("no shards to index")
    classes = classes or (labels_to_classes(list(labels))[1] if labels else None)
    extra = ({"classes": classes} if classes else {}) | ({SHUFFLED_KEY: True} if all(shuffled) else {})
    index = ShardIndex(shards, Path(out).parent.name, extra)
    write_index(out, shards, name=index.name, extra=index.extra)
    return index, problems


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


def command(inputs: list[str], *, out: str, verify_images: bool = True) -> None:
    """Write a shard index for existing shards, made by any tool, and verify them.

    Args:
        inputs: shard folders, files, globs, brace patterns or part indexes.
        out: the shard index to write (usually DIR/shardindex.json).
        verify_images: check that every image decodes (false: faster).
    """
    shard_labels: list[Counter] = []
    skipped: list[str] = []
    index, problems = build_index(inputs, out, verify_images, shard_labels, skipped)
    classes = f"{len(index_classes(index))} classes" if index_classes(index) else "no labels found"
    print(shown(f"wrote {out}: {len(index.shards)} shards, {index.nsamples} samples, {classes}"))  # class names
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
